//! The sliding window counter.

use std::sync::{Mutex, MutexGuard};

use super::Algorithm;
use super::fixed_window::WindowParams;
use crate::{Charge, Decision, Quota, QuotaError};

/// A sliding window counter: counts per fixed window (the quota's fill time), and estimates
/// the last window's worth as the current count plus the previous window's count weighted by
/// the part of it still inside the sliding window. A cost is admitted if
/// `previous × (window − elapsed) / window + current + cost ≤ capacity`, compared exactly in
/// integers.
///
/// A quota change (another window length or limit) turns the estimate at the change, capped at
/// the new capacity, into the count of the new length's window that holds the change (windows
/// of every length start at multiples of it from the epoch), with nothing before it.
///
/// Two counters and a window index do not fit one atomic word, so each limit has a mutex of
/// its own.
///
/// # Example
/// ```
/// use sluice::{ManualClock, Quota, RateLimiter, SlidingWindowCounter};
/// let clock = ManualClock::new(0);
/// let limiter = RateLimiter::with_clock(SlidingWindowCounter, "10/s".parse::<Quota>()?, clock.clone())?;
/// assert!(limiter.check_n(10)?.is_allowed());
/// clock.set(1_500_000_000); // half of the previous window still weighs: 5 remain
/// assert_eq!(limiter.check_n(0)?.remaining(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SlidingWindowCounter;

/// The two counters of a sliding window counter.
#[derive(Debug, Default)]
pub struct CounterState(Mutex<WindowCounts>);

#[derive(Debug, Default, Clone, Copy)]
pub struct WindowCounts {
    retired: bool,
    window: u64,
    previous: u64,
    current: u64,
}

impl WindowCounts {
    /// Counts `cost` taken at `now`. A reading from just before the current window (another
    /// thread rolled the window between this one's clock read and its turn at the lock)
    /// counts in the window it was taken in, now the previous one: where its weight belongs,
    /// and where `refund`, which goes by the time of the take, will look for it.
    fn add(&mut self, now: u64, window_len: u64, cost: u64) {
        if (now / window_len).checked_add(1) == Some(self.window) {
            self.previous += cost;
        } else {
            self.current += cost;
        }
    }

    /// The estimate of the last window's worth at `now` (rolled to its window first).
    fn used(&self, now: u64, window_len: u64) -> u64 {
        let elapsed = now.saturating_sub(self.window * window_len).min(window_len);
        weighted(self.previous, window_len - elapsed, window_len) + self.current
    }

    /// Moves to the window holding `now` (a time before the current window leaves it as is).
    fn roll(&mut self, now: u64, window_len: u64) {
        let window = now / window_len;
        if window == self.window + 1 {
            self.previous = self.current;
            self.current = 0;
        } else if window > self.window + 1 {
            self.previous = 0;
            self.current = 0;
        }
        self.window = self.window.max(window);
    }
}

fn lock(state: &CounterState) -> MutexGuard<'_, WindowCounts> {
    crate::sync::lock(&state.0)
}

/// `previous × (window − elapsed) / window`, rounded up: the previous window's weight.
fn weighted(previous: u64, remaining_len: u64, window: u64) -> u64 {
    let w = (u128::from(previous) * u128::from(remaining_len)).div_ceil(u128::from(window));
    u64::try_from(w).unwrap_or(u64::MAX)
}

/// The shortest `e ≥ 0` with `count × (window − e) ≤ room × window`: how far into a window
/// a previous count of `count` has decayed enough to leave `room`.
fn decayed_at(count: u64, room: u64, window: u64) -> u64 {
    if count == 0 {
        return 0;
    }
    let allowed_len = u128::from(room) * u128::from(window) / u128::from(count);
    window.saturating_sub(u64::try_from(allowed_len).unwrap_or(u64::MAX))
}

impl Algorithm for SlidingWindowCounter {
    type Params = WindowParams;
    type State = CounterState;
    type Snapshot = WindowCounts;

