//! The keyed limiter: one limit per key (account, API key, IP...), each with its own quota
//! from a [`QuotaSource`], in bounded memory, without a global lock.
//!
//! Keys live in shards (a power of two, several per core), each a read-write lock over a hash
//! index and a dense vector of entries. Checking a key that is present takes only the shard's
//! *read* lock and allocates nothing; the limit itself is decided by the algorithm's atomic
//! state. Inserting a key, applying a fetched quota or evicting takes that one shard's write
//! lock.
//!
//! Memory is bounded by a capacity in entries. When a shard is full, a newcomer makes room by
//! evicting, from a small sample taken round the shard, an idle entry (a full bucket, an
//! expired window) not used since it was stored (a key in use also holds its fetched quota,
//! so it is not dropped merely for being idle), or else the least
//! frequently used, but only if the newcomer has been seen more often than that entry
//! (TinyLFU admission, with a count-min sketch of recent keys). A flood of one-shot keys therefore cannot push out keys in use; a
//! refused newcomer is decided on a fresh state and not stored.

mod index;
mod lock;
mod refund;
mod shard;
mod sketch;
mod source;

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use index::MAX_ENTRIES;
use lock::StripedRwLock;
use shard::{Compiled, Entry, LimitRef, Room, Shard, meta};
pub use source::{FetchError, FetchResult, FnSource, QuotaSource, StaticQuotas};

use crate::chain::Receipt;
use crate::limiter::{decide, unit_decision};
use crate::{Algorithm, CheckError, Clock, Decision, MonotonicClock, Quota, QuotaError};

/// A boxed background task, as handed to a [`Spawner`].
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A check's answer and the limit it was made under (its quota read only if wanted: copying
/// one out of a call costs more than the pointer).
type Quoted<A> = (Result<Decision, CheckError>, LimitRef<A>);

/// A check of a held key: the answer with the receipt a refund needs, and the quota.
type QuotedTake = (Result<(Decision, Receipt), CheckError>, Quota);

/// Why a check left the read-locked path for the slow one.
#[derive(Clone, Copy)]
enum Miss {
    /// The key was not stored when the shard had seen this many inserts.
    Absent { inserts: u64 },
    /// The key's state must move to a new epoch, or was retired meanwhile.
    Stale,
}

/// Runs background quota fetches: `Arc::new(|task| { tokio::spawn(task); })`.
pub type Spawner = Arc<dyn Fn(Task) + Send + Sync>;

type ErrorHook<K> = Arc<dyn Fn(&K, &FetchError) + Send + Sync>;
type PendingFetch = Pin<Box<dyn Future<Output = FetchResult> + Send>>;

/// Counters of a keyed limiter, read with [`KeyedLimiter::metrics`].
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
    /// Quota fetches that failed (the key kept its last known quota).
    pub fetch_errors: u64,
}

