//! Moving every held key of a keyed limiter into another one built with other settings (its
//! capacity, failsafe or unknown-key quota, source...), so a reconfiguration keeps what each
//! key has consumed instead of starting afresh.

use std::hash::{BuildHasher, Hash};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::book::LimitRef;
use super::shard::{Entry, Room, meta};
use super::{Inner, KeyedLimiter, QuotaSource};
use crate::algorithm::succeed;
use crate::{Algorithm, Clock};

/// What [`KeyedLimiter::migrate_into`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migrated {
    /// Keys moved into the target with their consumption.
    pub moved: u64,
    /// Keys left behind: the target had no room for them, or held them already.
    pub dropped: u64,
}

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Moves every key this limiter holds, with what it has consumed, into `target`: a limiter
    /// of the same algorithm built with other settings, which then takes this one's place.
    ///
    /// Each key keeps its quota (booked in the target) if the source gave it one; a key on the
    /// failsafe or unknown-key quota takes the target's. Where that quota differs, the state is
    /// carried over by the quota change rule ([`Algorithm::carry_over`]: what still counts
    /// stays consumed, capped at the new capacity). Every moved key's quota is due to be
    /// fetched again from the target's source at its next check.
    ///
    /// If the target has less room than there are keys, keys whose consumption still counts
    /// go first and the rest are dropped (they start afresh); a key the target already holds
    /// keeps the target's state. Both are counted in [`Migrated::dropped`].
    ///
    /// Both limiters are locked whole while the keys move (a few hundred ns a key: a million
    /// `u64` keys took 0.3 s on a 2-core VM), so the move is exact: nothing admitted here
    /// before it is lost. Afterwards this limiter denies
    /// the moved keys: it is meant to be dropped once `target` is in use. Both must read the
    /// same clock (every [`crate::MonotonicClock`] does); moving two limiters into each other
    /// at the same time would deadlock. Migrating a limiter into itself does nothing.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket};
    /// let running = KeyedLimiter::<u64, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("2/min".parse()?)
    ///     .build()?;
    /// assert!(running.check(&7).is_allowed());
    /// assert!(running.check(&7).is_allowed());
    /// assert!(!running.check(&7).is_allowed());
    ///
    /// // Reconfigured: more keys, a larger unknown-key quota. Key 7 keeps its 2 units used.
    /// let next = KeyedLimiter::<u64, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("3/min".parse()?)
    ///     .capacity(1_000_000)
    ///     .build()?;
    /// let migrated = running.migrate_into(&next);
    /// assert_eq!((migrated.moved, migrated.dropped), (1, 0));
    /// assert!(next.check(&7).is_allowed());
    /// assert!(!next.check(&7).is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn migrate_into<S2, C2>(&self, target: &KeyedLimiter<K, A, S2, C2>) -> Migrated
    where
        S2: QuotaSource<K>,
        C2: Clock + 'static,
    {
        self.migrate_requoted(target, |_| None)
    }

    /// As [`migrate_into`](Self::migrate_into), for a caller that knows some keys' new quotas
    /// now: a key `quota_of` answers takes that quota in the target at once (its consumption
    /// carried over to it, and no refresh due), instead of keeping its old quota until its
    /// next check's refresh answers. Keys it does not answer move as `migrate_into` moves them.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
    /// let build = |q: &str| -> Result<_, Box<dyn std::error::Error>> {
    ///     Ok(KeyedLimiter::<u64, _>::builder(TokenBucket, "10/s".parse()?)
    ///         .source(StaticQuotas::from_iter([(7, q.parse()?)]))
    ///         .build()?)
    /// };
    /// let running = build("5/h")?;
    /// assert!(running.check_n(&7, 2)?.is_allowed());
    /// let next = build("3/h")?;
    /// let lowered = "3/h".parse()?;
    /// running.migrate_requoted(&next, |key| (*key == 7).then_some(lowered));
    /// // Its very next check is under 3/h, with the 2 units still used.
    /// let decision = next.check(&7);
    /// assert!(decision.is_allowed());
    /// assert_eq!(decision.remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn migrate_requoted<S2, C2>(
        &self,
        target: &KeyedLimiter<K, A, S2, C2>,
        quota_of: impl Fn(&K) -> Option<crate::Quota>,
    ) -> Migrated
    where
        S2: QuotaSource<K>,
        C2: Clock + 'static,
    {
        let (from, to) = (&*self.inner, &*target.inner);
        if std::ptr::addr_eq(Arc::as_ptr(&self.inner), Arc::as_ptr(&target.inner)) {
            return Migrated::default();
        }
        // Every shard of both, so no check on this limiter slips between a key's move and
        // the swap of limiters; shard locks are never nested elsewhere, so taking them all in
        // order cannot deadlock.
        let mut old: Vec<_> = from.shards.iter().map(|shard| shard.write()).collect();
        let mut new: Vec<_> = to.shards.iter().map(|shard| shard.write()).collect();
        let (old_now, new_now) = (from.clock.now(), to.clock.now());
        // A refresh is due at once: the target's source has the say on every key.
        let due = meta::due(new_now, to.refresh_after.unsigned_abs());
        let hash_of = |key: &K| to.hasher.hash_one(key);
        let mut done = Migrated::default();
        // Keys whose consumption still counts first, so a smaller target keeps those.
        for idle_pass in [false, true] {
            for shard in &mut old {
                for entry in shard.entries_mut() {
                    let hash = hash_of(&entry.key);
                    let place = &mut new[to.shard_index(hash)];
                    // Moved in the first pass, or held by the target before.
                    if place.find(hash, &entry.key).is_some() {
                        if !idle_pass {
                            done.dropped += 1;
                        }
                        continue;
                    }
                    // Not moved yet, so not retired: its idleness can be asked.
                    let since = entry.since_epoch(old_now).min(entry.limit.horizon);
                    if from.algorithm.is_idle(&entry.limit.params, &entry.state, since) != idle_pass {
                        continue;
                    }
                    if place.is_full() {
                        done.dropped += 1;
                        continue;
                    }
                    let bits = *entry.meta.get_mut();
                    let requoted =
                        quota_of(&entry.key).and_then(|quota| to.book.book(&to.algorithm, quota).ok());
                    let (limit, known, fetched) = match requoted {
                        // Answered now: as if fetched this instant.
                        Some(booked) => (booked, meta::KNOWN, new_now & !meta::LOW),
                        None => {
                            let (limit, known) = quota_in_target(from, to, entry.limit, bits);
                            (limit, known, due)
                        }
                    };
                    let (shift, state) = succeed(
                        &from.algorithm,
                        &entry.limit.params,
                        &entry.state,
                        &limit.params,
                        since,
                    );
                    let moved = Entry {
                        key: entry.key.clone(),
                        limit,
                        // The state's time ahead of now is kept; the target's clock is read as
                        // the same (or the state counts as younger: never over-admits).
                        epoch: new_now.saturating_sub(since.saturating_sub(shift)),
                        meta: AtomicU64::new((bits & meta::FREQUENCY).max(meta::ONE_USE) | known | fetched),
                        state,
                    };
                    place.insert(Room::Free, hash, moved, hash_of);
                    done.moved += 1;
                }
            }
        }
        // Newcomers decided on the old pool count against the new one.
        if let (Some(old_pool), Some(new_pool)) = (&from.pool, &to.pool) {
            new_pool.carry(new_now, old_pool.used(old_now));
        }
        done
    }
}

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Applies new quotas at once, in place, to the held keys `quota_of` answers: each keeps
    /// what it has consumed (the quota change rule: what still counts stays consumed, capped)
    /// and its quota counts as fetched now. Keys it does not answer keep theirs until their
    /// next refresh. Returns how many keys changed quota.
    ///
    /// Unlike [`migrate_requoted`](Self::migrate_requoted), nothing moves: one shard is locked
    /// at a time, so checks of keys in the other shards go on meanwhile, and a check of a key
    /// not yet reached is decided on its old quota. The limiter's source should answer the
    /// new quotas too, or the next refresh brings the old ones back.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket};
    /// let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("5/h".parse()?)
    ///     .build()?;
    /// assert!(limiter.check_n(&7, 2)?.is_allowed());
    /// let lowered = "3/h".parse()?;
    /// assert_eq!(limiter.requote(|key| (*key == 7).then_some(lowered)), 1);
    /// let decision = limiter.check(&7);
    /// assert!(decision.is_allowed());
    /// assert_eq!(decision.remaining(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn requote(&self, quota_of: impl Fn(&K) -> Option<crate::Quota>) -> u64 {
        let inner = &*self.inner;
        let mut changed = 0;
        for shard in &inner.shards {
            let mut guard = shard.write();
            let now = inner.clock.now();
            for entry in guard.entries_mut() {
                let Some(quota) = quota_of(&entry.key) else {
                    continue;
                };
                // A book that is full keeps the key on its quota until its next refresh.
                let Ok(limit) = inner.book.book(&inner.algorithm, quota) else {
                    continue;
                };
                if !limit.same(&entry.limit) {
                    entry.replace_limit(&inner.algorithm, limit, now);
                    changed += 1;
                }
                let bits = entry.meta.get_mut();
                *bits = meta::with_fetched_at(*bits, now) | meta::KNOWN;
            }
        }
        changed
    }
}

