//! The two check paths: a key already held, under its shard's read lock; and the slow path
//! under the write lock, which stores a new key or moves a key's epoch.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use super::book::LimitRef;
use super::shard::{Entry, Room, meta};
use super::{Inner, KeyedLimiter, QuotaSource, ShardLock};
use crate::chain::Receipt;
use crate::limiter::decide;
use crate::{Algorithm, CheckError, Clock, Decision};

/// A check's answer, the limit it was decided under (its quota read only if wanted: copying
/// one out of a call costs more than the pointer), and what a refund of it needs.
pub(crate) struct Checked<A: Algorithm> {
    pub(crate) result: Result<Decision, CheckError>,
    pub(crate) limit: LimitRef<A>,
    pub(crate) receipt: Receipt,
}

/// Why a check left the read-locked path for the slow one.
#[derive(Clone, Copy)]
enum Miss {
    /// The key was not stored when the shard had seen this many inserts.
    Absent { inserts: u64 },
    /// The key's state must move to a new epoch, or was retired meanwhile.
    Stale,
    /// The key is on the failsafe quota under a pool: checked on the pool too.
    Pooled,
}

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Checks `cost` for `key` on whichever path it needs, and answers what `answer` takes out
    /// of the check. Taken out in each path, before they meet: a whole `Checked` carried out
    /// of both would be copied through memory (the slow path returns it there), about 20
    /// instructions a check (`bench/keyed-icount.sh`).
    #[inline(always)]
    pub(crate) fn check_key<Q, R>(&self, key: &Q, cost: u64, answer: impl Fn(Checked<A>) -> R) -> R
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let hash = self.inner.hasher.hash_one(key);
        // Found once: every path below works in this shard.
        let shard = self.inner.shard(hash);
        match self.check_present(shard, hash, key, cost) {
            Ok(checked) => answer(checked),
            Err(Miss::Pooled) => answer(self.check_pooled(shard, hash, key, cost)),
            Err(miss) => answer(self.check_slow(shard, hash, key.to_owned().into(), cost, miss)),
        }
    }

    /// The check of a key already stored, under the shard's read lock; else why the slow path
    /// must take it.
    #[inline(always)]
    fn check_present<Q>(
        &self,
        shard: &ShardLock<K, A>,
        hash: u64,
        key: &Q,
        cost: u64,
    ) -> Result<Checked<A>, Miss>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let inner = &*self.inner;
        let guard = shard.read();
        let Some(entry) = guard.get(hash, key) else {
            // A new key: what the slow path will need is loaded on the way there.
            guard.prefetch_room(hash);
            return Err(Miss::Absent {
                inserts: guard.inserts,
            });
        };
        let now = inner.clock.now();
        let since = entry.since_epoch(now);
        // Past the horizon, or pooled (a separate path, so the hot one pays one comparison).
        if since >= entry.limit.divert {
            return Err(if entry.limit.pooled {
                Miss::Pooled
            } else {
                Miss::Stale
            });
        }
        let seen = entry.touch();
        let limit = entry.limit;
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
        let receipt = Receipt::new(since, entry.tag(seen));
        let refresh = inner.claim_refresh(entry, seen, now);
        drop(guard);
        if let Some(slot) = refresh {
            self.refresh(key.to_owned().into(), slot);
        }
        Ok(Checked {
            result,
            limit,
            receipt,
        })
    }

    /// A held key on the failsafe quota under a pool: checked, still under the read lock, on
    /// its own state and then on the pool. Looked up again (the key is not copied: it is held);
    /// gone, or past its horizon, it takes the slow path.
    #[cold]
    #[inline(never)]
    fn check_pooled<Q>(&self, shard: &ShardLock<K, A>, hash: u64, key: &Q, cost: u64) -> Checked<A>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let inner = &*self.inner;
        let guard = shard.read();
        let Some(entry) = guard.get(hash, key) else {
            let miss = Miss::Absent {
                inserts: guard.inserts,
            };
            drop(guard);
            return self.check_slow(shard, hash, key.to_owned().into(), cost, miss);
        };
        let now = inner.clock.now();
        let since = entry.since_epoch(now);
        let limit = entry.limit;
        // Its generation changes only under the write lock: stable while this guard is held.
        let tag = entry.tag(entry.meta.load(Ordering::Relaxed));
        let checked = if since > limit.horizon {
            None
        } else if limit.pooled {
            inner.decide_pooled(limit, &entry.state, tag, since, now, cost)
        } else {
            // Fetched meanwhile: its own quota, no pool.
            let result = decide(
                &inner.algorithm,
                &limit.quota,
                &limit.params,
                &entry.state,
                since,
                cost,
            );
            result.map(|result| Checked {
                result,
                limit,
                receipt: Receipt::new(since, tag),
            })
        };
        let Some(checked) = checked else {
            drop(guard);
            return self.check_slow(shard, hash, key.to_owned().into(), cost, Miss::Stale);
        };
        let seen = entry.touch();
        let refresh = inner.claim_refresh(entry, seen, now);
        drop(guard);
        if let Some(slot) = refresh {
            self.refresh(key.to_owned().into(), slot);
        }
        checked
    }

    /// Inserts the key, moves its epoch or finds it inserted meanwhile: under the write lock.
    #[cold]
    fn check_slow(&self, shard: &ShardLock<K, A>, hash: u64, key: K, cost: u64, miss: Miss) -> Checked<A> {
        let inner = &*self.inner;
        let mut now = inner.clock.now();
        let mut guard = shard.write();
        // Only an insert can bring the key in: with none since the miss, it is still absent.
        let unchanged = matches!(miss, Miss::Absent { inserts } if inserts == guard.inserts);
        if !unchanged && let Some(entry) = guard.get_mut(hash, &key) {
            return inner.decide_held(entry, now, cost);
        }
        // A source runs user code and may be waited for: never under the shard's lock. The
        // key may have come in meanwhile.
        let (limit, bits, pending) = if let Some(source) = &inner.source {
            let inserts = guard.inserts;
            drop(guard);
            let fetched = inner.first_fetch(source, &key, now);
            guard = shard.write();
            now = inner.clock.now();
            if guard.inserts != inserts
                && let Some(entry) = guard.get_mut(hash, &key)
            {
                return inner.decide_held(entry, now, cost);
            }
            fetched
        } else {
            // Without a source every key has the unknown-key quota, known at once.
            (inner.unknown, meta::with_fetched_at(meta::KNOWN, now), None)
        };
        let hash_of = |k: &K| inner.hasher.hash_one(k);
        let room = guard.make_room(&inner.algorithm, hash, now, hash_of);
        if let Room::Refused = room {
            drop(guard);
            // Its fetch, if running, is dropped with it: there is nothing to apply it to.
            return inner.decide_apart(key, limit, bits, now, cost);
        }
        let entry = Entry::new(&inner.algorithm, key, limit, now, bits | meta::ONE_USE);
        let checked = inner.decide_on(guard.insert(room, hash, entry, hash_of), now, cost);
        drop(guard);
        if let Some(pending) = pending {
            self.spawn_fetch(*pending);
        }
        checked
    }
}

