//! Charges: a key's cost consumed after the fact, whatever is left (see
//! [`crate::RateLimiter::charge_n`]).
//!
//! Kept apart from the check paths: a charge follows a check of the same key, so the key is
//! almost always held and is charged under its shard's read lock; otherwise a peek (a check
//! of nothing) stores it or moves its epoch, exactly as a check would, and the charge is taken
//! then. The checks pay nothing for charges existing.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use super::{KeyedLimiter, QuotaSource};
use crate::{Algorithm, Charge, Clock};

/// Peeks that may precede a charge: each stores the key or moves its epoch, so a second try
/// finds it held but for an eviction or a quota change in between.
const TRIES: usize = 3;

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Consumes `cost` for `key` whatever is left, down to the key's quota's floor, as
    /// [`crate::RateLimiter::charge_n`] does: for costs known only once the request was
    /// served. A key on the failsafe quota charges the failsafe pool too.
    ///
    /// A key the store will not hold (full of keys used more often) is decided apart at each
    /// check and has no state to charge: the charge then takes only from the failsafe pool, if
    /// there is one, and reports what the pool took.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, ManualClock, TokenBucket};
    /// let every_key = "10/s".parse()?;
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, every_key)
    ///     .unknown_key_quota(every_key)
    ///     .clock(ManualClock::new(0))
    ///     .build()?;
    /// assert!(limiter.check("alice").is_allowed());
    /// let charge = limiter.charge_n("alice", 30); // 9 left, 10 below empty at most
    /// assert_eq!((charge.charged(), charge.balance()), (19, -10));
    /// assert!(!limiter.check("alice").is_allowed());
    /// assert!(limiter.check("bob").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_n<Q>(&self, key: &Q, cost: u64) -> Charge
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        let mut peek = None;
        for _ in 0..TRIES {
            if let Some(charge) = self.charge_held(key, cost) {
                return charge;
            }
            peek = Some(self.check_key(key, 0, |checked| checked.result));
        }
        let inner = &*self.inner;
        if let Some(pool) = &inner.pool {
            return pool.charge(inner.clock.now(), cost);
        }
        // No state and no pool: nothing to take from. A peek cannot err.
        let decision = match peek {
            Some(Ok(decision)) => decision,
            _ => crate::Decision::allowed(0, 0, 0),
        };
        Charge::new(0, 0, decision)
    }

    /// The charge of a key held and within its horizon, under the shard's read lock; `None`
    /// otherwise.
    fn charge_held<Q>(&self, key: &Q, cost: u64) -> Option<Charge>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let guard = inner.shard(hash).read();
        let entry = guard.get(hash, key)?;
        let now = inner.clock.now();
        let since = entry.since_epoch(now);
        let limit = entry.limit;
        if since > limit.horizon {
            return None;
        }
        entry.touch();
        let charge = inner.algorithm.charge(&limit.params, &entry.state, since, cost)?;
        if limit.pooled
            && let Some(pool) = &inner.pool
        {
            pool.charge(now, cost);
        }
        Some(charge)
    }
}
