//! The algorithm that counts nothing: for stores that only hold quotas.

use super::Algorithm;
use crate::{Charge, Decision, Quota, QuotaError};

/// Admits every cost the quota's capacity allows and keeps no state.
///
/// For a [`crate::KeyedLimiter`] used only to hold per-key quotas (fetched from a source,
/// refreshed, bounded in memory, with the failsafe and unknown-key rules) while the counting
/// happens elsewhere, as in a distributed limiter: read them with
/// [`crate::KeyedLimiter::resolve_quota`]. Its entries carry no state.
///
/// # Example
/// ```
/// use sluice::{Quota, RateLimiter, Unmetered};
/// let limiter = RateLimiter::new(Unmetered, "2/s".parse::<Quota>()?)?;
/// for _ in 0..10 {
///     assert_eq!(limiter.check().remaining(), 2);
/// }
/// assert!(limiter.check_n(3).is_err()); // beyond the capacity, as for every algorithm
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Unmetered;

impl Algorithm for Unmetered {
    type Params = u64;
    type State = ();
    type Snapshot = ();

    fn name(&self) -> &'static str {
        "unmetered"
    }

    fn params(&self, quota: &Quota) -> Result<u64, QuotaError> {
        Ok(quota.capacity())
    }

    fn horizon(&self, _capacity: &u64) -> u64 {
        u64::MAX
    }

    fn new_state(&self, _capacity: &u64) {}

    fn check(&self, capacity: &u64, _state: &(), _now: u64, _cost: u64) -> Option<Decision> {
        Some(Decision::allowed(*capacity, *capacity, 0))
    }

    fn charge(&self, capacity: &u64, _state: &(), _now: u64, cost: u64) -> Option<Charge> {
        Some(Charge::new(cost, 0, Decision::allowed(*capacity, *capacity, 0)))
    }

    fn retire(&self, _state: &()) {}

    fn carry_over(&self, _old: &u64, _snapshot: (), _new: &u64, _now: u64) -> (u64, ()) {
        (0, ())
    }

    fn refund(&self, _capacity: &u64, _state: &(), _taken_at: u64, _cost: u64) -> bool {
        true
    }

    fn is_idle(&self, _capacity: &u64, _state: &(), _now: u64) -> bool {
        true
    }
}
