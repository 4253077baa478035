//! The rate-limiting algorithms, one module each, behind one trait.
//!
//! An [`Algorithm`] is the pure part of a limit: given its parameters (compiled from a
//! [`Quota`]), its state, the time and a cost, it decides. Owning the state, reading the clock
//! and changing quotas is the job of a limiter such as [`crate::RateLimiter`]; the keyed store
//! holds one state per key over the same trait.
//!
//! Time given to an algorithm is relative to an *epoch* chosen by the limiter (its creation
//! time at first), so the scaled integer arithmetic stays small. Each algorithm says how far
//! from the epoch it can count ([`Algorithm::horizon`]); before that the limiter moves the
//! epoch with [`Algorithm::retire`] and [`Algorithm::carry_over`], which is also how a quota
//! changes on a live limiter.
//!
//! Costs given to [`Algorithm::check`] are at most the quota's capacity (the limiter rejects
//! larger ones); a cost of 0 peeks without consuming.

use std::fmt::Debug;

use crate::{Charge, Decision, Quota, QuotaError};

mod fixed_window;
mod gcra;
mod kind;
mod leaky_bucket;
mod sliding_counter;
mod sliding_log;
mod token_bucket;
mod unmetered;
mod word;

pub use fixed_window::FixedWindow;
pub use kind::{AlgorithmKind, AlgorithmVisitor, UnknownAlgorithm};
pub use leaky_bucket::LeakyBucket;
pub use sliding_counter::SlidingWindowCounter;
pub use sliding_log::SlidingWindowLog;
pub use token_bucket::TokenBucket;
pub use unmetered::Unmetered;

/// A rate-limiting algorithm: how a state answers a check.
///
/// # Example
/// ```
/// use sluice::{Algorithm, FixedWindow, Quota};
/// let algo = FixedWindow;
/// let params = algo.params(&"2/s".parse::<Quota>()?)?;
/// let state = algo.new_state(&params);
/// assert!(algo.check(&params, &state, 0, 2).unwrap().is_allowed());
/// assert!(!algo.check(&params, &state, 1, 1).unwrap().is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Algorithm: Send + Sync + 'static {
    /// Constants derived from a quota once, so checks do no setup work.
    type Params: Send + Sync + Debug + Clone;
    /// The mutable state of one limit, shared by all threads that check it.
    type State: Send + Sync;
    /// The state's value taken out of a retired state, to build its successor.
    type Snapshot: Send;

    /// A short name: `token_bucket`, `fixed_window`...
    fn name(&self) -> &'static str;

    /// Compiles a quota; fails if this algorithm cannot hold it exactly.
    fn params(&self, quota: &Quota) -> Result<Self::Params, QuotaError>;

    /// How many nanoseconds past the epoch this state can count; a limiter must move the epoch
    /// (retire and carry over) before giving a later time.
    fn horizon(&self, params: &Self::Params) -> u64;

    /// A state with nothing consumed.
    fn new_state(&self, params: &Self::Params) -> Self::State;

    /// Decides a check of `cost` (at most the capacity) at `now` ns past the epoch, consuming
    /// it if allowed. `None` means the state was retired: reload the limit and try again.
    fn check(&self, params: &Self::Params, state: &Self::State, now: u64, cost: u64) -> Option<Decision>;

    /// Consumes `cost` at `now` ns past the epoch whatever is left, down to the quota's floor
    /// ([`Quota::max_debt`] units below empty): a cost known only after the fact. Any cost is
    /// taken, a larger one than the capacity too, up to the floor. `None` means the state was
    /// retired: reload the limit and try again.
    ///
    /// Checks then see the consumption as their own: denied until refill (or, for the window
    /// algorithms, the windows going by) has brought the limit back above the cost.
    ///
    /// # Example
    /// ```
    /// use sluice::{Algorithm, FixedWindow, Quota};
    /// let algo = FixedWindow;
    /// let params = algo.params(&"10/s".parse::<Quota>()?)?;
    /// let state = algo.new_state(&params);
    /// let charge = algo.charge(&params, &state, 0, 25).unwrap();
    /// assert_eq!((charge.charged(), charge.debt()), (20, 10)); // the floor: 10 below empty
    /// // The debt takes the next window's 10: admitted again in the window after.
    /// assert_eq!(algo.check(&params, &state, 0, 1).unwrap().retry_after_nanos(), 2_000_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn charge(&self, params: &Self::Params, state: &Self::State, now: u64, cost: u64) -> Option<Charge>;

    /// Marks the state retired (later checks on it return `None`) and takes its value. An
    /// algorithm without state ([`Unmetered`]) has nothing to mark; the limiters do not count
    /// on the mark to stop using a replaced limit.
    fn retire(&self, state: &Self::State) -> Self::Snapshot;

    /// Builds the state that succeeds a retired one at `now` (relative to the old epoch), under
    /// `new` parameters. Returns how far the epoch moves (at most `now`) and the state.
    ///
    /// The rule, for every algorithm: what was consumed and still counts at `now` stays
    /// consumed, capped at the new capacity, and then recovers at the new rate. In detail (the
    /// Redis scripts of `sluice-redis` carry a state over by the same rule, so both decide alike):
    ///
    /// - GCRA (token bucket, leaky bucket): at the same rate (same reduced `c/p`), the scaled
    ///   time ahead is carried exactly, capped at the new burst (plus the maximum delay for a
    ///   shaper). At another rate, the consumption counts in whole units rounded up,
    ///   `ceil(ahead / p_old)`, capped at the new capacity (a shaper: at burst plus maximum
    ///   delay, in scaled time), times `p_new`. Whole units re-express exactly both here (time
    ///   in ns) and on Redis (time in µs); a partly consumed unit stays consumed.
    /// - Fixed window: the units counted in the old length's window holding `now` (none if it
    ///   ended), capped at the new limit, count in the new length's window holding `now`.
    ///   Windows of every length start at multiples of their length from the epoch, which a
    ///   change does not move (only an epoch move at the horizon does, by whole windows).
    /// - Sliding window counter: the same window length and limit change nothing. Otherwise the
    ///   weighted estimate at `now` (as a check computes it), capped at the new limit, becomes
    ///   the count of the new length's window holding `now` (on the grid from the epoch, as for
    ///   the fixed window), the previous window's count 0.
    /// - Sliding window log: units that left the window under the shorter of the two lengths
    ///   are gone; over the new limit, the oldest units are forgotten first.
    ///
    /// Debt (consumption below empty, from [`Algorithm::charge`]) is carried whole when the
    /// rate and capacity stay (an epoch move; a change of the debt floor alone bounds later
    /// charges, not what is owed), and forgiven by a change of either (the consumption is
    /// capped at the new capacity, as above).
    ///
    /// An epoch move calls this with the same parameters: it must carry the state exactly.
    fn carry_over(
        &self,
        old: &Self::Params,
        snapshot: Self::Snapshot,
        new: &Self::Params,
        now: u64,
    ) -> (u64, Self::State);

    /// Gives back `cost` units admitted by a check at `taken_at` (ns past the epoch, as given to
    /// that check), as if that check had never consumed them, at whatever time the refund
    /// comes. Returns `false` if the state was retired (nothing is given back; the caller may
    /// keep the consumption, which only ever under-admits).
    ///
    /// Exact under concurrency: refunding what a check took leaves the state as it would be had
    /// the check taken nothing, whatever other checks did in between. Consumption that no
    /// longer counts (an expired window) is not given back, since it no longer matters.
    ///
    /// # Example
    /// ```
    /// use sluice::{Algorithm, Quota, SlidingWindowLog};
    /// let algo = SlidingWindowLog;
    /// let params = algo.params(&"2/s".parse::<Quota>()?)?;
    /// let state = algo.new_state(&params);
    /// assert!(algo.check(&params, &state, 5, 2).unwrap().is_allowed());
    /// assert!(algo.refund(&params, &state, 5, 2));
    /// assert_eq!(algo.check(&params, &state, 6, 0).unwrap().remaining(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn refund(&self, params: &Self::Params, state: &Self::State, taken_at: u64, cost: u64) -> bool;

    /// Whether the state carries no information at `now`: forgetting it and starting afresh
    /// would decide every later check the same way (a full bucket, an expired window).
    fn is_idle(&self, params: &Self::Params, state: &Self::State, now: u64) -> bool;
}

