//! The fixed window counter, in one atomic word.

use crate::sync::atomic::{AtomicU64, Ordering};

use super::word::{self, Step};
use super::{Algorithm, RETIRED, SCALED_LIMIT};
use crate::{Decision, Quota, QuotaError};

/// A fixed window counter: time is cut into windows of the quota's fill time (capacity ÷
/// rate, so `100/s` gives windows of 1 s admitting 100), starting at the limiter's epoch;
/// each window admits up to `capacity`.
///
/// A quota change keeps the units counted in the current window (capped at the new capacity)
/// and puts them in the window of the new length that holds the change, on the same grid:
/// windows of every length start at multiples of their length from the epoch.
///
/// The word holds a running total `window × capacity + used`, so moving to a new window and
/// counting in it is one compare-and-swap, and a denial writes nothing. At a window boundary
/// up to twice the capacity may pass in a short time: that is the algorithm, not a bug (the
/// sliding algorithms exist for it).
///
/// # Example
/// ```
/// use sluice::{FixedWindow, ManualClock, Quota, RateLimiter};
/// let clock = ManualClock::new(0);
/// let limiter = RateLimiter::with_clock(FixedWindow, "3/s".parse::<Quota>()?, clock.clone())?;
/// assert!(limiter.check_n(3)?.is_allowed());
/// let denied = limiter.check();
/// assert_eq!(denied.retry_after_nanos(), 1_000_000_000); // the next window
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FixedWindow;

/// Constants of a fixed window limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowParams {
    pub(crate) limit: u64,
    pub(crate) window: u64,
}

impl WindowParams {
    pub(crate) fn new(quota: &Quota) -> Self {
        Self {
            limit: quota.capacity(),
            window: quota.fill_time_nanos(),
        }
    }

    /// The end of the window holding `now`, as a distance from `now`.
    pub(crate) fn until_window_end(&self, now: u64) -> u64 {
        self.window - now % self.window
    }
}

/// The running total of a fixed window limit.
#[derive(Debug, Default)]
pub struct FixedWindowState(AtomicU64);

impl Algorithm for FixedWindow {
    type Params = WindowParams;
    type State = FixedWindowState;
    type Snapshot = u64;

    fn name(&self) -> &'static str {
        "fixed_window"
    }

    fn params(&self, quota: &Quota) -> Result<WindowParams, QuotaError> {
        let params = WindowParams::new(quota);
        let how = || {
            format!(
                "its windows are {} ns long and admit {} each: give a smaller burst or a longer period",
                params.window, params.limit
            )
        };
        super::long_enough(quota, self.horizon(&params), how)?;
        Ok(params)
    }

    fn horizon(&self, params: &WindowParams) -> u64 {
        // Keeps window × limit below 2^61.
        (SCALED_LIMIT / params.limit.max(1)).saturating_mul(params.window)
    }

    fn new_state(&self, _: &WindowParams) -> FixedWindowState {
        FixedWindowState::default()
    }

    #[inline]
    fn check(
        &self,
        params: &WindowParams,
        state: &FixedWindowState,
        now: u64,
        cost: u64,
    ) -> Option<Decision> {
        let base = now / params.window * params.limit;
        let until_end = params.until_window_end(now);
        // Written out rather than through `word::update`: a closure answering a `Decision`
        // through `Step` made a denied check twice as slow (`benches/direct.rs`).
        let mut total = state.0.load(Ordering::Acquire);
        loop {
            if total == RETIRED {
                return None;
            }
            // A check whose clock reading is older than the window another thread has moved
            // the state into sees more than a window's worth: it is denied, as full (without
            // the cap its remaining count would wrap).
            let used = total.saturating_sub(base).min(params.limit);
            let reset = if used == 0 { 0 } else { until_end };
            if used + cost > params.limit {
                return Some(Decision::denied(
                    params.limit,
                    params.limit - used,
                    reset,
                    until_end,
                ));
            }
            if cost == 0 {
                return Some(Decision::allowed(params.limit, params.limit - used, reset));
            }
            match state.0.compare_exchange_weak(
                total,
                base + used + cost,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(Decision::allowed(
                        params.limit,
                        params.limit - used - cost,
                        until_end,
                    ));
                }
                Err(current) => total = current,
            }
        }
    }

    fn retire(&self, state: &FixedWindowState) -> u64 {
        word::retire(&state.0)
    }

    fn carry_over(
        &self,
        old: &WindowParams,
        total: u64,
        new: &WindowParams,
        now: u64,
    ) -> (u64, FixedWindowState) {
        // The units of the old window holding `now`, as a check counts them (a state already
        // in a later window reads as full); saturating, as `now` may lie past the horizon
        // after a clock jump.
        let used = total
            .saturating_sub((now / old.window).saturating_mul(old.limit))
            .min(old.limit)
            .min(new.limit);
        // They go into the new length's window holding `now`, on the grid from the epoch. The
        // epoch stays where it is while the running total fits, so every window length keeps
        // the same origin (as Unix time does for the Redis script, across any number of
        // changes). At the horizon (an epoch move; the keyed store caps `now` there) it moves
        // by whole windows.
        if now < self.horizon(new) {
            let base = now / new.window * new.limit;
            (0, FixedWindowState(AtomicU64::new(base + used)))
        } else {
            (now - now % new.window, FixedWindowState(AtomicU64::new(used)))
        }
    }

    fn refund(&self, params: &WindowParams, state: &FixedWindowState, taken_at: u64, cost: u64) -> bool {
        let base = taken_at / params.window * params.limit;
        word::update(&state.0, |total| {
            // Only while the state is still in the window of the take does it count. A later
            // window that has admitted anything holds more than `base + limit`.
            if total <= base || total > base + params.limit {
                return Step::Answer(());
            }
            Step::Write(total - cost.min(total - base), ())
        })
        .is_some()
    }

    fn is_idle(&self, params: &WindowParams, state: &FixedWindowState, now: u64) -> bool {
        let total = state.0.load(Ordering::Acquire);
        total != RETIRED && total <= now / params.window * params.limit
    }
}
