//! What a keyed limiter counts about itself.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a keyed limiter, read with [`super::KeyedLimiter::metrics`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyedMetrics {
    /// Keys held now.
    pub entries: u64,
    /// Entries evicted because they carried no information.
    pub evicted_idle: u64,
    /// Entries evicted as the least frequently used of a sample.
    pub evicted_frequency: u64,
    /// Newcomers not stored because everyone they could replace was used more.
    pub refused: u64,
    /// Quota fetches started.
    pub fetches: u64,
    /// Quota fetches that failed (the key kept its last known quota), the two below among them.
    pub fetch_errors: u64,
    /// Quota fetches that did not answer within the fetch timeout.
    pub fetch_timeouts: u64,
    /// Quota fetches whose source panicked (caught).
    pub fetch_panics: u64,
    /// New keys that started without a fetch task because every place for fetches in flight
    /// was taken (fetched at a later check).
    pub fetches_skipped: u64,
    /// Fetches running now (at most the limiter's bound).
    pub fetches_in_flight: u64,
    /// Whole units of the failsafe pool in use now (0 without a pool).
    pub pool_used: u64,
    /// The failsafe pool's capacity (0 without a pool).
    pub pool_capacity: u64,
}

/// Sums another limiter's counters into these (several limiters read as one).
impl std::ops::AddAssign for KeyedMetrics {
    fn add_assign(&mut self, other: Self) {
        let Self {
            entries,
            evicted_idle,
            evicted_frequency,
            refused,
            fetches,
            fetch_errors,
            fetch_timeouts,
            fetch_panics,
            fetches_skipped,
            fetches_in_flight,
            pool_used,
            pool_capacity,
        } = other;
        self.entries += entries;
        self.evicted_idle += evicted_idle;
        self.evicted_frequency += evicted_frequency;
        self.refused += refused;
        self.fetches += fetches;
        self.fetch_errors += fetch_errors;
        self.fetch_timeouts += fetch_timeouts;
        self.fetch_panics += fetch_panics;
        self.fetches_skipped += fetches_skipped;
        self.fetches_in_flight += fetches_in_flight;
        self.pool_used += pool_used;
        self.pool_capacity += pool_capacity;
    }
}

/// The limiter-wide counters. Evictions and refusals are counted per shard, under its write
/// lock.
#[derive(Default)]
pub(crate) struct LimiterCounts {
    pub(crate) fetches: AtomicU64,
    pub(crate) fetch_errors: AtomicU64,
    pub(crate) fetch_timeouts: AtomicU64,
    pub(crate) fetch_panics: AtomicU64,
    pub(crate) fetches_skipped: AtomicU64,
}

impl LimiterCounts {
    pub(crate) fn read(&self) -> KeyedMetrics {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KeyedMetrics {
            fetches: load(&self.fetches),
            fetch_errors: load(&self.fetch_errors),
            fetch_timeouts: load(&self.fetch_timeouts),
            fetch_panics: load(&self.fetch_panics),
            fetches_skipped: load(&self.fetches_skipped),
            ..KeyedMetrics::default()
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
