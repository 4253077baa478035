//! Counters on Redis: the engine's limits shared by every `sluice serve` on the same Redis.
//!
//! One [`RedisLimiter`] per algorithm the rules use, keyed by the same counter keys as the
//! memory counters and given each key's quota by the same [`RuleQuotas`]. The state lives in
//! Redis, so a reload builds new limiters on the same keys and every count stays (the scripts
//! carry a count over to a changed quota, as the core does).
//!
//! Redis cannot give a take back, so all-or-nothing with several limits looks first (cost 0,
//! all at once), takes for real only where a limit would deny (a denied take consumes nothing
//! and says when to retry), and takes the rest only if those admitted; a limit another process
//! fills between the look and the take denies and leaves what the others took. A descriptor's
//! stacked quotas are all or nothing so, in either counting.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sluice::{AlgorithmKind, Charge, Decision, Quota};
use sluice_redis::{FailurePolicy, RedisAlgorithm, RedisAlgorithmVisitor, RedisLimiter, RedisStore};
use smallvec::SmallVec;

use super::{Charging, Count, Counted, CounterStore, Denial, Tally, has_stacked, over_descriptors};
use crate::answer::Status;
use crate::counters::{CounterSettings, RuleQuotas, stacked_hash_tag};
use crate::request::RequestError;
use crate::settings::Counting;

/// Where and how the engine's counters are kept on Redis.
///
/// # Example
/// ```no_run
/// use sluice_redis::{FailurePolicy, RedisOptions, RedisStore};
/// use sluice_service::RedisCounters;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
/// let redis = RedisCounters {
///     policy: FailurePolicy::FailClosed,
///     ..RedisCounters::new(store)
/// };
/// # let _ = redis; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisCounters {
    /// The connection (or cluster) the counters live on.
    pub store: RedisStore,
    /// The answer while Redis does not answer.
    pub policy: FailurePolicy,
    /// How many processes share the limits (each one's share under
    /// [`FailurePolicy::LocalShare`] is `quota / hosts`).
    pub hosts: u64,
    /// The prefix of every Redis key the engine writes.
    pub prefix: String,
}

impl RedisCounters {
    /// Counters on `store`, failing open while it does not answer, one host, prefix
    /// `sluice:descriptors`.
    pub fn new(store: RedisStore) -> Self {
        Self {
            store,
            policy: FailurePolicy::default(),
            hosts: 1,
            prefix: "sluice:descriptors".into(),
        }
    }
}

impl std::fmt::Debug for RedisCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCounters")
            .field("policy", &self.policy)
            .field("hosts", &self.hosts)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A check on Redis, in flight.
type Take<'a> = Pin<Box<dyn Future<Output = Result<Decision, sluice_redis::Error>> + Send + 'a>>;

/// One algorithm's counters on Redis.
trait SharedCounters: Send + Sync {
    /// Takes `cost` from `key`'s counter if all of it fits (0 peeks): the failure policy
    /// answers while Redis does not.
    fn take<'a>(&'a self, key: &'a str, cost: u64) -> Take<'a>;
    /// The quota `key` is governed by now.
    fn quota_of(&self, key: &str) -> Quota;
    /// Charges `cost` to `key`'s counter whatever is left, down to its quota's debt.
    fn charge<'a>(&'a self, key: &'a str, cost: u64) -> ChargeOnRedis<'a>;
    /// Takes `cost` from every one of `keys` or from none, in one atomic call: each answer,
    /// and whether its cost was taken.
    fn take_group<'a>(&'a self, keys: &'a [&'a str], cost: u64) -> TakeGroup<'a>;
}

/// A group's take on Redis, in flight.
type TakeGroup<'a> =
    Pin<Box<dyn Future<Output = Vec<(Result<Decision, sluice_redis::Error>, bool)>> + Send + 'a>>;

/// A charge on Redis, in flight.
type ChargeOnRedis<'a> = Pin<Box<dyn Future<Output = Result<Charge, sluice_redis::Error>> + Send + 'a>>;

