//! What a Redis limiter counts about itself.

use std::sync::atomic::AtomicU64;

use crate::StoreMetrics;

/// Counters of one limiter (plus its store's), readable at any time.
///
/// # Example
/// ```
/// let m = sluice_redis::RedisMetrics::default();
/// assert_eq!(m.answered_by_policy(), 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisMetrics {
    /// The connection's counters and degraded flag.
    pub store: StoreMetrics,
    /// Checks decided by Redis.
    pub redis_checks: u64,
    /// Checks admitted by [`crate::FailurePolicy::FailOpen`].
    pub failed_open: u64,
    /// Checks denied by [`crate::FailurePolicy::FailClosed`].
    pub failed_closed: u64,
    /// Checks decided by the local share ([`crate::FailurePolicy::LocalShare`]).
    pub local_share: u64,
}

impl RedisMetrics {
    /// Checks answered by the failure policy instead of Redis.
    pub const fn answered_by_policy(&self) -> u64 {
        self.failed_open + self.failed_closed + self.local_share
    }
}

/// A limiter's own counters.
#[derive(Default)]
pub(crate) struct LimiterCounts {
    pub(crate) redis_checks: AtomicU64,
    pub(crate) failed_open: AtomicU64,
    pub(crate) failed_closed: AtomicU64,
    pub(crate) local_share: AtomicU64,
}
