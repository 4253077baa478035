//! The token bucket, as GCRA in one atomic word.

use super::Algorithm;
use super::gcra::{self, GcraParams, GcraState};
use crate::{Charge, Decision, Quota, QuotaError};

/// A token bucket: holds up to `capacity` tokens, refilled continuously at the quota's rate;
/// a check of cost n takes n tokens or nothing.
///
/// Implemented as the generic cell rate algorithm: one `AtomicU64`, one compare-and-swap per
/// admitted check, nothing written on a denial. Exact for every rate: time is counted in
/// units of `1/c` ns (see [`Quota::reduced_rate`]).
///
/// # Example
/// ```
/// use sluice::{ManualClock, Quota, RateLimiter, TokenBucket};
/// let clock = ManualClock::new(0);
/// let limiter = RateLimiter::with_clock(TokenBucket, "1.1/s burst 1".parse::<Quota>()?, clock.clone())?;
/// assert!(limiter.check().is_allowed());
/// let denied = limiter.check();
/// assert_eq!(denied.retry_after_nanos(), 909_090_910); // 1/1.1 s, rounded up to a whole ns
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenBucket;

impl Algorithm for TokenBucket {
    type Params = GcraParams;
    type State = GcraState;
    type Snapshot = u64;

    fn name(&self) -> &'static str {
        "token_bucket"
    }

    fn params(&self, quota: &Quota) -> Result<GcraParams, QuotaError> {
        GcraParams::new(quota, 0)
    }

    fn horizon(&self, params: &GcraParams) -> u64 {
        params.horizon()
    }

    fn new_state(&self, _: &GcraParams) -> GcraState {
        GcraState::default()
    }

    #[inline]
    fn check(&self, params: &GcraParams, state: &GcraState, now: u64, cost: u64) -> Option<Decision> {
        gcra::check(params, state, now, cost)
    }

    fn charge(&self, params: &GcraParams, state: &GcraState, now: u64, cost: u64) -> Option<Charge> {
        gcra::charge(params, state, now, cost)
    }

    fn retire(&self, state: &GcraState) -> u64 {
        gcra::retire(state)
    }

    fn carry_over(&self, old: &GcraParams, snapshot: u64, new: &GcraParams, now: u64) -> (u64, GcraState) {
        gcra::carry_over(old, snapshot, new, now)
    }

    fn refund(&self, params: &GcraParams, state: &GcraState, taken_at: u64, cost: u64) -> bool {
        gcra::refund(params, state, taken_at, cost)
    }

    fn is_idle(&self, params: &GcraParams, state: &GcraState, now: u64) -> bool {
        gcra::is_idle(params, state, now)
    }
}