impl<A: RedisAlgorithm> SharedCounters for RedisLimiter<A, RuleQuotas> {
    fn take<'a>(&'a self, key: &'a str, cost: u64) -> Take<'a> {
        Box::pin(self.check_n(key, cost))
    }

    fn charge<'a>(&'a self, key: &'a str, cost: u64) -> ChargeOnRedis<'a> {
        Box::pin(self.charge_n(key, cost))
    }

    fn take_group<'a>(&'a self, keys: &'a [&'a str], cost: u64) -> TakeGroup<'a> {
        Box::pin(self.check_all(keys, cost))
    }

    fn quota_of(&self, key: &str) -> Quota {
        RedisLimiter::quota_of(self, key)
    }
}

/// How long a request is told to wait when Redis cannot decide its limit at all.
const UNDECIDED_RETRY_NS: u64 = 1_000_000_000;

/// A take on Redis as a decision. Outages are answered inside the limiter, by its failure
/// policy; a cost beyond the quota is the error; a quota Redis cannot hold exactly (a
/// request's own override) is denied, and logged.
async fn decide(counters: &dyn SharedCounters, key: &str, cost: u64) -> Result<Decision, sluice::CheckError> {
    match counters.take(key, cost).await {
        Ok(decision) => Ok(decision),
        Err(sluice_redis::Error::Check(e)) => Err(e),
        Err(e) => {
            tracing::error!(key, "cannot decide on Redis: {e}; denying");
            Ok(Decision::denied(0, 0, 0, UNDECIDED_RETRY_NS))
        }
    }
}

/// The Redis limiter of `kind` over `quotas`.
fn build(
    kind: AlgorithmKind,
    quotas: RuleQuotas,
    redis: &RedisCounters,
    settings: CounterSettings,
) -> Result<Arc<dyn SharedCounters>, sluice_redis::SetupError> {
    struct Build<'a>(RuleQuotas, &'a RedisCounters, CounterSettings);
    impl RedisAlgorithmVisitor for Build<'_> {
        type Output = Result<Arc<dyn SharedCounters>, sluice_redis::SetupError>;
        fn visit<A: RedisAlgorithm>(self, algorithm: A) -> Self::Output {
            let Build(quotas, redis, settings) = self;
            // As in memory: a key whose rule is gone is admitted nothing.
            let builder = RedisLimiter::builder(algorithm, settings.failsafe)
                .source(quotas)
                .unknown_key_quota(Quota::deny_all())
                // A rule's quotas on one Redis Cluster slot, decided in one call.
                .hash_tag(stacked_hash_tag)
                .policy(redis.policy)
                .hosts(redis.hosts)
                .prefix(redis.prefix.clone())
                .capacity(settings.capacity)
                .refresh_every(settings.refresh);
            let builder = match settings.failsafe_pool {
                Some(pool) => builder.failsafe_pool(pool),
                None => builder,
            };
            Ok(Arc::new(builder.build(redis.store.clone())?))
        }
    }
    sluice_redis::visit_scripted(kind, Build(quotas, redis, settings))?
}

/// The counters of every algorithm the rules use, on Redis.
pub(crate) struct OnRedis {
    by_kind: Vec<(AlgorithmKind, Arc<dyn SharedCounters>)>,
}

impl OnRedis {
    /// A limiter per algorithm of `kinds` on `redis`, over `quotas`.
    pub(crate) fn build(
        kinds: &[AlgorithmKind],
        quotas: &RuleQuotas,
        redis: &RedisCounters,
        settings: CounterSettings,
    ) -> Result<Self, sluice_redis::SetupError> {
        let by_kind = (kinds.iter())
            .map(|&kind| Ok((kind, build(kind, quotas.clone(), redis, settings)?)))
            .collect::<Result<_, sluice_redis::SetupError>>()?;
        Ok(Self { by_kind })
    }