#[derive(Default)]
struct Counters {
    // Evictions and refusals are counted per shard, under its write lock.
    fetches: AtomicU64,
    fetch_errors: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
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
        let mut book = HashMap::new();
        let failsafe = compile(&self.algorithm, &mut book, self.failsafe)?;
        let unknown = compile(&self.algorithm, &mut book, self.unknown)?;
        let refresh_ticks = meta::tick(crate::saturating_nanos(self.refresh)).max(1);
        Ok(KeyedLimiter {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| StripedRwLock::new(Shard::new(per_shard), owned, shared))
                    .collect(),
                shard_bits: shards.trailing_zeros(),
                hasher: foldhash::fast::RandomState::default(),
                book: Mutex::new(book),
                max_quotas: (self.capacity / 8).max(MIN_BOOKED_QUOTAS),
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

/// The fewest distinct quotas a limiter books: an eighth of its capacity, and at least this.
/// Booked quotas live as long as the limiter, so a source that hands out ever-new quota
/// values would grow the book without end; past the cap a new value is a fetch error (the
/// key keeps the quota it has, the error hook hears of it).
const MIN_BOOKED_QUOTAS: usize = 1024;

/// The book's compiled `quota`, compiled and booked on first use. Booked quotas are boxed and
/// never removed: entries point at them ([`LimitRef`]).
fn compile<A: Algorithm>(
    algorithm: &A,
    book: &mut HashMap<Quota, Box<Compiled<A>>>,
    quota: Quota,
) -> Result<LimitRef<A>, QuotaError> {
    if let Some(compiled) = book.get(&quota) {
        return Ok(LimitRef::to_booked(compiled));
    }
    let params = algorithm.params(&quota)?;
    let horizon = algorithm.horizon(&params);
    let compiled = book.entry(quota).or_insert(Box::new(Compiled {
        quota,
        params,
        horizon,
    }));
    Ok(LimitRef::to_booked(compiled))
}

/// Many independent limits by key, each with its own quota, in bounded memory.
///
/// Keys of type `K` are looked up by any borrowed form `Q` (`&str` for `String` keys).
/// Cloning the limiter is cheap and shares it.
///
/// **Quotas.** A key seen for the first time asks the [`QuotaSource`]; until the answer
/// arrives it is governed by the failsafe quota, and requests never wait for it. The quota is
/// fetched again every refresh period; a failed fetch keeps the last known quota and is
/// reported to the error hook. A key the source does not know gets the unknown-key quota (0
/// denies). A changed quota applies to the live state without resetting it, by the same rule
/// as [`crate::RateLimiter::set_quota`].
///
/// # Example
/// ```
/// use sluice::{FixedWindow, KeyedLimiter, StaticQuotas};
/// let limiter = KeyedLimiter::<u64, _>::builder(FixedWindow, "1/s".parse()?)
///     .unknown_key_quota("2/s".parse()?)
///     .build()?;
/// assert!(limiter.check(&7).is_allowed());
/// assert!(limiter.check(&7).is_allowed());
/// assert!(!limiter.check(&7).is_allowed());
/// assert!(limiter.check(&8).is_allowed());
/// assert_eq!(limiter.metrics().entries, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLimiter<K, A: Algorithm, S = StaticQuotas<K>, C = MonotonicClock> {
    inner: Arc<Inner<K, A, S, C>>,
}

impl<K, A: Algorithm, S, C> Clone for KeyedLimiter<K, A, S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K, A: Algorithm, S, C> fmt::Debug for KeyedLimiter<K, A, S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLimiter")
            .field("algorithm", &self.inner.algorithm.name())
            .field("shards", &self.inner.shards.len())
            .finish_non_exhaustive()
    }
}

