//! The failsafe pool: one token bucket shared by every admission of a key that has no quota of
//! its own yet (still being fetched, or its fetch failed) and of every key the store cannot
//! hold, so that a flood of new keys costs at most the pool, however many keys it brings.

use crate::{CheckError, Clock, Decision, Quota, QuotaError, RateLimiter, TokenBucket};

/// A clock that reads one value: the pool is built at its owner's time, and then told the
/// time at each take, read from its owner's clock.
struct At(u64);

impl Clock for At {
    fn now(&self) -> u64 {
        self.0
    }
}

/// The pool: a direct token bucket (lock-free; its epoch moves as the direct limiter's do).
pub(crate) struct Pool {
    limit: RateLimiter<TokenBucket, At>,
}

impl Pool {
    /// A full pool of `quota` at clock reading `now`.
    pub(crate) fn new(quota: Quota, now: u64) -> Result<Self, QuotaError> {
        Ok(Self {
            limit: RateLimiter::with_clock(TokenBucket, quota, At(now))?,
        })
    }

    /// Takes `cost` at clock reading `now`, if the pool has it.
    pub(crate) fn take(&self, now: u64, cost: u64) -> Result<Decision, CheckError> {
        self.limit.take_n_with(|| now, cost).map(|(decision, _)| decision)
    }

    /// Gives back `cost` taken at clock reading `at` (a chain that was denied further on).
    pub(crate) fn give_back(&self, at: u64, cost: u64) {
        self.limit.refund_at(at, cost);
    }

    /// The pool's quota.
    pub(crate) fn quota(&self) -> Quota {
        self.limit.quota()
    }
}