    fn get(&self, kind: AlgorithmKind) -> Option<&dyn SharedCounters> {
        (self.by_kind.iter())
            .find(|(k, _)| *k == kind)
            .map(|(_, counters)| &**counters)
    }

    /// Each limit's decision for `cost` of it, all at once, with the quota it names: `None`
    /// where the cost can never fit its quota.
    async fn take_all(
        &self,
        tally: &Tally<'_>,
        counts: &[Place],
        cost: impl Fn(&Count<'_>) -> u64,
    ) -> Vec<(Option<Decision>, Quota)> {
        let takes = counts.iter().map(|&at| {
            let count = &tally.counts[at];
            let cost = cost(count);
            let key = tally.key(count);
            async move {
                let Some(counters) = self.get(count.kind) else {
                    return (None, count.quota);
                };
                // The one error left is a cost the quota can never admit.
                let decision = decide(counters, key, cost).await.ok();
                (decision, counters.quota_of(key))
            }
        });
        futures_util::future::join_all(takes).await
    }

    /// All-or-nothing over the limits at `all`: look, then take. Whether they deny. A
    /// descriptor one of whose limits is over (in shadow mode too) takes nothing from its
    /// others, as in memory.
    async fn look_then_take(&self, tally: &mut Tally<'_>, all: &[Place]) -> bool {
        let looks = self.take_all(tally, all, |_| 0).await;
        // What a take would say, from the look: over if it leaves less than the cost.
        let looked: Looked<'_> = (all.iter().zip(&looks))
            .map(|(&at, (look, quota))| {
                let count = &tally.counts[at];
                let status = match look {
                    Some(look) => Status::of(count.rule, *quota, Ok(*look)).as_take(count.cost),
                    None => Status::never_fits(count.rule, *quota, count.cost),
                };
                (at, status)
            })
            .collect();
        // The descriptors with a limit over.
        let over = over_descriptors(&tally.counts, looked.iter().map(|(at, status)| (*at, status)));
        let over = |at: Place| over.get(tally.counts[at].index).copied().unwrap_or(false);
        if !denies(tally, looked.iter().map(|(at, status)| (*at, status))) {
            let (taking, kept): (Looked<'_>, Looked<'_>) =
                (looked.iter().copied()).partition(|(at, _)| !over(*at));
            let taking: SmallVec<[Place; 2]> = taking.iter().map(|(at, _)| *at).collect();
            self.take_places(tally, &taking).await;
            for &(at, status) in &kept {
                tally.statuses[at] = status;
            }
            return denies_at(tally, all);
        }
        // Take only where a limit would deny (with the other quotas of its descriptor, in one
        // call): a denied take consumes nothing and says when to retry. The rest keep what
        // their look said.
        let denying: SmallVec<[bool; 8]> = over_descriptors(
            &tally.counts,
            (looked.iter())
                .map(|(at, status)| (*at, status))
                .filter(|(_, status)| status.denies()),
        );
        let (deciding, rest): (Looked<'_>, Looked<'_>) = (looked.iter().copied())
            .partition(|(at, _)| denying.get(tally.counts[*at].index).copied().unwrap_or(false));
        let deciding: SmallVec<[Place; 2]> = deciding.iter().map(|(at, _)| *at).collect();
        self.take_places(tally, &deciding).await;
        for &(at, status) in &rest {
            tally.statuses[at] = status;
        }
        if denies_at(tally, all) {
            return true;
        }
        // Another process freed what was short between the look and the take: those took,
        // so the rest take too.
        let rest: SmallVec<[Place; 2]> = rest.iter().map(|(at, _)| *at).collect();
        self.take_places(tally, &rest).await;
        denies_at(tally, all)
    }

    /// Takes the limits at `places` (in the tally's order), each descriptor's quotas all or
    /// nothing in one call, writing each one's status.
    async fn take_places(&self, tally: &mut Tally<'_>, places: &[Place]) {
        let mut alone: SmallVec<[Place; 2]> = SmallVec::new();
        let mut start = 0;
        while start < places.len() {
            let index = tally.counts[places[start]].index;
            let end = (start..places.len())
                .find(|&i| tally.counts[places[i]].index != index)
                .unwrap_or(places.len());
            match &places[start..end] {
                [one] => alone.push(*one),
                group => self.take_group(tally, group).await,
            }
            start = end;
        }
        let decisions = self.take_all(tally, &alone, |count| count.cost).await;
        settle(tally, &alone, decisions);
    }
}

/// A limit's place in its tally.
type Place = usize;

/// Limits with the status a look gave them.
type Looked<'g> = SmallVec<[(Place, Status<'g>); 2]>;

