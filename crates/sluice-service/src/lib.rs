//! sluice's rate-limit service: one decision engine on descriptor rules (envoy ratelimit's
//! config format, `sluice_descriptors`), asked over Envoy's RLS v3 gRPC API
//! ([`RateLimitService`]) or an HTTP check API ([`CheckApi`]).
//!
//! The engine ([`Engine`]) matches each descriptor of a request to its rule, counts it on a
//! bounded keyed limiter of the rule's algorithm, and answers per descriptor and overall; by
//! default a denied request consumes nothing ([`Counting`]). A reload keeps every counter.
//!
//! The gRPC server ([`RateLimitService`]) is the `grpc` feature, on by default; without it
//! the crate builds without tonic and still answers RLS messages given as bytes.
//!
//! Both front ends answer at once and never hold a request for capacity: Envoy (and any
//! caller of the check API) expects its answer now and decides itself what a denial means.
//! Waiting for capacity is the HTTP layer's (`sluice_http`'s `on_excess`), in front of the
//! engine through [`LayerBackend`].

#![forbid(unsafe_code)]

mod answer;
mod api;
mod counters;
mod decide;
mod engine;
mod generation;
mod layer;
pub mod proto;
mod report;
mod request;
pub mod rlqs;
#[cfg(feature = "grpc")]
mod rls;
mod rls_message;
mod settings;
mod stats;
mod store;

pub use answer::{AppliedLimit, Code, DescriptorStatus, Verdict};
pub use api::{CheckApi, MAX_BODY_BYTES};
pub use counters::{CounterSettings, ValueQuotaSource, ValueQuotas};
pub use engine::{Engine, EngineError, Reloaded, RuleReport, TopKey};
pub use layer::LayerBackend;
pub use report::{Report, Reported};
pub use request::{CheckRequest, DescriptorRequest, RequestBounds, RequestError};
#[cfg(feature = "grpc")]
pub use rls::{RateLimitService, RequestSpan, SHOULD_RATE_LIMIT};
#[doc(hidden)]
pub use rls_message::answer_rls_message;
pub use rls_message::{MAX_MESSAGE_BYTES, RlsMessageError};
pub use settings::{Counting, EngineSettings, FieldSet};
pub use stats::{FrontEnd, LATENCY_BUCKETS, LatencySnapshot, MAX_LABELS, RuleCounts, TOP_KEYS};
pub use store::RedisCounters;
