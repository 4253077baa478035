//! The counters in this process: one bounded keyed limiter per algorithm the rules use. A
//! request's limits are taken in its order; all-or-nothing gives back every take of a denied
//! request, and limits after an ordinary limit's denial are only looked at. A descriptor's
//! stacked quotas are all or nothing in either counting.

use std::sync::Arc;

use sluice::{AlgorithmKind, KeyedMetrics, Quota, Receipt};
use smallvec::SmallVec;

use super::{Charging, Count, Counted, CounterStore, Denial, Tally, has_stacked, over_descriptors};
use crate::answer::Status;
use crate::counters::AlgorithmCounters;
use crate::request::RequestError;
use crate::settings::Counting;

/// The counters of every algorithm the rules use, in this process.
pub(crate) struct InMemory {
    pub(crate) by_kind: Vec<(AlgorithmKind, Arc<dyn AlgorithmCounters>)>,
}

impl InMemory {
    pub(crate) fn get(&self, kind: AlgorithmKind) -> Option<&dyn AlgorithmCounters> {
        (self.by_kind.iter())
            .find(|(k, _)| *k == kind)
            .map(|(_, counters)| &**counters)
    }

    /// Every limiter's counts, summed.
    pub(crate) fn metrics(&self) -> KeyedMetrics {
        let mut sum = KeyedMetrics::default();
        for (_, counters) in &self.by_kind {
            sum += counters.metrics();
        }
        sum
    }
}

impl InMemory {
    /// Takes `cost` of `count` (its key in `keys`): its status, and what giving it back needs.
    #[inline]
    fn take<'g>(
        &self,
        count: &Count<'g>,
        keys: &str,
        cost: u64,
    ) -> (Status<'g>, Option<(&dyn AlgorithmCounters, Receipt)>) {
        // The plan counts only algorithms the store has.
        let Some(counters) = self.get(count.kind) else {
            return (Status::UNLIMITED, None);
        };
        let key = keys.get(count.key.clone()).unwrap_or_default();
        let (answer, quota) = counters.take_quoted(key, cost);
        let mut taken = None;
        let answer = answer.map(|(decision, receipt)| {
            if decision.is_allowed() && cost > 0 {
                taken = Some((counters, receipt));
            }
            decision
        });
        (Status::of(count.rule, quota, answer), taken)
    }
}

impl InMemory {
    /// Counts the cost of a limit over with `count_over_limit` all the same, below empty (the
    /// answer stands as decided).
    #[inline]
    fn count_over(&self, count: &Count<'_>, keys: &str, status: &Status<'_>) {
        if status.is_over() && count.cost > 0 && count.rule.count_over_limit {
            charge_over(self, count, keys);
        }
    }
}

#[cold]
#[inline(never)]
fn charge_over(store: &InMemory, count: &Count<'_>, keys: &str) {
    if let Some(counters) = store.get(count.kind) {
        counters.charge(keys.get(count.key.clone()).unwrap_or_default(), count.cost);
    }
}

impl CounterStore for InMemory {
    fn has(&self, kind: AlgorithmKind) -> bool {
        self.by_kind.iter().any(|(k, _)| *k == kind)
    }

    fn quota_of(&self, kind: AlgorithmKind, key: &str) -> Option<Quota> {
        self.get(kind)?.quota_of(key)
    }

    fn answers_now(&self) -> bool {
        true
    }

    fn count<'a, 'g: 'a>(&'a self, tally: &'a mut Tally<'g>, counting: Counting) -> Counted<'a> {
        // Only a request of several limits has takes to give back: all of them when the
        // request is all or nothing and denied, and those of a descriptor one of whose limits
        // (its rule's stacked quotas) is over, in either counting.
        let whole = counting == Counting::AllOrNothing && tally.counts.len() > 1;
        let grouped = !whole && has_stacked(&tally.counts);
        let mut taken: SmallVec<[(usize, &dyn AlgorithmCounters, Receipt); 2]> = SmallVec::new();
        let mut denial = Denial::default();
        // The descriptor being counted, and whether one of its limits is over already (in
        // shadow mode too: counted as enforcement would count it).
        let mut group = (usize::MAX, false);
        let mut any_over = false;
        tally.statuses.clear();
        for (at, count) in tally.counts.iter().enumerate() {
            if count.index != group.0 {
                group = (count.index, false);
            }
            // After a limit denied, the rest are only looked at.
            let cost = if (denial.settled() && whole) || (grouped && group.1) {
                0
            } else {
                count.cost
            };
            let (status, receipt) = self.take(count, &tally.keys, cost);
            // A look says what a take would have.
            let status = if cost < count.cost {
                status.as_take(count.cost)
            } else {
                status
            };
            if let Some((counters, receipt)) = receipt.filter(|_| whole || grouped) {
                taken.push((at, counters, receipt));
            }
            self.count_over(count, &tally.keys, &status);
            group.1 |= status.is_over();
            any_over |= group.1;
            denial.add(count, &status);
            tally.statuses.push(status);
        }
        let denied = denial.denied();
        // Nothing over (the common admission): no descriptor's takes to give back for it.
        let over = if any_over {
            over_descriptors(&tally.counts, tally.statuses.iter().enumerate())
        } else {
            SmallVec::new()
        };
        for (at, counters, receipt) in taken {
            let group_over = over.get(tally.counts[at].index).copied().unwrap_or(false);
            let give_back = (whole && denied) || group_over;
            if give_back {
                let count = &tally.counts[at];
                let key = tally.keys.get(count.key.clone()).unwrap_or_default();
                counters.give_back(key, receipt, count.cost);
                tally.statuses[at].given_back(count.cost);
            }
        }
        Counted::Now(denied)
    }

    #[inline]
    fn take_now<'g>(&self, count: &Count<'g>, keys: &str) -> Option<Status<'g>> {
        let status = self.take(count, keys, count.cost).0;
        self.count_over(count, keys, &status);
        Some(status)
    }

    fn charge<'a>(&'a self, count: &'a Count<'_>, keys: &'a str) -> Charging<'a> {
        let charged = self.get(count.kind).map(|counters| {
            let key = keys.get(count.key.clone()).unwrap_or_default();
            counters.charge(key, count.cost)
        });
        Box::pin(std::future::ready(charged.ok_or(
            RequestError::ChargeUnsupported("the counters of this algorithm are gone".into()),
        )))
    }

    fn in_memory(&self) -> Option<&InMemory> {
        Some(self)
    }
}
