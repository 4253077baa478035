//! sluice's rate-limit service: one decision engine on descriptor rules (envoy ratelimit's
//! config format, `sluice_descriptors`), asked over Envoy's RLS v3 gRPC API
//! ([`RateLimitService`]) or an HTTP check API ([`CheckApi`]).
//!
//! The engine ([`Engine`]) matches each descriptor of a request to its rule, counts it on a
//! bounded keyed limiter of the rule's algorithm, and answers per descriptor and overall; by
//! default a denied request consumes nothing ([`Counting`]). A reload keeps every counter.
//!
//! Both front ends answer at once and never hold a request for capacity: Envoy (and any
//! caller of the check API) expects its answer now and decides itself what a denial means.
//! Waiting for capacity is the HTTP layer's (`sluice_http`'s `on_excess`), in front of the
//! engine through [`LayerBackend`].

mod api;
mod counters;
mod engine;
mod layer;
pub mod proto;
mod rls;
mod shared;
mod stats;

pub use api::{CheckApi, MAX_BODY_BYTES};
pub use counters::{CounterSettings, ValueQuotaSource, ValueQuotas};
pub use engine::{
    AppliedLimit, BuildError, CheckRequest, Code, Counting, DescriptorRequest, DescriptorStatus, Engine,
    EngineSettings, FieldSet, Reloaded, RequestBounds, RequestError, RuleReport, Verdict,
};
pub use layer::LayerBackend;
pub use rls::{MAX_MESSAGE_BYTES, RateLimitService, SHOULD_RATE_LIMIT};
pub use shared::RedisCounters;
pub use stats::{FrontEnd, LATENCY_BUCKETS, LatencySnapshot, RuleCounts, TOP_KEYS};
