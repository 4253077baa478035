//! Time as `u64` nanoseconds from a monotonic origin.
//!
//! Every algorithm takes the current time as an integer, never as a float and never from the
//! wall clock, so decisions are exact and reproducible. A [`Clock`] supplies that integer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A source of monotonic time in nanoseconds.
///
/// Readings never go backwards. The origin is arbitrary (each clock documents its own); the
/// algorithms only compare readings from the same clock.
///
/// # Example
/// ```
/// use sluice::{Clock, ManualClock};
/// let clock = ManualClock::new(5);
/// assert_eq!(clock.now(), 5);
/// ```
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's origin.
    fn now(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

/// The default clock: monotonic across threads and cores, as std's [`Instant`](std::time::Instant) is.
///
/// On x86_64 Linux, where the processor's time-stamp counter is invariant and the kernel uses
/// it as its own clock source, readings come from the counter directly (after its rate is
/// measured against `Instant` over the process's first 50 ms), at about half the cost of an
/// `Instant`; elsewhere, and during those first 50 ms, from `Instant`.
///
/// All `MonotonicClock`s in a process share one origin (the first reading), so readings from
/// two instances can be compared. At 2^64 ns (584 years) of uptime the reading saturates.
///
/// # Example
/// ```
/// use sluice::{Clock, MonotonicClock};
/// let clock = MonotonicClock;
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        crate::tsc::now()
    }
}

/// A clock that moves only when told to: for tests, simulations and replays.
///
/// Clones share the same time, so a test can hold one clone and give another to a limiter.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::{Clock, ManualClock};
/// let clock = ManualClock::new(0);
/// clock.advance(Duration::from_millis(1));
/// assert_eq!(clock.now(), 1_000_000);
/// clock.set(u64::MAX - 1);
/// assert_eq!(clock.now(), u64::MAX - 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading `start` nanoseconds.
    pub fn new(start: u64) -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward, saturating at `u64::MAX`.
    #[inline]
    pub fn advance(&self, by: Duration) {
        self.advance_nanos(saturating_nanos(by));
    }

    /// Moves the clock forward by `by` nanoseconds, saturating at `u64::MAX`.
    #[inline]
    pub fn advance_nanos(&self, by: u64) {
        let _ = self.nanos.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
            Some(t.saturating_add(by))
        });
    }

    /// Sets the reading. Setting it backwards is allowed (a test may want that) but the
    /// algorithms treat a reading older than their state as "no time has passed".
    pub fn set(&self, nanos: u64) {
        self.nanos.store(nanos, Ordering::Release);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.nanos.load(Ordering::Acquire)
    }
}

/// `duration` in whole nanoseconds, as clocks count time here, saturating at `u64::MAX`
/// (584 years).
///
/// # Example
/// ```
/// use std::time::Duration;
/// assert_eq!(sluice::saturating_nanos(Duration::from_millis(3)), 3_000_000);
/// assert_eq!(sluice::saturating_nanos(Duration::MAX), u64::MAX);
/// ```
pub fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
