//! Building a keyed limiter: its settings and their defaults.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::book::QuotaBook;
use super::fetch::{ErrorHook, FetchPlaces, Spawner, Task};
use super::lock::StripedRwLock;
use super::metrics::LimiterCounts;
use super::pool::Pool;
use super::shard::{Shard, meta};
use super::table::MAX_ENTRIES;
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
            pool: None,
            fetch_timeout: DEFAULT_FETCH_TIMEOUT,
            max_fetches: DEFAULT_MAX_FETCHES,
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
#[must_use = "a builder does nothing until built"]
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
    pool: Option<Quota>,
    fetch_timeout: Duration,
    max_fetches: usize,
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

    /// How often a key's quota is fetched again (default [`DEFAULT_REFRESH`], at most
    /// [`MAX_REFRESH`]; at least about a millisecond, the resolution ages are kept at).
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

    /// One shared limit, a token bucket of `quota`, on everything admitted under the failsafe
    /// quota and on every key the store cannot hold (default: none). A new key (or one whose
    /// fetches failed so far) is admitted only if both its own failsafe quota and the pool
    /// have room, so a flood of new keys costs at most the pool however many keys it brings.
    /// When the pool is spent such a key gets the unknown-key answer: denied, under the
    /// unknown-key quota, with the pool's retry-after (a cost above the pool's capacity: its
    /// time to refill). With [`wait_for_first_fetch`](Self::wait_for_first_fetch) a new key
    /// waits for its own quota first and comes to the pool only if the wait runs out.
    ///
    /// # Example
    /// ```
    /// use sluice::{FetchResult, FnSource, KeyedLimiter, ManualClock, TokenBucket};
    /// // A source that never answers: every key stays on the failsafe quota (5/s each).
    /// let source = FnSource(|_: &u64| std::future::pending::<FetchResult>());
    /// let limiter = KeyedLimiter::builder(TokenBucket, "5/s".parse()?)
    ///     .failsafe_pool("3/min".parse()?)
    ///     .source(source)
    ///     .spawner(|task| drop(task)) // a failed fetch: the key stays on the failsafe quota
    ///     .clock(ManualClock::new(0))
    ///     .build()?;
    /// let admitted = (0..100u64).filter(|key| limiter.check(key).is_allowed()).count();
    /// assert_eq!(admitted, 3); // not 100: the pool holds 3
    /// let denied = limiter.check(&100);
    /// assert_eq!(denied.retry_after().as_secs(), 20); // the pool's next unit
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn failsafe_pool(mut self, quota: Quota) -> Self {
        self.pool = Some(quota);
        self
    }

    /// How long a fetch may run before it ends as a failed fetch (default
    /// [`DEFAULT_FETCH_TIMEOUT`]): the key keeps its last known quota (or the failsafe one),
    /// the failure goes to the error hook and the `fetch_timeouts` counter, and the key is
    /// fetched again a refresh period later. Real time, whatever the limiter's clock.
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::{FetchResult, FnSource, KeyedLimiter, TokenBucket};
    /// let hangs = FnSource(|_: &String| std::future::pending::<FetchResult>());
    /// let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse()?)
    ///     .source(hangs)
    ///     .fetch_timeout(Duration::from_millis(10))
    ///     .wait_for_first_fetch(Duration::from_secs(5)) // ends at the fetch timeout
    ///     .build()?;
    /// assert_eq!(limiter.check("alice").limit(), 1); // the failsafe quota
    /// assert_eq!(limiter.metrics().fetch_timeouts, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fetch_timeout(mut self, timeout: Duration) -> Self {
        self.fetch_timeout = timeout;
        self
    }

    /// The most fetches running at once (default [`DEFAULT_MAX_FETCHES`], at least 1): a
    /// fetch that does not answer at once holds a place until it ends. With none free no task
    /// is started: a new key starts on the failsafe quota (and the pool) and is fetched at a
    /// later check, and a refresh waits for a later check.
    ///
    /// # Example
    /// ```
    /// use sluice::{FetchResult, FnSource, KeyedLimiter, TokenBucket};
    /// use std::sync::{Arc, Mutex};
    /// let hangs = FnSource(|_: &u64| std::future::pending::<FetchResult>());
    /// let tasks = Arc::new(Mutex::new(Vec::new()));
    /// let held = Arc::clone(&tasks);
    /// let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse()?)
    ///     .source(hangs)
    ///     .spawner(move |task| held.lock().unwrap().push(task)) // held, never run
    ///     .max_fetches_in_flight(2)
    ///     .build()?;
    /// for key in 0..10u64 {
    ///     let _ = limiter.check(&key);
    /// }
    /// assert_eq!(limiter.metrics().fetches_skipped, 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_fetches_in_flight(mut self, fetches: usize) -> Self {
        self.max_fetches = fetches.max(1);
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
            pool: self.pool,
            fetch_timeout: self.fetch_timeout,
            max_fetches: self.max_fetches,
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
            pool: self.pool,
            fetch_timeout: self.fetch_timeout,
            max_fetches: self.max_fetches,
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
    /// [`KeyedBuildError::Quota`] if the algorithm cannot hold the failsafe or unknown-key
    /// quota (or the token bucket the pool's), [`KeyedBuildError::RefreshTooLong`] for a
    /// refresh period beyond [`MAX_REFRESH`].
    pub fn build(self) -> Result<KeyedLimiter<K, A, S, C>, KeyedBuildError> {
        if self.refresh > MAX_REFRESH {
            return Err(KeyedBuildError::RefreshTooLong(self.refresh));
        }
        let own = |setting, quota, source| KeyedBuildError::Quota {
            setting,
            quota,
            source,
        };
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        // A shard holds at most `MAX_ENTRIES`: a larger capacity takes more shards.
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
        let failsafe = match self.pool {
            Some(_) => book.book_pooled(&self.algorithm, self.failsafe),
            None => book.book_own(&self.algorithm, self.failsafe),
        }
        .map_err(|e| own("failsafe", self.failsafe, e))?;
        let unknown = book
            .book_own(&self.algorithm, self.unknown)
            .map_err(|e| own("unknown-key", self.unknown, e))?;
        let pool = match self.pool {
            Some(quota) => {
                Some(Pool::new(quota, self.clock.now()).map_err(|e| own("failsafe pool", quota, e))?)
            }
            None => None,
        };
        // Ages are counted to 2^20 ns (at least that, then); at most `MAX_REFRESH`, checked
        // above, so it fits.
        let refresh_after = (crate::saturating_nanos(self.refresh) & !meta::LOW).max(meta::LOW + 1);
        let refresh_after = i64::try_from(refresh_after).unwrap_or(i64::MAX);
        Ok(KeyedLimiter {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| StripedRwLock::new(Shard::new(per_shard), owned, shared))
                    .collect(),
                shard_bits: shards.trailing_zeros(),
                hasher: super::KeyHashState::default(),
                book,
                failsafe,
                unknown,
                refresh_after,
                first_fetch_wait: self.first_fetch_wait,
                pool,
                slots: FetchPlaces::new(self.max_fetches),
                fetch_timeout: self.fetch_timeout,
                algorithm: self.algorithm,
                clock: self.clock,
                source: self.source,
                spawner: self.spawner,
                on_fetch_error: self.on_fetch_error,
                counters: LimiterCounts::default(),
            }),
        })
    }
}

