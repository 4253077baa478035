//! The keyed limiter: one limit per key (account, API key, IP...), each with its own quota
//! from a [`QuotaSource`], in bounded memory, without a global lock.
//!
//! Keys live in shards (a power of two, several per core), each a read-write lock over a table
//! of entries found by hash. Checking a key that is present takes only the shard's
//! *read* lock and allocates nothing; the limit itself is decided by the algorithm's atomic
//! state. Inserting a key, applying a fetched quota or evicting takes that one shard's write
//! lock.
//!
//! Memory is bounded by a capacity in entries. When a shard is full, a newcomer makes room by
//! evicting one entry of a small sample taken round the shard:
//! - an idle entry (a full bucket, an expired window) not used since it was stored: a key in
//!   use also holds its fetched quota, so it is not dropped merely for being idle;
//! - else the least frequently used, but only if the newcomer has been seen more often (TinyLFU
//!   admission, with a count-min sketch of recent keys).
//!
//! So a flood of one-shot keys cannot push out keys in use; a refused newcomer is decided on a
//! fresh state and on the failsafe pool (if any), and not stored.
//!
//! The files: `builder.rs` (settings), `book.rs` (compiled quotas), `check.rs` (the two check
//! paths), `charge.rs` (costs charged after the fact), `fetch.rs` (quota fetches) and `timer.rs` (their deadlines), `pool.rs` (the failsafe
//! pool), `migrate.rs` (moving held keys into a limiter built with other settings),
//! `refund.rs` (takes and refunds for chains), `shard.rs`, `table.rs`, `pages.rs`, `lock.rs` and
//! `sketch.rs` (the store), `metrics.rs`, `source.rs`.

mod book;
mod builder;
mod charge;
mod check;
mod fetch;
mod lock;
mod metrics;
mod migrate;
mod pages;
mod pool;
mod refund;
mod shard;
mod sketch;
mod source;
mod table;
mod timer;

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::time::Duration;

use book::{LimitRef, QuotaBook};
pub use builder::{
    DEFAULT_CAPACITY, DEFAULT_FETCH_TIMEOUT, DEFAULT_MAX_FETCHES, DEFAULT_REFRESH, KeyedBuildError,
    KeyedBuilder, MAX_REFRESH,
};
use fetch::{ErrorHook, FetchPlaces};
pub use fetch::{Spawner, Task};
use lock::StripedRwLock;
pub use metrics::KeyedMetrics;
use metrics::LimiterCounts;
pub use migrate::Migrated;
use pool::Pool;
use shard::Shard;
pub use source::{FetchError, FetchResult, FnSource, QuotaSource, StaticQuotas};

use crate::limiter::unit_decision;
use crate::{Algorithm, CheckError, Clock, Decision, MonotonicClock, Quota};

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
/// **Cold starts.** A failsafe pool ([`KeyedBuilder::failsafe_pool`]) bounds what all keys on
/// the failsafe quota, and all keys the store cannot hold, are admitted together, so a flood
/// of new keys costs at most the pool. A fetch that panics or outlives the fetch timeout
/// ([`KeyedBuilder::fetch_timeout`]) is a failed fetch; fetches in flight are bounded
/// ([`KeyedBuilder::max_fetches_in_flight`]).
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

/// One shard behind its lock.
pub(crate) type ShardLock<K, A> = StripedRwLock<Shard<K, A>>;

