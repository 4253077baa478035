//! The leaky bucket, as a meter or as a shaper.

use std::time::Duration;

use super::Algorithm;
use super::gcra::{self, GcraParams, GcraState};
use crate::{Charge, Decision, Quota, QuotaError};

/// A leaky bucket: a bucket of `capacity` that drains at the quota's rate; each request pours
/// in its cost.
///
/// - As a **meter** ([`LeakyBucket::meter`]) a request that would overflow is denied. This is
///   the token bucket seen from the other side (level = capacity − tokens), so its decisions
///   equal [`crate::TokenBucket`]'s.
/// - As a **shaper** ([`LeakyBucket::shaper`]) requests beyond the burst are queued: admitted
///   with a [`Decision::delay`] after which they may proceed, so they leave at the quota's
///   rate. A request whose delay would exceed the maximum is denied and queues nothing.
///
/// Both keep their state in one atomic word (the GCRA of [`crate::TokenBucket`]).
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::{LeakyBucket, ManualClock, Quota, RateLimiter};
/// let shaper = LeakyBucket::shaper(Duration::from_secs(1));
/// let limiter = RateLimiter::with_clock(shaper, "10/s burst 1".parse::<Quota>()?, ManualClock::new(0))?;
/// let delays: Vec<_> = (0..3).map(|_| limiter.check().delay()).collect();
/// assert_eq!(delays, [Duration::ZERO, Duration::from_millis(100), Duration::from_millis(200)]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct LeakyBucket {
    max_delay_ns: u64,
}

impl LeakyBucket {
    /// Admit or deny, never delay.
    pub const fn meter() -> Self {
        Self { max_delay_ns: 0 }
    }

    /// Queue requests beyond the burst for at most `max_delay`.
    pub fn shaper(max_delay: Duration) -> Self {
        Self {
            max_delay_ns: crate::saturating_nanos(max_delay),
        }
    }

    /// The longest delay a request may be given (zero for a meter).
    pub const fn max_delay(&self) -> Duration {
        Duration::from_nanos(self.max_delay_ns)
    }
}

impl Algorithm for LeakyBucket {
    type Params = GcraParams;
    type State = GcraState;
    type Snapshot = u64;

    fn name(&self) -> &'static str {
        if self.max_delay_ns == 0 {
            "leaky_bucket"
        } else {
            "leaky_bucket_shaper"
        }
    }

    fn params(&self, quota: &Quota) -> Result<GcraParams, QuotaError> {
        GcraParams::new(quota, self.max_delay_ns)
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
