//! Building a keyed limiter: its settings and their defaults.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::book::QuotaBook;
use super::fetch::{ErrorHook, Spawner, Task};
use super::index::MAX_ENTRIES;
use super::lock::StripedRwLock;
use super::metrics::Counters;
use super::shard::{Shard, meta};
use super::{FetchError, Inner, KeyedLimiter, QuotaSource, StaticQuotas};
use crate::{Algorithm, Clock, MonotonicClock, Quota, QuotaError};

impl<K: Hash + Eq + Send + Sync + 'static, A: Algorithm> KeyedLimiter<K, A> {
    /// A builder with the given algorithm and failsafe quota (the quota of a key whose own
    /// quota is still being fetched).
    pub fn builder(algorithm: A, failsafe: Quota) -> KeyedBuilder<K, A, StaticQuotas<K>, MonotonicClock> {
        KeyedBuilder {
            algorithm,
            clock: MonotonicClock,
            source: None,
            failsafe,
            unknown: Quota::deny_all(),
            capacity: DEFAULT_CAPACITY,
            shards: None,
            refresh: DEFAULT_REFRESH,
            first_fetch_wait: None,
            spawner: None,
            on_fetch_error: None,
        }
    }
}

/// Builds a [`KeyedLimiter`].
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
/// let quotas = StaticQuotas::from_iter([("alice".to_string(), "1/s".parse()?)]);
/// let limiter = KeyedLimiter::builder(TokenBucket, "10/s".parse()?)
///     .capacity(100_000)
///     .unknown_key_quota("0/s".parse()?)
///     .source(quotas)
///     .build()?;
/// assert!(limiter.check("alice").is_allowed());
/// assert!(!limiter.check("alice").is_allowed());
/// assert!(!limiter.check("mallory").is_allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedBuilder<K, A, S, C> {
    algorithm: A,
    clock: C,
    source: Option<S>,
    failsafe: Quota,
    unknown: Quota,
    capacity: usize,
    shards: Option<usize>,
    refresh: Duration,
    first_fetch_wait: Option<Duration>,
    spawner: Option<Spawner>,
    on_fetch_error: Option<ErrorHook<K>>,
}

impl<K, A, S, C> KeyedBuilder<K, A, S, C> {
    /// The most keys held at once (default [`DEFAULT_CAPACITY`]). A shard holds at most 1 048 575, so a
    /// larger capacity takes more shards than asked for (up to 65 536 of them).
    pub fn capacity(mut self, entries: usize) -> Self {
        self.capacity = entries.max(1);
        self
    }

