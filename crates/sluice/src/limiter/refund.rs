//! Taking with a receipt and giving back: what a chain needs from the direct limiter.

use super::{RateLimiter, decide};
use crate::chain::Receipt;
use crate::{Algorithm, CheckError, Clock, Decision};

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// [`RateLimiter::check_n`], also returning what a refund of this check needs: the state it
    /// was decided on and the time given to the algorithm.
    #[inline]
    pub(crate) fn take_n(&self, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        loop {
            let limit = self.current();
            let now = self.clock.now();
            if now > limit.last_valid {
                self.replace(limit, None, now);
                continue;
            }
            // A reading older than the epoch (a thread that read the clock just before a
            // replacement) is taken as the epoch itself.
            let since_epoch = now.saturating_sub(limit.epoch);
            let result = decide(
                &self.algorithm,
                &limit.quota,
                &limit.params,
                &limit.state,
                since_epoch,
                cost,
            );
            if let Some(result) = result {
                let tag = std::ptr::from_ref(limit) as usize as u64;
                return result.map(|decision| (decision, Receipt::new(since_epoch, tag)));
            }
        }
    }

    /// Gives back `cost` taken by [`Self::take_n`]. If the limit was replaced since (a quota
    /// change or an epoch move), nothing is given back: the carried-over state no longer tells
    /// that take apart, and keeping it only under-admits.
    pub(crate) fn refund_n(&self, receipt: Receipt, cost: u64) {
        let limit = self.current();
        // A receipt of another state, or one no take could have produced, gives nothing back.
        let in_range = receipt.at() <= limit.last_valid - limit.epoch;
        if std::ptr::from_ref(limit) as usize as u64 == receipt.tag() && in_range {
            self.algorithm
                .refund(&limit.params, &limit.state, receipt.at(), cost);
        }
    }
}