pub(crate) struct Inner<K, A: Algorithm, S, C> {
    pub(crate) algorithm: A,
    pub(crate) clock: C,
    pub(crate) shards: Box<[ShardLock<K, A>]>,
    pub(crate) shard_bits: u32,
    pub(crate) hasher: KeyHashState,
    /// Every quota compiled so far, shared by the keys that have it; entries point into it.
    pub(crate) book: QuotaBook<A>,
    pub(crate) failsafe: LimitRef<A>,
    pub(crate) unknown: LimitRef<A>,
    /// The age (ns, a multiple of 2^20) at which a key's quota is fetched again.
    pub(crate) refresh_after: i64,
    pub(crate) first_fetch_wait: Option<Duration>,
    /// The failsafe pool, if one was asked for (then `failsafe` is pooled).
    pub(crate) pool: Option<Pool>,
    /// The places for fetches in flight.
    pub(crate) slots: Arc<FetchPlaces>,
    pub(crate) fetch_timeout: Duration,
    pub(crate) source: Option<S>,
    pub(crate) spawner: Option<Spawner>,
    pub(crate) on_fetch_error: Option<ErrorHook<K>>,
    pub(crate) counters: LimiterCounts,
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
        self.check_key(key, cost, |checked| checked.result)
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
        self.check_key(key, cost, |checked| (checked.result, checked.limit.quota))
    }

    /// The quota `key` is governed by, counting nothing against it: its own once fetched,
    /// else the failsafe or unknown-key quota. A new key is stored and its fetch started, as
    /// a check would; for a store that only holds quotas, use the [`crate::Unmetered`]
    /// algorithm.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, StaticQuotas, Unmetered};
    /// let quotas = StaticQuotas::from_iter([("alice".to_string(), "2/s".parse()?)]);
    /// let book = KeyedLimiter::builder(Unmetered, "10/s".parse()?).source(quotas).build()?;
    /// assert_eq!(book.resolve_quota("alice"), "2/s".parse()?);
    /// assert!(book.resolve_quota("mallory").is_deny_all()); // the unknown-key quota
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn resolve_quota<Q>(&self, key: &Q) -> Quota
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.check_key(key, 0, |checked| checked.limit.quota)
    }

    /// Counters: entries held, evictions by reason, refusals, fetches, their faults and those
    /// in flight.
    pub fn metrics(&self) -> KeyedMetrics {
        let mut metrics = self.inner.counters.read();
        metrics.fetches_in_flight = self.inner.slots.in_flight();
        if let Some(pool) = &self.inner.pool {
            metrics.pool_used = pool.used(self.inner.clock.now());
            metrics.pool_capacity = pool.quota().capacity();
        }
        for shard in &self.inner.shards {
            let shard = shard.read();
            metrics.entries += shard.len() as u64;
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
        guard.get(hash, key).map(|entry| entry.limit.quota)
    }

    /// Bytes of memory held by the store's tables (excluding what keys own on the heap).
    pub fn heap_bytes(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.heap_bytes() + s.read().heap_bytes())
            .sum()
    }
}

impl<K, A: Algorithm, S, C> Inner<K, A, S, C> {
    #[inline]
    pub(crate) fn shard(&self, hash: u64) -> &ShardLock<K, A> {
        &self.shards[self.shard_index(hash)]
    }

    /// The position of the shard holding keys of `hash`.
    #[inline(always)]
    pub(crate) fn shard_index(&self, hash: u64) -> usize {
        // Shard by a remix of the hash: the table inside uses the hash's own low and top bits.
        let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // The top `shard_bits` bits, in two shifts so that none is by 64 (one shard: 0).
        ((mixed >> 1) >> (63 - self.shard_bits)) as usize
    }
}

/// How keys are hashed: foldhash's quality hasher, its fast one with a final multiply. The
/// fast one alone, whose top bits pick a key's place, put consecutive numbers on a few long
/// runs of the table for about one process seed in sixty.
pub(crate) type KeyHashState = foldhash::quality::RandomState;

/// A hasher of [`KeyHashState`]'s kind on given seeds, for tests that try many.
#[cfg(test)]
pub(crate) fn seeded_key_hasher(
    seed: u64,
    shared: &foldhash::SharedSeed,
) -> foldhash::quality::FoldHasher<'_> {
    foldhash::quality::FoldHasher::with_seed(seed, shared)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::{ManualClock, TokenBucket};

    /// New keys that keep evicting idle ones leave the table's runs short. (An eviction sample
    /// taken at a hand sweeping the table let the back-shift of each removal move the run
    /// behind it past the hand: runs grew to half the table, and a new key cost microseconds.)
    #[test]
    fn churn_through_a_full_store_keeps_probe_runs_short() {
        const CAPACITY: usize = 4096;
        let quota: Quota = "1000/s".parse().unwrap();
        let clock = ManualClock::new(0);
        let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota)
            .unknown_key_quota(quota)
            .capacity(CAPACITY)
            .shards(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        for key in 0..200_000u64 {
            // One unit at 1000/s comes back in 1 ms: every entry is idle by the next key.
            clock.advance(Duration::from_millis(1));
            assert!(limiter.check(&key).is_allowed());
        }
        let metrics = limiter.metrics();
        assert_eq!(metrics.entries, CAPACITY as u64);
        assert!(metrics.evicted_idle > 190_000, "{metrics:?}");
        let (longest, slots) = limiter.inner.shards[0].read().longest_run();
        // Linear probing 4/5 full leaves runs of up to about 300 of these 5 120 places with a
        // random hash (a run of the old kind was half the table).
        assert!(longest * 8 < slots, "a run of {longest} places in {slots}");
    }

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
                        let _ = limiter.check(&((step + t * KEYS / THREADS) % KEYS));
                    }
                });
            }
        });
        let metrics = limiter.metrics();
        assert!(metrics.evicted_idle > 0, "the store evicted: {metrics:?}");
        let mut seen = HashSet::new();
        for shard in &limiter.inner.shards {
            for entry in shard.read().entries() {
                assert!(seen.insert(entry.key), "key {} stored twice", entry.key);
            }
        }
        assert!(seen.len() <= CAPACITY);
    }
}