struct Inner<K, A: Algorithm, S, C> {
    algorithm: A,
    clock: C,
    shards: Box<[StripedRwLock<Shard<K, A>>]>,
    shard_bits: u32,
    hasher: foldhash::fast::RandomState,
    /// Every quota compiled so far, shared by the keys that have it; entries point into it
    /// (see [`compile`]).
    book: Mutex<HashMap<Quota, Box<Compiled<A>>>>,
    /// The most distinct quotas booked (see [`MIN_BOOKED_QUOTAS`]).
    max_quotas: usize,
    failsafe: LimitRef<A>,
    unknown: LimitRef<A>,
    refresh_ticks: u64,
    first_fetch_wait: Option<Duration>,
    source: Option<S>,
    spawner: Option<Spawner>,
    on_fetch_error: Option<ErrorHook<K>>,
    counters: Counters,
}

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

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Checks a cost of 1 for `key`.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        unit_decision(self.check_n(key, 1))
    }

    /// Checks `cost` units for `key`, all or nothing (0 peeks), as
    /// [`crate::RateLimiter::check_n`] does.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] if the key's quota can never admit `cost`.
    #[inline]
    pub fn check_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.check_n_quoted(key, cost).0
    }

    /// Checks like [`check_n`](Self::check_n) and also says which quota the key was checked
    /// under (its own once fetched, else the failsafe or unknown-key quota): one lookup where
    /// `check_n` and then [`quota_of`](Self::quota_of) take two.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
    /// let quotas = StaticQuotas::from_iter([("alice".to_string(), "2/s".parse()?)]);
    /// let limiter = KeyedLimiter::builder(TokenBucket, "10/s".parse()?).source(quotas).build()?;
    /// let (decision, quota) = limiter.check_n_quoted("alice", 1);
    /// assert_eq!(decision?.remaining(), 1);
    /// assert_eq!(quota, "2/s".parse()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn check_n_quoted<Q>(&self, key: &Q, cost: u64) -> (Result<Decision, CheckError>, Quota)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let hash = self.inner.hasher.hash_one(key);
        match self.check_present(hash, key, cost) {
            Ok((result, quota)) => (result.map(|(decision, _)| decision), quota),
            Err(miss) => {
                let (result, limit) = self.check_slow(hash, key.to_owned().into(), cost, miss);
                (result, limit.quota)
            }
        }
    }

    /// The check of a key already stored, under the shard's read lock, with the receipt a
    /// refund needs; else why the slow path must take it.
    #[inline(always)]
    fn check_present<Q>(&self, hash: u64, key: &Q, cost: u64) -> Result<QuotedTake, Miss>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let inner = &*self.inner;
        let guard = inner.shard(hash).read();
        let Some(i) = guard.find(hash, key) else {
            // A new key: what the slow path will need is loaded on the way there.
            guard.prefetch_room(hash);
            return Err(Miss::Absent {
                inserts: guard.inserts,
            });
        };
        let entry = &guard.entries[i];
        let now = inner.clock.now();
        let since = entry.since_epoch(now);
        if since > entry.limit.horizon {
            return Err(Miss::Stale);
        }
        let seen = entry.touch();
        let limit = &entry.limit;
        let Some(result) = decide(
            &inner.algorithm,
            &limit.quota,
            &limit.params,
            &entry.state,
            since,
            cost,
        ) else {
            return Err(Miss::Stale);
        };
        let receipt = Receipt::new(since, entry.epoch);
        let refresh = inner.claim_refresh(entry, seen, now);
        let quota = limit.quota;
        drop(guard);
        if refresh {
            self.refresh(key.to_owned().into());
        }
        Ok((result.map(|decision| (decision, receipt)), quota))
    }

    /// Counters: entries held, evictions by reason, refusals, fetches and fetch errors.
    pub fn metrics(&self) -> KeyedMetrics {
        let inner = &*self.inner;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut metrics = KeyedMetrics {
            fetches: load(&inner.counters.fetches),
            fetch_errors: load(&inner.counters.fetch_errors),
            ..KeyedMetrics::default()
        };
        for shard in &inner.shards {
            let shard = shard.read();
            metrics.entries += shard.entries.len() as u64;
            metrics.evicted_idle += shard.evicted_idle;
            metrics.evicted_frequency += shard.evicted_frequency;
            metrics.refused += shard.refused;
        }
        metrics
    }

    /// The quota `key` is governed by now, if the key is held.
    pub fn quota_of<Q>(&self, key: &Q) -> Option<Quota>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.inner.hasher.hash_one(key);
        let guard = self.inner.shard(hash).read();
        guard.find(hash, key).map(|i| guard.entries[i].limit.quota)
    }

    /// Bytes of memory held by the store's tables (excluding what keys own on the heap).
    pub fn heap_bytes(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.heap_bytes() + s.read().heap_bytes())
            .sum()
    }

    /// Inserts the key, moves its epoch or finds it inserted meanwhile: under the write lock.
    #[cold]
    fn check_slow(&self, hash: u64, key: K, cost: u64, miss: Miss) -> Quoted<A> {
        let inner = &*self.inner;
        let mut now = inner.clock.now();
        let mut guard = inner.shard(hash).write();
        // Only an insert can bring the key in: with none since the miss, it is still absent.
        let unchanged = matches!(miss, Miss::Absent { inserts } if inserts == guard.inserts);
        if !unchanged && let Some(i) = guard.find(hash, &key) {
            return inner.decide_held(&mut guard.entries[i], now, cost);
        }
        // A source runs user code and may be waited for: never under the shard's lock. The
        // key may have come in meanwhile.
        let (limit, bits, pending) = if let Some(source) = &inner.source {
            let inserts = guard.inserts;
            drop(guard);
            let fetched = inner.first_fetch(source, &key, now);
            guard = inner.shard(hash).write();
            now = inner.clock.now();
            if guard.inserts != inserts
                && let Some(i) = guard.find(hash, &key)
            {
                return inner.decide_held(&mut guard.entries[i], now, cost);
            }
            fetched
        } else {
            // Without a source every key has the unknown-key quota, known at once.
            (inner.unknown, meta::with_fetched_at(meta::KNOWN, now), None)
        };
        let hash_of = |k: &K| inner.hasher.hash_one(k);
        let place = match guard.make_room(&inner.algorithm, hash, now, hash_of) {
            Room::Refused => {
                drop(guard);
                let scratch = Entry::new(&inner.algorithm, key, limit, now, bits);
                return inner.decide_on(&scratch, now, cost);
            }
            Room::Free => None,
            Room::Reused(i) => Some(i),
        };
        // The key is copied only when a fetch needs it too.
        let (stored, fetch) = match pending {
            Some(fetch) => (key.clone(), Some((key, fetch))),
            None => (key, None),
        };
        let entry = Entry::new(&inner.algorithm, stored, limit, now, bits | 1);
        let i = guard.insert(place, hash, entry, hash_of);
        let result = inner.decide_on(&guard.entries[i], now, cost);
        drop(guard);
        if let Some((key, fetch)) = fetch {
            self.spawn_fetch(key, fetch);
        }
        result
    }

    fn refresh(&self, key: K) {
        let Some(source) = &self.inner.source else { return };
        bump(&self.inner.counters.fetches);
        let mut fetch: PendingFetch = Box::pin(source.fetch(&key));
        match poll_once(&mut fetch) {
            Poll::Ready(result) => self.inner.apply(&key, result),
            Poll::Pending => self.spawn_fetch(key, fetch),
        }
    }

    fn spawn_fetch(&self, key: K, fetch: PendingFetch) {
        let Some(spawn) = &self.inner.spawner else {
            let error =
                FetchError::new("the quota source did not answer at once and no spawner is configured");
            self.inner.apply(&key, Err(error));
            return;
        };
        let inner: Weak<Inner<K, A, S, C>> = Arc::downgrade(&self.inner);
        let task = Box::pin(async move {
            let result = fetch.await;
            if let Some(inner) = inner.upgrade() {
                inner.apply(&key, result);
            }
        });
        spawn(task);
    }
}

