//! The health of a connection to Redis: healthy, or degraded after `degrade_after` failed
//! calls in a row, with probes (one caller at a time) backing off exponentially until one
//! succeeds; and the counts of calls, failures, timeouts, outages and recoveries.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluice::{Clock, MonotonicClock, saturating_nanos};

use crate::store::{CallError, RedisOptions, StoreMetrics};

/// Healthy, or degraded with a time for the next probe; probes back off exponentially.
pub(crate) struct Health {
    pub(crate) degraded: AtomicBool,
    /// Failed calls since the last success.
    failing: AtomicU64,
    /// `failing` at which Redis counts as unavailable.
    degrade_after: u64,
    /// Monotonic ns at which the next probe may go out.
    next_probe: AtomicU64,
    backoff: AtomicU64,
    min_backoff: u64,
    max_backoff: u64,
    timeout: u64,
    calls: AtomicU64,
    failures: AtomicU64,
    timeouts: AtomicU64,
    outages: AtomicU64,
    recoveries: AtomicU64,
    /// Calls not made: degraded, and no probe due.
    pub(crate) skipped: AtomicU64,
}

/// What kind of call may go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    Normal,
    Probe,
}

impl Health {
    pub(crate) fn new(options: &RedisOptions) -> Self {
        let min_backoff = saturating_nanos(options.probe_backoff).max(1);
        Self {
            degraded: AtomicBool::new(false),
            failing: AtomicU64::new(0),
            degrade_after: u64::from(options.degrade_after.max(1)),
            next_probe: AtomicU64::new(0),
            backoff: AtomicU64::new(min_backoff),
            min_backoff,
            max_backoff: saturating_nanos(options.probe_backoff_max).max(min_backoff),
            timeout: saturating_nanos(options.timeout),
            calls: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            timeouts: AtomicU64::new(0),
            outages: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// Healthy: a normal call. Degraded: a probe for the one caller that claims a due one.
    pub(crate) fn attempt(&self) -> Option<Attempt> {
        if !self.degraded.load(Ordering::Acquire) {
            return Some(Attempt::Normal);
        }
        let now = MonotonicClock.now();
        let due = self.next_probe.load(Ordering::Acquire);
        // The claim holds for one timeout plus a backoff, so a probe whose caller went away
        // does not stop later probes.
        let lease = now
            .saturating_add(self.timeout)
            .saturating_add(self.backoff.load(Ordering::Relaxed));
        (now >= due
            && self
                .next_probe
                .compare_exchange(due, lease, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok())
        .then_some(Attempt::Probe)
    }

    pub(crate) fn until_probe(&self) -> Duration {
        let due = self.next_probe.load(Ordering::Acquire);
        Duration::from_nanos(due.saturating_sub(MonotonicClock.now()).max(1))
    }

    pub(crate) fn succeeded(&self, url: &str, attempt: Attempt) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.failing.load(Ordering::Relaxed) != 0 {
            self.failing.store(0, Ordering::Relaxed);
        }
        if attempt == Attempt::Probe {
            self.backoff.store(self.min_backoff, Ordering::Relaxed);
            if self.degraded.swap(false, Ordering::AcqRel) {
                self.recoveries.fetch_add(1, Ordering::Relaxed);
                tracing::info!(redis = url, "Redis answers again; checks go to Redis");
            }
        }
    }

    pub(crate) fn failed(&self, url: &str, error: &CallError, attempt: Attempt) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if matches!(error, CallError::Timeout) {
            self.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        let now = MonotonicClock.now();
        match attempt {
            Attempt::Probe => {
                let backoff = self
                    .backoff
                    .load(Ordering::Relaxed)
                    .saturating_mul(2)
                    .min(self.max_backoff);
                self.backoff.store(backoff, Ordering::Relaxed);
                self.next_probe
                    .store(now.saturating_add(backoff), Ordering::Release);
                tracing::debug!(redis = url, %error, "probe failed; Redis still unavailable");
            }
            Attempt::Normal => {
                let failing = self.failing.fetch_add(1, Ordering::Relaxed) + 1;
                if failing < self.degrade_after {
                    tracing::debug!(redis = url, %error, failing, "a Redis call failed; the failure policy answers it");
                    return;
                }
                if !self.degraded.swap(true, Ordering::AcqRel) {
                    let backoff = self.backoff.load(Ordering::Relaxed);
                    self.next_probe
                        .store(now.saturating_add(backoff), Ordering::Release);
                    self.outages.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        redis = url,
                        %error,
                        "Redis unavailable; checks answer by the failure policy until a probe succeeds"
                    );
                }
            }
        }
    }

    pub(crate) fn metrics(&self) -> StoreMetrics {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreMetrics {
            degraded: self.degraded.load(Ordering::Acquire),
            calls: load(&self.calls),
            failures: load(&self.failures),
            timeouts: load(&self.timeouts),
            outages: load(&self.outages),
            recoveries: load(&self.recoveries),
            skipped: load(&self.skipped),
        }
    }
}