/// The shortest span past its epoch a state must be able to count: 2^40 ns, about 18
/// minutes. A limiter moves the epoch before the span runs out, and each move installs a new
/// limit (freed only once no check reads it, `limiter/reclaim.rs`): a quota whose span were a
/// few nanoseconds would install one at nearly every check. Quotas that cannot be counted this
/// long are refused when compiled.
pub(crate) const MIN_HORIZON: u64 = 1 << 40;

/// `Ok` if `horizon` is at least [`MIN_HORIZON`]; else the error, with `how()` saying which
/// part of `quota` to change.
pub(crate) fn long_enough(quota: &Quota, horizon: u64, how: impl Fn() -> String) -> Result<(), QuotaError> {
    if horizon >= MIN_HORIZON {
        return Ok(());
    }
    Err(QuotaError::Overflow(format!(
        "{quota} can be counted only {horizon} ns past its time base, and at least 2^40 ns \
         (about 18 minutes) is needed so that a limiter does not move its time base (and keep \
         one more state) every few checks; {}",
        how()
    )))
}

/// Marks a retired single-word state. Live states stay below 2^62, so this never collides.
pub(crate) const RETIRED: u64 = u64::MAX;

/// The cap for any scaled value the single-word algorithms store: live values stay below
/// twice this, far from [`RETIRED`].
pub(crate) const SCALED_LIMIT: u64 = 1 << 61;

/// Retires `state` and builds its successor under `new` at `since` ns past the old epoch: a
/// quota change and an epoch move alike, for every limiter. Returns how far the epoch moves
/// and the new state; checks still on the retired state fail and retry on the successor.
pub(crate) fn succeed<A: Algorithm>(
    algorithm: &A,
    old: &A::Params,
    state: &A::State,
    new: &A::Params,
    since: u64,
) -> (u64, A::State) {
    let snapshot = algorithm.retire(state);
    algorithm.carry_over(old, snapshot, new, since)
}