fn poll_once<T>(future: &mut Pin<Box<dyn Future<Output = T> + Send>>) -> Poll<T> {
    future.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Drives `future` on this thread, parked between polls, until it is ready or `timeout`
/// (real time) has passed.
fn block_on_for<T>(future: &mut Pin<Box<dyn Future<Output = T> + Send>>, timeout: Duration) -> Option<T> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let deadline = std::time::Instant::now().checked_add(timeout);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut context) {
            return Some(value);
        }
        match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
            None => std::thread::park(),
        }
    }
}

impl<K, A, S, C> Inner<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    fn shard(&self, hash: u64) -> &StripedRwLock<Shard<K, A>> {
        // Shard by a remix of the hash: the table inside uses the hash's own low and top bits.
        let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let index = if self.shard_bits == 0 {
            0
        } else {
            (mixed >> (64 - self.shard_bits)) as usize
        };
        &self.shards[index]
    }

    /// Decides on a held entry under the write lock, moving its epoch first if time passed
    /// its horizon.
    fn decide_held(&self, entry: &mut Entry<K, A>, now: u64, cost: u64) -> Quoted<A> {
        if entry.since_epoch(now) > entry.limit.horizon {
            entry.replace_limit(&self.algorithm, entry.limit, now);
        }
        self.decide_on(entry, now, cost)
    }

    #[inline]
    fn decide_on(&self, entry: &Entry<K, A>, now: u64, cost: u64) -> Quoted<A> {
        let limit = &entry.limit;
        let since = entry.since_epoch(now).min(limit.horizon);
        // Under the write lock (or on a private entry) the state cannot be retired.
        let result = decide(
            &self.algorithm,
            &limit.quota,
            &limit.params,
            &entry.state,
            since,
            cost,
        )
        .unwrap_or(Ok(Decision::denied(limit.quota.capacity(), 0, 0, 1)));
        (result, *limit)
    }

    /// Whether this check should start a refresh, claiming it (so only one thread does).
    fn claim_refresh(&self, entry: &Entry<K, A>, seen: u64, now: u64) -> bool {
        if self.source.is_none() || seen & meta::FETCHING != 0 {
            return false;
        }
        let age = meta::tick(now).wrapping_sub(meta::fetched_at(seen)) & 0xFFFF_FFFF;
        age >= self.refresh_ticks
            && entry
                .meta
                .compare_exchange(seen, seen | meta::FETCHING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// The quota a new key starts with, its bookkeeping bits, and the fetch still running.
    fn first_fetch(&self, source: &S, key: &K, now: u64) -> (LimitRef<A>, u64, Option<PendingFetch>) {
        bump(&self.counters.fetches);
        let mut fetch: PendingFetch = Box::pin(source.fetch(key));
        let answer = match poll_once(&mut fetch) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => self
                .first_fetch_wait
                .and_then(|timeout| block_on_for(&mut fetch, timeout)),
        };
        match answer {
            Some(result) => match self.resolve(result) {
                Ok(limit) => (limit, meta::with_fetched_at(meta::KNOWN, now), None),
                Err(error) => {
                    self.apply_error(key, &error);
                    (self.failsafe, meta::with_fetched_at(0, now), None)
                }
            },
            None => (
                self.failsafe,
                meta::with_fetched_at(meta::FETCHING, now),
                Some(fetch),
            ),
        }
    }

    fn resolve(&self, result: FetchResult) -> Result<LimitRef<A>, FetchError> {
        match result? {
            None => Ok(self.unknown),
            Some(quota) => {
                let mut book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
                if book.len() >= self.max_quotas && !book.contains_key(&quota) {
                    return Err(FetchError::new(format!(
                        "quota {quota} not applied: the limiter already holds {} distinct quotas, its most",
                        book.len()
                    )));
                }
                Ok(compile(&self.algorithm, &mut book, quota)?)
            }
        }
    }

    /// Applies a finished fetch to the key, if it is still held.
    fn apply(&self, key: &K, result: FetchResult) {
        let now = self.clock.now();
        let resolved = self.resolve(result);
        if let Err(error) = &resolved {
            self.apply_error(key, error);
        }
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash).write();
        let Some(i) = guard.find(hash, key) else { return };
        let entry = &mut guard.entries[i];
        let seen = entry.meta.load(Ordering::Relaxed);
        let mut bits = meta::with_fetched_at(seen & !meta::FETCHING, now);
        if let Ok(limit) = resolved {
            bits |= meta::KNOWN;
            if !limit.same(&entry.limit) {
                entry.replace_limit(&self.algorithm, limit, now);
            }
        }
        entry.meta.store(bits, Ordering::Relaxed);
    }

    fn apply_error(&self, key: &K, error: &FetchError) {
        bump(&self.counters.fetch_errors);
        if let Some(hook) = &self.on_fetch_error {
            hook(key, error);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::{ManualClock, TokenBucket};

    /// Threads that meet the same new keys at once in a store far smaller than the keys, so
    /// that inserts keep evicting and reusing places: no key may be stored twice (the slow
    /// path skips its second lookup on the shards' insert counts, which must see every way a
    /// key comes in). Checked at the end over every entry; in debug builds `Shard::insert`
    /// also asserts it at each insert, which catches a duplicate before an eviction hides it.
    #[test]
    fn racing_inserts_into_a_full_store_never_store_a_key_twice() {
        const THREADS: u64 = 8;
        const KEYS: u64 = 5_000;
        const CAPACITY: usize = 256;
        let quota: Quota = "3/s".parse().unwrap();
        let clock = ManualClock::new(7);
        let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota)
            .unknown_key_quota(quota)
            .capacity(CAPACITY)
            .shards(2)
            .clock(clock.clone())
            .build()
            .unwrap();
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (limiter, clock) = (&limiter, &clock);
                scope.spawn(move || {
                    for step in 0..2 * KEYS {
                        // Time moves, so used entries go idle and are evicted too.
                        if step % 64 == 0 {
                            clock.advance(Duration::from_secs(1));
                        }
                        limiter.check(&((step + t * KEYS / THREADS) % KEYS));
                    }
                });
            }
        });
        let metrics = limiter.metrics();
        assert!(metrics.evicted_idle > 0, "the store evicted: {metrics:?}");
        let mut seen = HashSet::new();
        for shard in &limiter.inner.shards {
            for entry in &shard.read().entries {
                assert!(seen.insert(entry.key), "key {} stored twice", entry.key);
            }
        }
        assert!(seen.len() <= CAPACITY);
    }
}