    /// The number of shards, rounded up to a power of two (default: 16 per core, at most 1024).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards.clamp(1, MAX_SHARDS));
        self
    }

    /// The quota of keys the source does not know, and of every key without a source
    /// (default: deny everything).
    pub fn unknown_key_quota(mut self, quota: Quota) -> Self {
        self.unknown = quota;
        self
    }

    /// How often a key's quota is fetched again (default [`DEFAULT_REFRESH`]).
    pub fn refresh_every(mut self, period: Duration) -> Self {
        self.refresh = period;
        self
    }

    /// Makes the first check of a key wait, on the calling thread, up to `timeout` for the
    /// source's answer, so the key starts on its own quota rather than the failsafe one
    /// (default: never wait). A fetch still running at the timeout goes on in the background
    /// as usual and the key starts on the failsafe quota. The wait blocks the thread: on an
    /// async runtime, prefer the default or a fast source.
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::{FnSource, KeyedLimiter, Quota, TokenBucket};
    /// // A slow source: it answers from another thread after 10 ms.
    /// let source = FnSource(|_: &String| {
    ///     let (tx, rx) = std::sync::mpsc::channel();
    ///     std::thread::spawn(move || {
    ///         std::thread::sleep(Duration::from_millis(10));
    ///         let _ = tx.send("5/s".parse::<Quota>());
    ///     });
    ///     std::future::poll_fn(move |cx| match rx.try_recv() {
    ///         Ok(quota) => std::task::Poll::Ready(Ok(Some(quota?))),
    ///         Err(_) => {
    ///             cx.waker().wake_by_ref(); // poll again soon
    ///             std::task::Poll::Pending
    ///         }
    ///     })
    /// });
    /// let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse()?)
    ///     .source(source)
    ///     .wait_for_first_fetch(Duration::from_secs(5))
    ///     .build()?;
    /// assert_eq!(limiter.check("alice").limit(), 5); // the fetched quota, not the failsafe
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn wait_for_first_fetch(mut self, timeout: Duration) -> Self {
        self.first_fetch_wait = Some(timeout);
        self
    }

    /// Runs fetches that do not complete at once (required for such sources).
    pub fn spawner(mut self, spawner: impl Fn(Task) + Send + Sync + 'static) -> Self {
        self.spawner = Some(Arc::new(spawner));
        self
    }

    /// Called with every failed fetch (the key keeps its last known quota).
    pub fn on_fetch_error(mut self, hook: impl Fn(&K, &FetchError) + Send + Sync + 'static) -> Self {
        self.on_fetch_error = Some(Arc::new(hook));
        self
    }

    /// Where quotas come from.
    pub fn source<S2>(self, source: S2) -> KeyedBuilder<K, A, S2, C> {
        KeyedBuilder {
            algorithm: self.algorithm,
            clock: self.clock,
            source: Some(source),
            failsafe: self.failsafe,
            unknown: self.unknown,
            capacity: self.capacity,
            shards: self.shards,
            refresh: self.refresh,
            first_fetch_wait: self.first_fetch_wait,
            spawner: self.spawner,
            on_fetch_error: self.on_fetch_error,
        }
    }

    /// The clock (default [`MonotonicClock`]).
    pub fn clock<C2>(self, clock: C2) -> KeyedBuilder<K, A, S, C2> {
        KeyedBuilder {
            algorithm: self.algorithm,
            clock,
            source: self.source,
            failsafe: self.failsafe,
            unknown: self.unknown,
            capacity: self.capacity,
            shards: self.shards,
            refresh: self.refresh,
            first_fetch_wait: self.first_fetch_wait,
            spawner: self.spawner,
            on_fetch_error: self.on_fetch_error,
        }
    }
}

impl<K, A, S, C> KeyedBuilder<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// The limiter.
    ///
    /// # Errors
    /// [`QuotaError`] if the algorithm cannot hold the failsafe or unknown-key quota.
    pub fn build(self) -> Result<KeyedLimiter<K, A, S, C>, QuotaError> {
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        // A shard indexes at most `MAX_ENTRIES`: a larger capacity takes more shards.
        let shards = self
            .shards
            .unwrap_or(cores * 16)
            .min(1024)
            .max(self.capacity.div_ceil(MAX_ENTRIES))
            .min(MAX_SHARDS)
            .next_power_of_two();
        // Reader stripes (see `lock.rs`): owned by the first thread per core and one more (a
        // main thread, say; at most 32), shared by the rest (one per two cores, at most 8).
        let (owned, shared) = ((cores + 1).min(32), cores.div_ceil(2).min(8));
        let per_shard = self.capacity.div_ceil(shards);
        let book = QuotaBook::new(self.capacity);
        let failsafe = book.book_own(&self.algorithm, self.failsafe)?;
        let unknown = book.book_own(&self.algorithm, self.unknown)?;
        let refresh_ticks = meta::tick(crate::saturating_nanos(self.refresh)).max(1);
        Ok(KeyedLimiter {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| StripedRwLock::new(Shard::new(per_shard), owned, shared))
                    .collect(),
                shard_bits: shards.trailing_zeros(),
                hasher: foldhash::fast::RandomState::default(),
                book,
                failsafe,
                unknown,
                refresh_ticks,
                first_fetch_wait: self.first_fetch_wait,
                algorithm: self.algorithm,
                clock: self.clock,
                source: self.source,
                spawner: self.spawner,
                on_fetch_error: self.on_fetch_error,
                counters: Counters::default(),
            }),
        })
    }
}

/// The most keys a keyed limiter holds unless told otherwise.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// How often a key's quota is fetched again unless told otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(60);

/// The most shards a limiter has.
const MAX_SHARDS: usize = 1 << 16;
