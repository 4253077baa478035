//! # sluice-redis: sluice's limits, shared through Redis
//!
//! The same [`sluice::Decision`] for the same quotas as the core algorithms, with the state in
//! Redis (or Redis Cluster) so that every process using the same Redis shares each limit.
//!
//! - [`RedisLimiter`]: strict mode. Each check is one atomic Lua script (EVALSHA, reloaded on
//!   NOSCRIPT) on Redis' own clock, so hosts with skewed clocks agree. Token bucket (GCRA),
//!   fixed window, sliding window counter and sliding window log; cost and peek as in the
//!   core; every key expires when idle; the keys of one limit share a hash tag.
//! - [`HybridLimiter`]: admits locally and syncs consumed counts every interval: local speed
//!   for a bounded over-admission (about rate × interval × hosts).
//! - [`RedisConcurrencyLimiter`]: permits held across processes, as leases that expire if
//!   their holder dies.
//! - [`FailurePolicy`]: fail open, fail closed, or each host's share of the limit in memory
//!   while Redis does not answer within the timeout; Redis is probed with backoff and used
//!   again as soon as it answers.
//!
//! ```no_run
//! use sluice::TokenBucket;
//! use sluice_redis::{FailurePolicy, RedisLimiter, RedisOptions};
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = RedisLimiter::builder(TokenBucket, "100/s".parse()?)
//!     .unknown_key_quota("100/s".parse()?)
//!     .policy(FailurePolicy::LocalShare)
//!     .hosts(3)
//!     .connect("redis://127.0.0.1:6379", RedisOptions::default())
//!     .await?;
//! let decision = limiter.check_n("client-42", 1).await?;
//! println!("allowed: {}, remaining: {}", decision.is_allowed(), decision.remaining());
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algorithm;
mod concurrency;
mod error;
mod health;
mod hybrid;
mod limiter;
mod metrics;
mod policy;
mod script;
mod source;
mod store;
mod sync;

pub use algorithm::{
    RedisAlgorithm, RedisAlgorithmVisitor, UnsupportedAlgorithm, check_quota, visit_scripted,
};
pub use concurrency::{RedisConcurrencyLimiter, RedisPermit};
pub use error::{Error, QuotaTooLarge, SetupError};
pub use hybrid::{HybridLimiter, HybridMetrics};
pub use limiter::{HashTag, RedisLimit, RedisLimiter, RedisLimiterBuilder};
pub use metrics::RedisMetrics;
pub use policy::{FailurePolicy, UnknownPolicy};
pub use store::{DEFAULT_DEGRADE_AFTER, DEFAULT_TIMEOUT, RedisOptions, RedisStore, RedisTls, StoreMetrics};
