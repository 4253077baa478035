//! Alarms for fetch deadlines: a fetch whose source never wakes it must still be polled once
//! its time is up, so that it ends, frees its place among the fetches in flight, and lets its
//! key be fetched again.
//!
//! The core has no runtime of its own and the spawner may be any executor, so one thread per
//! process keeps the alarms (started at the first one, asleep when there are none) and wakes
//! each fetch's waker at its deadline. It holds at most one alarm per fetch in flight, and
//! fetches in flight are bounded per limiter.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, Once, OnceLock};
use std::task::Waker;
use std::time::Instant;

use crate::sync::lock;

/// The alarms, by deadline (and a number, so two at one instant stay apart).
struct Alarms {
    pending: Mutex<BTreeMap<(Instant, u64), Waker>>,
    changed: Condvar,
    next_id: AtomicU64,
}

fn alarms() -> &'static Alarms {
    static ALARMS: OnceLock<Alarms> = OnceLock::new();
    static STARTED: Once = Once::new();
    let alarms = ALARMS.get_or_init(|| Alarms {
        pending: Mutex::new(BTreeMap::new()),
        changed: Condvar::new(),
        next_id: AtomicU64::new(0),
    });
    STARTED.call_once(|| {
        // Without the thread (none could be started), a fetch still ends at its deadline the
        // next time it is polled; only a source that never wakes it stays pending.
        let _ = std::thread::Builder::new()
            .name("sluice-fetch-alarms".into())
            .spawn(move || ring(alarms));
    });
    alarms
}

/// The alarm thread: wakes every due alarm, then sleeps until the next one.
fn ring(alarms: &'static Alarms) {
    let mut pending = lock(&alarms.pending);
    loop {
        let now = Instant::now();
        let mut due = Vec::new();
        while let Some(entry) = pending.first_entry() {
            if entry.key().0 > now {
                break;
            }
            due.push(entry.remove());
        }
        if !due.is_empty() {
            // A waker may run an executor's code: not under the lock.
            drop(pending);
            due.into_iter().for_each(Waker::wake);
            pending = lock(&alarms.pending);
            continue;
        }
        pending = match pending.first_key_value().map(|((at, _), _)| *at) {
            Some(at) => {
                let wait = at.saturating_duration_since(now);
                alarms
                    .changed
                    .wait_timeout(pending, wait)
                    .map_or_else(|e| e.into_inner().0, |(guard, _)| guard)
            }
            None => alarms.changed.wait(pending).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// One fetch's alarm: set (or reset) with the waker of its latest poll, removed when dropped.
pub(crate) struct Alarm {
    key: (Instant, u64),
    set: bool,
}

impl Alarm {
    pub(crate) fn new(at: Instant) -> Self {
        let id = alarms().next_id.fetch_add(1, Ordering::Relaxed);
        Self {
            key: (at, id),
            set: false,
        }
    }

    /// Wakes `waker` at the deadline (instead of the waker of an earlier poll).
    pub(crate) fn set(&mut self, waker: &Waker) {
        let alarms = alarms();
        let mut pending = lock(&alarms.pending);
        let first = pending.first_key_value().is_none_or(|(key, _)| self.key <= *key);
        pending.insert(self.key, waker.clone());
        self.set = true;
        drop(pending);
        if first {
            alarms.changed.notify_one();
        }
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        if self.set {
            lock(&alarms().pending).remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;
    use std::time::Duration;

    use super::*;

    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn an_alarm_wakes_at_its_deadline_and_a_dropped_one_never() {
        let (rung, dropped) = (
            Arc::new(Flag(AtomicBool::new(false))),
            Arc::new(Flag(AtomicBool::new(false))),
        );
        let mut alarm = Alarm::new(Instant::now() + Duration::from_millis(20));
        alarm.set(&Waker::from(Arc::clone(&rung)));
        let mut gone = Alarm::new(Instant::now() + Duration::from_millis(10));
        gone.set(&Waker::from(Arc::clone(&dropped)));
        drop(gone);
        let start = Instant::now();
        while !rung.0.load(Ordering::SeqCst) {
            assert!(start.elapsed() < Duration::from_secs(30), "the alarm never rang");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!dropped.0.load(Ordering::SeqCst), "a dropped alarm rang");
    }
}
