//! The fixed window counter, in one atomic word.

use crate::sync::atomic::{AtomicU64, Ordering};

use super::word::{self, Step};
use super::{Algorithm, RETIRED, SCALED_LIMIT};
use crate::{Charge, Decision, Quota, QuotaError};

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
    /// Units a charge may count past the limit.
    pub(crate) debt: u64,
}

impl WindowParams {
    pub(crate) fn new(quota: &Quota) -> Self {
        Self {
            limit: quota.capacity(),
            window: quota.fill_time_nanos(),
            debt: quota.max_debt(),
        }
    }

    /// The most units a state may count: the limit, and the debt past it (at most 2^60 each).
    pub(crate) fn most_used(&self) -> u64 {
        self.limit + self.debt
    }

    /// Whether `other` has the same windows: the same length and limit (the debt may differ).
    pub(crate) fn same_windows(&self, other: &Self) -> bool {
        (self.window, self.limit) == (other.window, other.limit)
    }

    /// What a state counting `used` units may carry into a successor under `new`: with the
    /// same windows (an epoch move, or a new debt floor, which bounds later charges),
    /// everything; else at most the smaller limit (debt is forgiven).
    pub(crate) fn carried(&self, used: u64, new: &Self) -> u64 {
        if self.same_windows(new) {
            used.min(self.most_used().max(new.most_used()))
        } else {
            used.min(self.limit).min(new.limit)
        }
    }

    /// Time from `now` until a window count of `used` (past the limit: in debt, repaid a
    /// limit per window) leaves room for `cost`, and until it is empty: `(retry, reset)`.
    #[cold]
    #[inline(never)]
    pub(crate) fn until_repaid(&self, used: u64, cost: u64, now: u64) -> (u64, u64) {
        let until_end = self.until_window_end(now);
        let after = |units: u64| {
            // Windows of `limit` each, the first ending at `until_end`.
            let windows = units.div_ceil(self.limit.max(1)).max(1) - 1;
            until_end.saturating_add(windows.saturating_mul(self.window))
        };
        (after((used + cost).saturating_sub(self.limit)), after(used))
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
            let used = total.saturating_sub(base);
            let reset = if used == 0 { 0 } else { until_end };
            if used + cost > params.limit {
                if used > params.limit {
                    // In debt (or a reading from before another thread's window): the debt
                    // takes the limit of each window to come until it is repaid.
                    let (retry, reset) = params.until_repaid(used, cost, now);
                    return Some(Decision::denied(params.limit, 0, reset, retry));
                }
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

    fn charge(&self, params: &WindowParams, state: &FixedWindowState, now: u64, cost: u64) -> Option<Charge> {
        let base = now / params.window * params.limit;
        let (charged, used) = word::update(&state.0, |total| {
            let used = total.saturating_sub(base);
            let charged = cost.min(params.most_used().saturating_sub(used));
            if charged == 0 {
                Step::Answer((0, used))
            } else {
                Step::Write(base + used + charged, (charged, used + charged))
            }
        })?;
        let decision = self.check(params, state, now, 0)?;
        Some(Charge::new(charged, used.saturating_sub(params.limit), decision))
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
        let used = old.carried(
            total.saturating_sub((now / old.window).saturating_mul(old.limit)),
            new,
        );
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
