//! Envoy's Rate Limit Quota Service (RLQS, `envoy.service.rate_limit_quota.v3`): instead of
//! asking for each request, every data plane decides locally and streams its usage per
//! bucket; the server answers each bucket with an assignment (a token bucket, or a blanket
//! allow or deny) for a while, or tells it to abandon the bucket.
//!
//! - [`proto`]: the stream's messages.
//! - [`fair_shares`]: one limit split among a bucket's clients, max-min fair by demand.
//! - [`Quotas`]: the buckets every stream shares, on the engine's descriptor rules, and
//!   [`QuotaStream`], one stream's reports read against them (the rules of the assignment are
//!   there).
//! - [`QuotaService`] (the `grpc` feature): the gRPC service.
//!
//! Each server owns its clients: several servers behind one address each share a bucket's
//! limit among the clients streaming to them, so with several, the rules' limits are to be
//! divided among the servers (as `local_share` does for counters).

pub mod proto;
mod quotas;
#[cfg(feature = "grpc")]
mod service;
mod share;

pub use quotas::{
    DEFAULT_INTERVAL, MAX_QUOTA_MESSAGE_BYTES, MAX_REORDERED, MIN_TTL, QuotaBounds, QuotaError, QuotaStream,
    Quotas, SHARE_TOLERANCE, TTL_INTERVALS,
};
#[cfg(feature = "grpc")]
pub use service::{Outbound, QuotaService, STREAM_RATE_LIMIT_QUOTAS};
pub use share::fair_shares;