impl<K, A: Algorithm, S, C> Inner<K, A, S, C> {
    /// Decides on a held entry under the write lock, moving its epoch first if time passed
    /// its horizon.
    fn decide_held(&self, entry: &mut Entry<K, A>, now: u64, cost: u64) -> Checked<A> {
        if entry.since_epoch(now) > entry.limit.horizon {
            entry.replace_limit(&self.algorithm, entry.limit, now);
        }
        self.decide_on(entry, now, cost)
    }

    /// Decides on a key the store refused: on a fresh state and, whatever its quota, on the
    /// pool.
    #[cold]
    #[inline(never)]
    fn decide_apart(&self, key: K, limit: LimitRef<A>, bits: u64, now: u64, cost: u64) -> Checked<A> {
        let scratch = Entry::new(&self.algorithm, key, limit, now, bits);
        // A fresh state is never retired. (Its receipt's name is dropped below.)
        let checked = self
            .decide_pooled(limit, &scratch.state, 0, 0, now, cost)
            .unwrap_or_else(|| self.retired(limit));
        // Nothing was stored, so nothing can be given back.
        Checked {
            receipt: Receipt::NOTHING,
            ..checked
        }
    }

    /// Decides on `entry`; a pooled one on the pool too.
    #[inline(always)]
    fn decide_on(&self, entry: &Entry<K, A>, now: u64, cost: u64) -> Checked<A> {
        let limit = entry.limit;
        let since = entry.since_epoch(now).min(limit.horizon);
        // Tested before deciding, so that the common path builds its answer where it returns
        // it (carrying one through the pool's call costs it about 30 instructions).
        let tag = entry.tag(entry.meta.load(Ordering::Relaxed));
        if limit.pooled {
            return self
                .decide_pooled(limit, &entry.state, tag, since, now, cost)
                .unwrap_or_else(|| self.retired(limit));
        }
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
        Checked {
            result,
            limit,
            receipt: Receipt::new(since, tag),
        }
    }

    /// The answer for a state found retired where none can be (see `decide_on`).
    #[cold]
    fn retired(&self, limit: LimitRef<A>) -> Checked<A> {
        Checked {
            result: Ok(Decision::denied(limit.quota.capacity(), 0, 0, 1)),
            limit,
            receipt: Receipt::NOTHING,
        }
    }

    /// Decides `cost` on a state of `limit` at `since` past its epoch, and then on the failsafe
    /// pool; `None` if the state was retired. `tag` is the state's name (`Entry::tag`), which
    /// the receipt carries: the epoch alone would not tell the states of one entry apart.
    #[cold]
    #[inline(never)]
    fn decide_pooled(
        &self,
        limit: LimitRef<A>,
        state: &A::State,
        tag: u64,
        since: u64,
        now: u64,
        cost: u64,
    ) -> Option<Checked<A>> {
        let result = decide(&self.algorithm, &limit.quota, &limit.params, state, since, cost)?;
        let checked = Checked {
            result,
            limit,
            receipt: Receipt::new(since, tag),
        };
        Some(self.through_pool(checked, state, now, cost))
    }

    /// Takes what `checked` admitted from the failsafe pool as well, if there is one. With
    /// the pool spent, the key gets the unknown-key answer: denied, under the unknown-key
    /// quota, with the pool's retry-after; what the check took from `state` is given back.
    fn through_pool(&self, checked: Checked<A>, state: &A::State, now: u64, cost: u64) -> Checked<A> {
        let Some(pool) = &self.pool else {
            return checked;
        };
        if cost == 0 || !matches!(&checked.result, Ok(decision) if decision.is_allowed()) {
            return checked;
        }
        let retry_after = match pool.take(now, cost) {
            Ok(decision) if decision.is_allowed() => return checked,
            Ok(decision) => decision.retry_after_nanos(),
            // More than the whole pool: not before it is full again.
            Err(_) => pool.quota().fill_time_nanos(),
        };
        let limit = checked.limit;
        self.algorithm
            .refund(&limit.params, state, checked.receipt.at(), cost);
        let unknown = self.unknown;
        Checked {
            result: Ok(Decision::denied(unknown.quota.capacity(), 0, 0, retry_after)),
            limit: unknown,
            receipt: Receipt::NOTHING,
        }
    }
}
