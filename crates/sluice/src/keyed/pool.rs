//! The failsafe pool: one token bucket shared by every admission of a key that has no quota of
//! its own yet (still being fetched, or its fetch failed) and of every key the store cannot
//! hold, so that a flood of new keys costs at most the pool, however many keys it brings.

use crate::{Charge, CheckError, Clock, Decision, Quota, QuotaError, RateLimiter, TokenBucket};

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

    /// Takes `cost` at clock reading `now` whatever is left, down to the pool's floor (a key on
    /// the failsafe quota charged after the fact).
    pub(crate) fn charge(&self, now: u64, cost: u64) -> Charge {
        self.limit.charge_n_with(|| now, cost)
    }

    /// Gives back `cost` taken at clock reading `at` (a chain that was denied further on).
    pub(crate) fn give_back(&self, at: u64, cost: u64) {
        self.limit.refund_at(at, cost);
    }

    /// Whole units of the pool in use at clock reading `now` (a unit partly refilled counts
    /// as in use).
    pub(crate) fn used(&self, now: u64) -> u64 {
        self.take(now, 0)
            .map_or(0, |peek| peek.limit().saturating_sub(peek.remaining()))
    }

    /// Takes `used` units (at most the pool's capacity) at clock reading `now`, whatever is
    /// left: what another pool had in use when this one took its place.
    pub(crate) fn carry(&self, now: u64, used: u64) {
        let cost = used.min(self.quota().capacity());
        // A peek at 0 or a cost within capacity: neither errs.
        let _ = self.take(now, cost);
    }

    /// The pool's quota.
    pub(crate) fn quota(&self) -> Quota {
        self.limit.quota()
    }
}
