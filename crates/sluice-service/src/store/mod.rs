//! Where the counters are: one interface ([`CounterStore`]) that counts a request's limits, and
//! its two implementations, in this process ([`InMemory`]) and on Redis ([`OnRedis`]). The
//! decision ([`crate::decide`]) plans the limits and records the answer; only the counting in
//! between differs by store.

mod memory;
mod redis;

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;

use sluice::{AlgorithmKind, Charge, Quota};
use sluice_descriptors::Rule;
use smallvec::SmallVec;

use crate::answer::Status;
use crate::request::RequestError;
use crate::settings::Counting;

pub(crate) use memory::InMemory;
pub(crate) use redis::OnRedis;
pub use redis::RedisCounters;

/// One limit a request's descriptor is counted against.
#[derive(Debug)]
pub(crate) struct Count<'g> {
    /// The descriptor's place in the request.
    pub(crate) index: usize,
    pub(crate) rule: &'g Rule,
    pub(crate) kind: AlgorithmKind,
    /// Its counter's key, in [`Tally::keys`].
    pub(crate) key: Range<usize>,
    /// What it takes (0 looks).
    pub(crate) cost: u64,
    /// Its rule's quota, or the request's override: what a status names when the store
    /// cannot say which quota its counter holds.
    pub(crate) quota: Quota,
    /// Over its limit, it denies only with every other quota-mode limit of the request.
    pub(crate) quota_mode: bool,
    /// Which of its rule's quotas: 0 its own, `n` its `n`th stacked one.
    pub(crate) nth: usize,
}

/// Whether a request's counted limits deny it, as envoy ratelimit decides with quota mode: any
/// ordinary limit over (not in shadow mode), or every quota-mode limit over (one in shadow mode
/// is never over for this).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Denial {
    /// An ordinary limit denies.
    ordinary: bool,
    quota_limits: u32,
    quota_over: u32,
    /// The descriptor of the last quota-mode limit added, and whether it was counted over: a
    /// descriptor's limits (its rule's stacked quotas, added one after another) are one
    /// quota-mode limit, over if any of them is.
    quota_descriptor: Option<(usize, bool)>,
}

impl Denial {
    /// Adds one limit's status.
    #[inline]
    pub(crate) fn add(&mut self, count: &Count<'_>, status: &Status<'_>) {
        if count.quota_mode {
            let denies = status.denies();
            match self.quota_descriptor {
                Some((index, over)) if index == count.index => {
                    if denies && !over {
                        self.quota_over += 1;
                        self.quota_descriptor = Some((index, true));
                    }
                }
                _ => {
                    self.quota_limits += 1;
                    self.quota_over += u32::from(denies);
                    self.quota_descriptor = Some((count.index, denies));
                }
            }
        } else {
            self.ordinary |= status.denies();
        }
    }

    /// Whether an ordinary limit denies: the request is denied whatever the rest say.
    #[inline]
    pub(crate) fn settled(&self) -> bool {
        self.ordinary
    }

    /// Whether the limits added deny the request.
    #[inline]
    pub(crate) fn denied(&self) -> bool {
        self.ordinary || (self.quota_limits > 0 && self.quota_over == self.quota_limits)
    }

    /// Whether `statuses` (one per count) deny the request.
    pub(crate) fn of(counts: &[Count<'_>], statuses: &[Status<'_>]) -> bool {
        let mut denial = Self::default();
        for (count, status) in counts.iter().zip(statuses) {
            denial.add(count, status);
        }
        denial.denied()
    }
}

/// Whether some of `counts` belong to one descriptor (its rule's stacked quotas, planned one
/// after another).
pub(crate) fn has_stacked(counts: &[Count<'_>]) -> bool {
    counts.windows(2).any(|pair| pair[0].index == pair[1].index)
}

/// Which descriptors have a limit over (in shadow mode too), indexed by the descriptor's place
/// in the request: one pass over `limits` (a limit's place in `counts`, and its status).
pub(crate) fn over_descriptors<'s, 'g: 's>(
    counts: &[Count<'g>],
    limits: impl Iterator<Item = (usize, &'s Status<'g>)>,
) -> SmallVec<[bool; 8]> {
    let mut over = SmallVec::new();
    for (at, status) in limits {
        let index = counts[at].index;
        if over.len() <= index {
            over.resize(index + 1, false);
        }
        over[index] |= status.is_over();
    }
    over
}

/// A request's limits being counted, and each one's status once counted (in the same order):
/// a descriptor with no limit has none.
#[derive(Debug)]
pub(crate) struct Tally<'g> {
    /// The counters' keys, one after another.
    pub(crate) keys: String,
    /// Two inline: a rule of two quotas, or two descriptors, allocate nothing.
    pub(crate) counts: SmallVec<[Count<'g>; 2]>,
    pub(crate) statuses: SmallVec<[Status<'g>; 2]>,
}

impl Tally<'_> {
    /// An empty tally writing its keys in `keys`.
    pub(crate) fn new(keys: String) -> Self {
        Self {
            keys,
            counts: SmallVec::new(),
            statuses: SmallVec::new(),
        }
    }

    /// The key of `count`'s counter.
    pub(crate) fn key(&self, count: &Count<'_>) -> &str {
        self.keys.get(count.key.clone()).unwrap_or_default()
    }
}

/// A charge on a store, in flight.
pub(crate) type Charging<'a> =
    Pin<Box<dyn Future<Output = Result<(Charge, Quota), RequestError>> + Send + 'a>>;

/// A count on a store, in flight.
pub(crate) type Later<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// The answer of [`CounterStore::count`]: whether the request is denied, now or later.
pub(crate) enum Counted<'a> {
    Now(bool),
    Later(Later<'a>),
}

/// The counters of one generation of rules, by algorithm.
pub(crate) trait CounterStore: Send + Sync {
    /// Whether limits of `kind` are counted here.
    fn has(&self, kind: AlgorithmKind) -> bool;
    /// The quota `key`'s counter of `kind` is held under now, if known.
    fn quota_of(&self, kind: AlgorithmKind, key: &str) -> Option<Quota>;
    /// Whether [`count`](Self::count) answers at once (in this process).
    fn answers_now(&self) -> bool;
    /// Counts every limit of `tally` under `counting`, writing each one's status in the
    /// limits' order; whether the limits deny the request ([`Denial`]).
    fn count<'a, 'g: 'a>(&'a self, tally: &'a mut Tally<'g>, counting: Counting) -> Counted<'a>;
    /// Takes one limit at once, if this store can (in this process): what a request of one
    /// descriptor needs, with no list to hold and nothing to give back.
    fn take_now<'g>(&self, _count: &Count<'g>, _keys: &str) -> Option<Status<'g>> {
        None
    }
    /// Charges `count`'s cost to its counter (its key in `keys`) whatever is left, down to its
    /// quota's debt: a report of usage after the fact. The charge and the quota it was
    /// charged under.
    fn charge<'a>(&'a self, count: &'a Count<'_>, keys: &'a str) -> Charging<'a>;
    /// The counters as held in this process, for the reload and the metrics.
    fn in_memory(&self) -> Option<&InMemory> {
        None
    }
}