/// The quota a key held on `limit` has in the target, and whether it is the source's answer
/// ([`meta::KNOWN`]) or a stand-in until it comes.
fn quota_in_target<K, A: Algorithm, S, C, S2, C2>(
    from: &Inner<K, A, S, C>,
    to: &Inner<K, A, S2, C2>,
    limit: LimitRef<A>,
    bits: u64,
) -> (LimitRef<A>, u64) {
    if to.source.is_none() {
        // Without a source every key has the unknown-key quota.
        return (to.unknown, meta::KNOWN);
    }
    if bits & meta::KNOWN == 0 {
        // Still on the failsafe quota (first fetch pending or failed).
        return (to.failsafe, 0);
    }
    if limit.same(&from.unknown) {
        return (to.unknown, meta::KNOWN);
    }
    match to.book.book(&to.algorithm, limit.quota) {
        Ok(booked) => (booked, meta::KNOWN),
        // The target's book is full or its algorithm cannot hold the quota: a stand-in until
        // the due refresh answers.
        Err(_) => (to.failsafe, 0),
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    use super::*;
    use crate::{FetchResult, FixedWindow, ManualClock, Quota, SlidingWindowLog, StaticQuotas, TokenBucket};

    fn quota(text: &str) -> Quota {
        text.parse().unwrap()
    }

    /// A source that never answers: keys stay on the failsafe quota.
    struct Silent;
    impl QuotaSource<u64> for Silent {
        fn fetch(&self, _: &u64) -> impl Future<Output = FetchResult> + Send + 'static {
            std::future::pending()
        }
    }

    #[test]
    fn a_key_on_the_failsafe_quota_takes_the_new_failsafe_with_its_consumption() {
        let clock = ManualClock::new(1_000);
        let build = |failsafe: &str| {
            KeyedLimiter::<u64, _>::builder(TokenBucket, quota(failsafe))
                .source(Silent)
                .spawner(drop)
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let running = build("5/h");
        assert!(running.check_n(&1, 4).unwrap().is_allowed());
        let next = build("3/h");
        assert_eq!(running.migrate_into(&next).moved, 1);
        // 4 used, capped at the new capacity of 3: denied, and on the new failsafe.
        let d = next.check(&1);
        assert!(!d.is_allowed(), "{d:?}");
        assert_eq!(next.quota_of(&1), Some(quota("3/h")));
        // The running limiter no longer admits the moved key.
        assert!(!running.check(&1).is_allowed());
    }

    #[test]
    fn known_quotas_stay_and_a_refresh_is_due_at_once() {
        let clock = ManualClock::new(0);
        let quotas = || StaticQuotas::from_iter([(1, quota("2/h"))]);
        let running = KeyedLimiter::<u64, _>::builder(FixedWindow, quota("10/s"))
            .source(quotas())
            .clock(clock.clone())
            .build()
            .unwrap();
        assert!(running.check(&1).is_allowed());
        // The new source gives key 1 another quota, applied at its next check after it.
        let next = KeyedLimiter::<u64, _>::builder(FixedWindow, quota("10/s"))
            .source(StaticQuotas::from_iter([(1, quota("1/h"))]))
            .refresh_every(Duration::from_secs(3600))
            .clock(clock.clone())
            .build()
            .unwrap();
        let fetches = next.metrics().fetches;
        running.migrate_into(&next);
        assert_eq!(next.quota_of(&1), Some(quota("2/h")));
        // Decided on the quota it came with, then refreshed.
        assert!(next.check(&1).is_allowed());
        assert_eq!(next.metrics().fetches, fetches + 1, "refreshed at once");
        assert_eq!(next.quota_of(&1), Some(quota("1/h")));
        // 1 used, capped at 1: denied.
        assert!(!next.check(&1).is_allowed());
    }

    #[test]
    fn a_requoted_key_is_decided_on_its_new_quota_at_once_and_no_refresh_is_due() {
        let clock = ManualClock::new(0);
        let build = |one: &str| {
            KeyedLimiter::<u64, _>::builder(FixedWindow, quota("10/s"))
                .source(StaticQuotas::from_iter([(1, quota(one)), (2, quota(one))]))
                .refresh_every(Duration::from_secs(3600))
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let running = build("3/h");
        for key in [1, 2] {
            assert!(running.check_n(&key, 2).unwrap().is_allowed());
        }
        let next = build("2/h");
        let fetches = next.metrics().fetches;
        // Key 1 is answered now; key 2 waits for its refresh.
        let migrated = running.migrate_requoted(&next, |key| (*key == 1).then(|| quota("2/h")));
        assert_eq!(migrated.moved, 2);
        assert_eq!(next.quota_of(&1), Some(quota("2/h")));
        assert_eq!(next.quota_of(&2), Some(quota("3/h")));
        // 2 used of 2: key 1 is denied on its first check, with no fetch.
        assert!(!next.check(&1).is_allowed());
        assert_eq!(next.metrics().fetches, fetches, "no refresh for a requoted key");
        // Key 2 is decided on its old quota once (1 left of 3), then refreshed.
        assert!(next.check(&2).is_allowed());
        assert_eq!(next.metrics().fetches, fetches + 1);
        assert!(!next.check(&2).is_allowed());
    }

    /// Requoting in place decides every key as moving it under the new quota does.
    fn requote_matches_migrate<A: Algorithm + Copy>(algorithm: A) {
        let clock = ManualClock::new(1_000_000_000);
        let build = || {
            KeyedLimiter::<u64, _>::builder(algorithm, quota("10/s"))
                .source(StaticQuotas::from_iter((0..64).map(|k| (k, quota("20/min")))))
                .refresh_every(Duration::from_secs(3600))
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let (in_place, moved) = (build(), build());
        for key in 0..64u64 {
            // Consumption 0..=19, some of it 1..10 s old.
            for _ in 0..key % 20 {
                assert!(in_place.check(&key).is_allowed());
                assert!(moved.check(&key).is_allowed());
            }
            clock.advance(Duration::from_millis(150));
        }
        let lower = |key: &u64| {
            (!key.is_multiple_of(3)).then(|| quota(if key.is_multiple_of(2) { "7/min" } else { "30/min" }))
        };
        let target = build();
        moved.migrate_requoted(&target, lower);
        let changed = in_place.requote(lower);
        // Held (checked at least once) and answered.
        assert_eq!(
            changed,
            (0..64).filter(|k| k % 3 != 0 && k % 20 != 0).count() as u64
        );
        for key in 0..64u64 {
            assert_eq!(in_place.quota_of(&key), target.quota_of(&key), "key {key}");
            for _ in 0..4 {
                let (a, b) = (in_place.check(&key), target.check(&key));
                assert_eq!(
                    (a.is_allowed(), a.remaining(), a.limit()),
                    (b.is_allowed(), b.remaining(), b.limit()),
                    "key {key}"
                );
            }
        }
    }

    #[test]
    fn requoting_in_place_decides_as_moving_does() {
        requote_matches_migrate(TokenBucket);
        requote_matches_migrate(FixedWindow);
        requote_matches_migrate(SlidingWindowLog);
    }

    #[test]
    fn a_smaller_target_keeps_the_keys_with_consumption_first() {
        let clock = ManualClock::new(0);
        let build = |capacity: usize| {
            KeyedLimiter::<u64, _>::builder(SlidingWindowLog, quota("1/s"))
                .unknown_key_quota(quota("3/h"))
                .capacity(capacity)
                .shards(1)
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let running = build(64);
        // Keys 0..40 used once a long time ago (idle now), keys 40..48 used just now.
        for key in 0..40 {
            assert!(running.check(&key).is_allowed());
        }
        clock.advance(Duration::from_secs(7200));
        for key in 40..48 {
            assert!(running.check(&key).is_allowed());
        }
        let next = build(10);
        let migrated = running.migrate_into(&next);
        assert_eq!((migrated.moved, migrated.dropped), (10, 38));
        for key in 40..48 {
            assert_eq!(next.check_n(&key, 0).unwrap().remaining(), 2, "key {key}");
        }
    }

    #[test]
    fn into_itself_does_nothing_and_a_held_key_keeps_the_target_state() {
        let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("1/s"))
            .unknown_key_quota(quota("3/h"))
            .build()
            .unwrap();
        assert!(limiter.check(&1).is_allowed());
        assert_eq!(limiter.migrate_into(&limiter.clone()), Migrated::default());
        assert_eq!(limiter.check_n(&1, 0).unwrap().remaining(), 2);

        let other = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("1/s"))
            .unknown_key_quota(quota("3/h"))
            .build()
            .unwrap();
        let migrated = limiter.migrate_into(&other);
        assert_eq!((migrated.moved, migrated.dropped), (1, 0));
        let again = KeyedLimiter::<u64, _>::builder(TokenBucket, quota("1/s"))
            .unknown_key_quota(quota("3/h"))
            .build()
            .unwrap();
        assert!(again.check_n(&1, 3).unwrap().is_allowed());
        let migrated = other.migrate_into(&again);
        assert_eq!((migrated.moved, migrated.dropped), (0, 1));
        assert_eq!(again.check_n(&1, 0).unwrap().remaining(), 0);
    }

    #[test]
    fn the_pool_in_use_stays_in_use() {
        let clock = ManualClock::new(1_000);
        let build = |pool: &str| {
            KeyedLimiter::<u64, _>::builder(TokenBucket, quota("5/h"))
                .failsafe_pool(quota(pool))
                .source(Silent)
                .spawner(drop)
                .clock(clock.clone())
                .build()
                .unwrap()
        };
        let running = build("5/h");
        // Four newcomers on the failsafe quota: four units of the pool.
        for key in 0..4 {
            assert!(running.check(&key).is_allowed(), "key {key}");
        }
        let next = build("6/h");
        running.migrate_into(&next);
        // Two of the larger pool left.
        assert!(next.check(&10).is_allowed());
        assert!(next.check(&11).is_allowed());
        assert!(!next.check(&12).is_allowed());
    }
}