impl OnRedis {
    /// Charges a limit's cost, with the quota it was charged under.
    async fn charge_one(&self, count: &Count<'_>, keys: &str) -> Result<(Charge, Quota), RequestError> {
        let counters = (self.get(count.kind)).ok_or_else(|| {
            RequestError::ChargeUnsupported("the counters of this algorithm are gone".into())
        })?;
        let key = keys.get(count.key.clone()).unwrap_or_default();
        match counters.charge(key, count.cost).await {
            Ok(charge) => Ok((charge, counters.quota_of(key))),
            Err(
                e @ (sluice_redis::Error::ChargeUnsupported { .. } | sluice_redis::Error::QuotaTooLarge(_)),
            ) => Err(RequestError::ChargeUnsupported(e.to_string())),
            Err(e) => Err(RequestError::NotCharged(e.to_string())),
        }
    }

    /// Counts the cost of each limit over with `count_over_limit` all the same, below empty
    /// (the answer stands as decided). A charge Redis does not take is logged: the request was
    /// answered already.
    async fn count_over(&self, tally: &Tally<'_>) {
        let over = (tally.counts.iter().zip(&tally.statuses))
            .filter(|(count, status)| count.rule.count_over_limit && count.cost > 0 && status.is_over());
        let charges = over.map(|(count, _)| async move {
            if let Err(e) = self.charge_one(count, &tally.keys).await {
                tracing::warn!(rule = %count.rule.id, "a denied request's hits were not counted: {e}");
            }
        });
        futures_util::future::join_all(charges).await;
    }
}

impl CounterStore for OnRedis {
    fn charge<'a>(&'a self, count: &'a Count<'_>, keys: &'a str) -> Charging<'a> {
        Box::pin(self.charge_one(count, keys))
    }

    fn has(&self, kind: AlgorithmKind) -> bool {
        self.by_kind.iter().any(|(k, _)| *k == kind)
    }

    fn quota_of(&self, kind: AlgorithmKind, key: &str) -> Option<Quota> {
        Some(self.get(kind)?.quota_of(key))
    }

    fn answers_now(&self) -> bool {
        false
    }

    fn count<'a, 'g: 'a>(&'a self, tally: &'a mut Tally<'g>, counting: Counting) -> Counted<'a> {
        // Every status written below: a cost that never fits until its take says otherwise.
        tally.statuses.clear();
        let placeholders =
            (tally.counts.iter()).map(|count| Status::never_fits(count.rule, count.quota, count.cost));
        tally.statuses.extend(placeholders);
        let look_first = counting == Counting::AllOrNothing
            && tally.counts.iter().filter(|c| c.cost > 0).count() > 1
            && !one_descriptor(&tally.counts);
        let grouped = !look_first && has_stacked(&tally.counts);
        let counts_over = tally.counts.iter().any(|count| count.rule.count_over_limit);
        Counted::Later(Box::pin(async move {
            let denied = self.count_all(tally, look_first, grouped).await;
            if counts_over {
                self.count_over(tally).await;
            }
            denied
        }))
    }
}

