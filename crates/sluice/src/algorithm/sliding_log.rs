//! The sliding window log.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

use super::Algorithm;
use super::fixed_window::WindowParams;
use crate::{Charge, Decision, Quota, QuotaError};

/// A sliding window log: remembers when each admitted unit was admitted and admits a cost if
/// the units admitted in the last window (the quota's fill time) plus the cost fit the
/// capacity. The most exact window algorithm, and the most memory: at most `capacity`
/// entries (requests at the same instant share one), allocated as they are used.
///
/// The log is guarded by a mutex of its own (a log cannot be updated in one atomic word).
///
/// # Example
/// ```
/// use sluice::{ManualClock, Quota, RateLimiter, SlidingWindowLog};
/// let clock = ManualClock::new(0);
/// let limiter = RateLimiter::with_clock(SlidingWindowLog, "2/s".parse::<Quota>()?, clock.clone())?;
/// assert!(limiter.check().is_allowed());
/// clock.set(400_000_000);
/// assert!(limiter.check().is_allowed());
/// // Full until the first entry leaves the window at t = 1 s.
/// assert_eq!(limiter.check().retry_after_nanos(), 600_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SlidingWindowLog;

/// The log: `(time, units admitted at that time)`, oldest first.
#[derive(Debug, Default)]
pub struct LogState(Mutex<Log>);

#[derive(Debug, Default)]
pub struct Log {
    retired: bool,
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl Log {
    fn expire(&mut self, now: u64, window: u64) {
        while let Some(&(at, units)) = self.entries.front() {
            if now.saturating_sub(at) < window {
                break;
            }
            self.entries.pop_front();
            self.total -= units;
        }
    }

    /// Logs `cost` units at `now`.
    fn add(&mut self, now: u64, cost: u64) {
        if cost > 0 {
            self.total += cost;
            match self.entries.back_mut() {
                Some((at, units)) if *at == now => *units += cost,
                _ => self.entries.push_back((now, cost)),
            }
        }
    }

    /// Time until the entry that frees `needed` units leaves the window.
    fn until_freed(&self, needed: u64, now: u64, window: u64) -> u64 {
        let mut freed = 0;
        for &(at, units) in &self.entries {
            freed += units;
            if freed >= needed {
                return (at + window).saturating_sub(now);
            }
        }
        0
    }

    fn until_empty(&self, now: u64, window: u64) -> u64 {
        self.entries
            .back()
            .map_or(0, |&(at, _)| (at + window).saturating_sub(now))
    }
}

fn lock(state: &LogState) -> MutexGuard<'_, Log> {
    crate::sync::lock(&state.0)
}

impl Algorithm for SlidingWindowLog {
    type Params = WindowParams;
    type State = LogState;
    type Snapshot = Log;

    fn name(&self) -> &'static str {
        "sliding_window_log"
    }

    fn params(&self, quota: &Quota) -> Result<WindowParams, QuotaError> {
        Ok(WindowParams::new(quota))
    }

    fn horizon(&self, params: &WindowParams) -> u64 {
        u64::MAX - params.window
    }

    fn new_state(&self, _: &WindowParams) -> LogState {
        LogState::default()
    }

    #[inline]
    fn check(&self, params: &WindowParams, state: &LogState, now: u64, cost: u64) -> Option<Decision> {
        let mut log = lock(state);
        if log.retired {
            return None;
        }
        log.expire(now, params.window);
        let limit = params.limit;
        if log.total + cost > limit {
            let retry = log.until_freed(log.total + cost - limit, now, params.window);
            let reset = log.until_empty(now, params.window);
            return Some(Decision::denied(
                limit,
                limit.saturating_sub(log.total),
                reset,
                retry,
            ));
        }
        log.add(now, cost);
        Some(Decision::allowed(
            limit,
            limit - log.total,
            log.until_empty(now, params.window),
        ))
    }

    fn charge(&self, params: &WindowParams, state: &LogState, now: u64, cost: u64) -> Option<Charge> {
        let mut log = lock(state);
        if log.retired {
            return None;
        }
        log.expire(now, params.window);
        let charged = cost.min(params.most_used().saturating_sub(log.total));
        log.add(now, charged);
        let debt = log.total.saturating_sub(params.limit);
        drop(log);
        let decision = self.check(params, state, now, 0)?;
        Some(Charge::new(charged, debt, decision))
    }

    fn retire(&self, state: &LogState) -> Log {
        let mut log = lock(state);
        let taken = std::mem::take(&mut *log);
        // Marked on what stays behind: a check still holding this state must be refused.
        log.retired = true;
        taken
    }

    fn carry_over(&self, old: &WindowParams, mut log: Log, new: &WindowParams, now: u64) -> (u64, LogState) {
        log.retired = false;
        // A unit that has left the old window stays gone under a longer new one.
        log.expire(now, old.window.min(new.window));
        // Over the new capacity: forget the oldest units first (debt too, unless the
        // parameters are the same).
        let most = old.carried(log.total, new);
        while log.total > most {
            let excess = log.total - most;
            let Some(front) = log.entries.front_mut() else {
                break;
            };
            let dropped = front.1.min(excess);
            front.1 -= dropped;
            log.total -= dropped;
            if front.1 == 0 {
                log.entries.pop_front();
            }
        }
        (0, LogState(Mutex::new(log)))
    }

    fn refund(&self, _: &WindowParams, state: &LogState, taken_at: u64, cost: u64) -> bool {
        let mut log = lock(state);
        if log.retired {
            return false;
        }
        // The take is the newest entry at its time (entries at one instant share one); an
        // expired entry is gone and counts no more.
        if let Some(i) = log.entries.iter().rposition(|&(at, _)| at == taken_at) {
            let units = &mut log.entries[i].1;
            let back = cost.min(*units);
            *units -= back;
            if *units == 0 {
                log.entries.remove(i);
            }
            log.total -= back;
        }
        true
    }

    fn is_idle(&self, params: &WindowParams, state: &LogState, now: u64) -> bool {
        let log = lock(state);
        !log.retired && log.until_empty(now, params.window) == 0
    }
}