    fn name(&self) -> &'static str {
        "sliding_window_counter"
    }

    fn params(&self, quota: &Quota) -> Result<WindowParams, QuotaError> {
        Ok(WindowParams::new(quota))
    }

    fn horizon(&self, params: &WindowParams) -> u64 {
        let _ = params;
        u64::MAX
    }

    fn new_state(&self, _: &WindowParams) -> CounterState {
        CounterState::default()
    }

    #[inline]
    fn check(&self, params: &WindowParams, state: &CounterState, now: u64, cost: u64) -> Option<Decision> {
        let mut c = lock(state);
        if c.retired {
            return None;
        }
        let (len, limit) = (params.window, params.limit);
        c.roll(now, len);
        let window_start = c.window * len;
        let elapsed = now.saturating_sub(window_start).min(len);
        let until_end = len - elapsed;
        let used = weighted(c.previous, until_end, len) + c.current;
        let reset = if c.current > 0 {
            until_end + len
        } else if c.previous > 0 {
            until_end
        } else {
            0
        };
        if used + cost > limit {
            let retry = if c.current + cost <= limit {
                // Later in this window, once the previous count has decayed enough.
                decayed_at(c.previous, limit - c.current - cost, len) - elapsed
            } else {
                // In the next window, once this window's count (then previous) has decayed.
                until_end + decayed_at(c.current, limit - cost, len)
            };
            return Some(Decision::denied(limit, limit.saturating_sub(used), reset, retry));
        }
        c.add(now, len, cost);
        let reset = if cost > 0 { until_end + len } else { reset };
        Some(Decision::allowed(limit, limit - used - cost, reset))
    }

    fn charge(&self, params: &WindowParams, state: &CounterState, now: u64, cost: u64) -> Option<Charge> {
        let mut c = lock(state);
        if c.retired {
            return None;
        }
        c.roll(now, params.window);
        let used = c.used(now, params.window);
        let charged = cost.min(params.most_used().saturating_sub(used));
        c.add(now, params.window, charged);
        let debt = (used + charged).saturating_sub(params.limit);
        drop(c);
        let decision = self.check(params, state, now, 0)?;
        Some(Charge::new(charged, debt, decision))
    }

    fn retire(&self, state: &CounterState) -> WindowCounts {
        let mut c = lock(state);
        c.retired = true;
        *c
    }

    fn carry_over(
        &self,
        old: &WindowParams,
        mut c: WindowCounts,
        new: &WindowParams,
        now: u64,
    ) -> (u64, CounterState) {
        c.retired = false;
        // The same window and limit (an epoch move, the same quota again, another debt
        // floor, which bounds later charges): nothing changes.
        if old.same_windows(new) {
            return (0, CounterState(Mutex::new(c)));
        }
        c.roll(now, old.window);
        let elapsed = now.saturating_sub(c.window * old.window).min(old.window);
        let used = weighted(c.previous, old.window - elapsed, old.window) + c.current;
        // The estimate becomes the count of the new length's window holding `now`. The epoch
        // stays, so windows of every length start at multiples of their length from it (as
        // on Unix time for the Redis script), and the window indexes stay those of the epoch.
        let counters = WindowCounts {
            retired: false,
            window: now / new.window,
            previous: 0,
            current: old.carried(used, new),
        };
        (0, CounterState(Mutex::new(counters)))
    }

    fn refund(&self, params: &WindowParams, state: &CounterState, taken_at: u64, cost: u64) -> bool {
        let mut c = lock(state);
        if c.retired {
            return false;
        }
        // The take counts in its own window while current, then as the previous window;
        // later it weighs nothing.
        let window = taken_at / params.window;
        if window == c.window {
            c.current -= cost.min(c.current);
        } else if window.checked_add(1) == Some(c.window) {
            c.previous -= cost.min(c.previous);
        }
        true
    }

    fn is_idle(&self, params: &WindowParams, state: &CounterState, now: u64) -> bool {
        let mut c = *lock(state);
        c.roll(now, params.window);
        !c.retired && c.previous == 0 && c.current == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A take whose reading is from the window before the state's (another thread rolled it
    /// first) and its refund leave the counters as they were.
    #[test]
    fn a_take_from_the_previous_window_is_refunded_where_it_counted() {
        let params = WindowParams {
            limit: 10,
            window: 1_000,
            debt: 0,
        };
        let algorithm = SlidingWindowCounter;
        let state = algorithm.new_state(&params);
        let take = |now, cost| {
            algorithm
                .check(&params, &state, now, cost)
                .map(|d| d.is_allowed())
        };
        assert_eq!(take(500, 5), Some(true));
        assert_eq!(take(1_200, 1), Some(true));
        let before = *lock(&state);
        assert_eq!((before.window, before.previous, before.current), (1, 5, 1));
        assert_eq!(take(900, 2), Some(true), "5 weighed fully + 1 + 2 fit in 10");
        assert!(algorithm.refund(&params, &state, 900, 2));
        let after = *lock(&state);
        assert_eq!((after.window, after.previous, after.current), (1, 5, 1));
    }
}