impl OnRedis {
    /// Counts every limit of `tally`: looking first (all or nothing over several limits),
    /// each descriptor's stacked quotas all or nothing (`grouped`), or each limit alone.
    /// Whether the limits deny.
    async fn count_all(&self, tally: &mut Tally<'_>, look_first: bool, grouped: bool) -> bool {
        let all: SmallVec<[Place; 2]> = (0..tally.counts.len()).collect();
        if look_first {
            return self.look_then_take(tally, &all).await;
        }
        if one_descriptor(&tally.counts) {
            // One descriptor's quotas (a rule of several): all or nothing in one call.
            self.take_group(tally, &all).await;
            return Denial::of(&tally.counts, &tally.statuses);
        }
        if grouped {
            // Each descriptor's stacked quotas all or nothing, the descriptors apart.
            self.take_places(tally, &all).await;
            return Denial::of(&tally.counts, &tally.statuses);
        }
        let decisions = self.take_all(tally, &all, |count| count.cost).await;
        settle(tally, &all, decisions);
        Denial::of(&tally.counts, &tally.statuses)
    }
}

/// Whether `counts` are several limits of one descriptor (its rule's quotas).
fn one_descriptor(counts: &[Count<'_>]) -> bool {
    counts.len() > 1 && counts.iter().all(|count| count.index == counts[0].index)
}

impl OnRedis {
    /// Takes the limits at `group` (one descriptor's quotas, of one algorithm) all or nothing
    /// in one atomic call, writing each one's status: a limit not taken answers what a take
    /// would have said (from its look), as `look_then_take` does.
    async fn take_group(&self, tally: &mut Tally<'_>, group: &[Place]) {
        let Tally {
            keys,
            counts,
            statuses: written,
        } = tally;
        let first = &counts[group[0]];
        let Some(counters) = self.get(first.kind) else {
            return;
        };
        let (cost, rule) = (first.cost, first.rule);
        let keys: SmallVec<[&str; 4]> = (group.iter())
            .map(|&at| keys.get(counts[at].key.clone()).unwrap_or_default())
            .collect();
        let answers = counters.take_group(&keys, cost).await;
        let statuses: SmallVec<[Status<'_>; 4]> = (keys.iter().zip(answers))
            .map(|(key, (answer, taken))| {
                let quota = counters.quota_of(key);
                match answer {
                    Ok(decision) if taken => Status::of(rule, quota, Ok(decision)),
                    Ok(look) => Status::of(rule, quota, Ok(look)).as_take(cost),
                    Err(sluice_redis::Error::Check(e)) => Status::of(rule, quota, Err(e)),
                    Err(e) => {
                        tracing::error!(key, "cannot decide on Redis: {e}; denying");
                        Status::of(rule, quota, Ok(Decision::denied(0, 0, 0, UNDECIDED_RETRY_NS)))
                    }
                }
            })
            .collect();
        for (&at, status) in group.iter().zip(statuses) {
            written[at] = status;
        }
    }
}

/// Whether the limits at `places`, with their statuses, deny ([`Denial`]).
fn denies<'s, 'g: 's>(tally: &Tally<'g>, places: impl Iterator<Item = (Place, &'s Status<'g>)>) -> bool {
    let mut denial = Denial::default();
    for (at, status) in places {
        denial.add(&tally.counts[at], status);
    }
    denial.denied()
}

/// Whether the limits at `places` deny, by the statuses written in `tally`.
fn denies_at(tally: &Tally<'_>, places: &[Place]) -> bool {
    denies(tally, places.iter().map(|&at| (at, &tally.statuses[at])))
}

/// Writes the status of each limit at `places` from its decision.
fn settle(tally: &mut Tally<'_>, places: &[Place], decisions: Vec<(Option<Decision>, Quota)>) {
    for (&at, (decision, quota)) in places.iter().zip(decisions) {
        let count = &tally.counts[at];
        tally.statuses[at] = match decision {
            Some(decision) => Status::of(count.rule, quota, Ok(decision)),
            None => Status::never_fits(count.rule, quota, count.cost),
        };
    }
}