/// The most keys a keyed limiter holds unless told otherwise.
pub const DEFAULT_CAPACITY: usize = 100_000;

/// How often a key's quota is fetched again unless told otherwise.
pub const DEFAULT_REFRESH: Duration = Duration::from_secs(60);

/// The longest refresh period: 2^63 − 1 ns, about 292 years. A key's quota age is the
/// difference of two clock readings taken as signed (so a check that read the clock just
/// before a fetch was applied sees a negative age, not a due refresh).
///
/// # Example
/// ```
/// use sluice::{KeyedBuildError, KeyedLimiter, MAX_REFRESH, TokenBucket};
/// let build = |period| KeyedLimiter::<u64, _>::builder(TokenBucket, "1/s".parse().unwrap())
///     .refresh_every(period)
///     .build();
/// assert!(build(MAX_REFRESH).is_ok());
/// let too_long = MAX_REFRESH + std::time::Duration::from_nanos(1);
/// assert!(matches!(build(too_long), Err(KeyedBuildError::RefreshTooLong(_))));
/// ```
pub const MAX_REFRESH: Duration = Duration::from_nanos(i64::MAX.unsigned_abs());

/// How long a quota fetch may run unless told otherwise: far beyond what a quota service
/// should take, and short enough that a hung one frees its places among the fetches in
/// flight within seconds.
///
/// # Example
/// ```
/// assert_eq!(sluice::DEFAULT_FETCH_TIMEOUT.as_secs(), 5);
/// ```
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// The most fetches in flight unless told otherwise: at a fetch latency of 50 ms, room for
/// some 20 000 new keys a second, and a bound on the tasks a hung source can hold.
///
/// # Example
/// ```
/// assert_eq!(sluice::DEFAULT_MAX_FETCHES, 1024);
/// ```
pub const DEFAULT_MAX_FETCHES: usize = 1024;

/// Why a keyed limiter could not be built.
///
/// # Example
/// ```
/// use sluice::{KeyedBuildError, KeyedLimiter, TokenBucket};
/// let error = KeyedLimiter::<u64, _>::builder(TokenBucket, "1/s".parse()?)
///     .failsafe_pool("18446744073709551615/ns burst 1".parse()?)
///     .build()
///     .unwrap_err();
/// assert!(matches!(error, KeyedBuildError::Quota { setting: "failsafe pool", .. }));
/// assert!(error.to_string().starts_with("the failsafe pool quota"));
/// # Ok::<(), sluice::QuotaError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyedBuildError {
    /// The algorithm (for the failsafe pool, the token bucket) cannot hold one of the
    /// limiter's own quotas.
    #[error("the {setting} quota {quota}: {source}")]
    Quota {
        /// `failsafe`, `unknown-key` or `failsafe pool`.
        setting: &'static str,
        /// The quota.
        quota: Quota,
        /// Why it cannot be held.
        source: QuotaError,
    },
    /// The refresh period is longer than [`MAX_REFRESH`].
    #[error(
        "a refresh period of {0:?} is too long: at most 2^63 − 1 ns (about 292 years), the span \
         a key's quota age is counted in"
    )]
    RefreshTooLong(Duration),
}

/// The most shards a limiter has.
const MAX_SHARDS: usize = 1 << 16;
