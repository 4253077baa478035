//! Giving back what a check took: what a chain needs from the direct limiter.

use super::{RateLimiter, reclaim};
use crate::chain::Receipt;
use crate::{Algorithm, Clock};

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// Gives back `cost` taken by [`Self::take_n`]. If the limit was replaced since (a quota
    /// change or an epoch move), nothing is given back: the carried-over state no longer tells
    /// that take apart, and keeping it only under-admits.
    pub(crate) fn refund_n(&self, receipt: Receipt, cost: u64) {
        let mut pinned = reclaim::pin();
        let limit = self.load(&mut pinned);
        // A receipt of another state, or one no take could have produced, gives nothing back.
        let in_range = receipt.at() <= limit.last_valid - limit.epoch;
        if limit.id == receipt.tag() && in_range {
            self.algorithm
                .refund(&limit.params, &limit.state, receipt.at(), cost);
        }
        limit.used();
    }
}
