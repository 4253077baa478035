//! Taking with a receipt and giving back: what a chain needs from the keyed limiter.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use super::{KeyedLimiter, QuotaSource};
use crate::chain::Receipt;
use crate::{Algorithm, CheckError, Clock, Decision};

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// [`KeyedLimiter::check_n`], also returning what a refund needs: the name of the state it
    /// was decided on (`Entry::tag`, on every path, pooled or not) and the time given to the
    /// algorithm. A key that is not stored (refused by a full store) is
    /// decided on a scratch state and its receipt gives nothing back.
    #[inline]
    pub(crate) fn take_n<Q>(&self, key: &Q, cost: u64) -> Result<(Decision, Receipt), CheckError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.check_key(key, cost, |checked| {
            let receipt = checked.receipt;
            checked.result.map(|decision| (decision, receipt))
        })
    }

    /// Gives back `cost` taken by [`Self::take_n`], if the key still holds the same state.
    pub(crate) fn refund_n<Q>(&self, key: &Q, receipt: Receipt, cost: u64)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if receipt == Receipt::NOTHING {
            return;
        }
        let inner = &*self.inner;
        let hash = inner.hasher.hash_one(key);
        let guard = inner.shard(hash).read();
        if let Some(entry) = guard.get(hash, key) {
            let bits = entry.meta.load(Ordering::Relaxed);
            if entry.tag(bits) == receipt.tag() && receipt.at() <= entry.limit.horizon {
                let params = &entry.limit.params;
                inner.algorithm.refund(params, &entry.state, receipt.at(), cost);
                // A take on the pooled failsafe quota took from the pool too, at the same time.
                if entry.limit.pooled
                    && let Some(pool) = &inner.pool
                {
                    pool.give_back(entry.epoch.saturating_add(receipt.at()), cost);
                }
            }
        }
    }
}
