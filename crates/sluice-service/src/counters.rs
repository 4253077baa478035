//! The counters the engine decides on: one bounded keyed limiter per algorithm the rules use,
//! keyed by counter keys (a rule's place and the request's values), each key's quota given by
//! its rule at once (a source that never waits).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice::{
    Algorithm, AlgorithmKind, AlgorithmVisitor, Charge, CheckError, Decision, FetchResult, KeyedBuildError,
    KeyedLimiter, KeyedLink, KeyedMetrics, Link, Migrated, Quota, QuotaSource, Receipt,
};
use sluice_descriptors::{Entry, Rule, RuleId, RuleSet, last_value_of, push_counter_key, rule_of};

/// How a counter key starts: governed by its rule's quota, or by a quota the request set.
const BY_RULE: char = 'r';
const BY_OVERRIDE: char = 'o';
/// Then one digit, `n`: governed by the rule's `n`th stacked quota ([`Rule::stacked`]).
const BY_STACKED: char = 's';
/// Ends an override's quota text (which never holds it).
const OVERRIDE_END: char = '\u{1d}';

/// Appends to `key` the key of the counter of `entries` under `rule`: governed by the rule's
/// quota, or with `quota`, by a quota the request set for it (another counter than the rule's
/// own, so an override never spends the configured limit).
pub(crate) fn push_counter(key: &mut String, rule: &Rule, entries: &[Entry<'_>], quota: Option<Quota>) {
    use std::fmt::Write;
    match quota {
        None => key.push(BY_RULE),
        Some(quota) => {
            // Writing to a String cannot fail.
            let _ = write!(key, "{BY_OVERRIDE}{quota}{OVERRIDE_END}");
        }
    }
    push_counter_key(key, rule, entries);
}

/// Appends to `keys` the key of the counter of a rule's `nth` stacked quota (from 1;
/// [`Rule::stacked`], at most [`sluice_descriptors::MAX_STACKED`]) for the descriptor whose
/// counter under the rule's own quota ([`push_counter`], without an override) is at `first` in
/// `keys`: a counter of its own, so each quota counts apart. Keyed by the quota's place in the
/// rule's list: a quota appended leaves the others' counts; one inserted shifts the later
/// quotas onto their predecessors' counters (carried over as any changed quota is). Copied from
/// the first rather than escaped again.
pub(crate) fn push_stacked_counter(keys: &mut String, first: std::ops::Range<usize>, nth: usize) {
    keys.push(BY_STACKED);
    // One digit: a rule holds at most 7 stacked quotas.
    keys.push(char::from(b'0' + (nth % 10) as u8));
    keys.extend_from_within(first.start + BY_RULE.len_utf8()..first.end);
}

/// The Redis Cluster slot of a stacked quota's counter key (`s<n>` and its first's key without
/// the `r`): its first's (`r` and the rest), so a rule's quotas are decided in one call on
/// one slot; `None` for every other key, which keeps a slot of its own.
pub(crate) fn stacked_hash_tag(key: &str) -> Option<(String, String)> {
    let rest = key.strip_prefix(BY_STACKED)?;
    let digit = rest.chars().next().filter(char::is_ascii_digit)?;
    let first = &rest[digit.len_utf8()..];
    Some((format!("{BY_RULE}{first}"), format!(":{BY_STACKED}{digit}")))
}

/// A source of quotas by descriptor value: what [`ValueQuotas`] asks.
pub trait ValueQuotaSource: Send + Sync + 'static {
    /// The quota of `value` (`Ok(None)`: the source does not know it; its rule's own quota
    /// applies).
    fn fetch(&self, value: &str) -> Pin<Box<dyn Future<Output = FetchResult> + Send + 'static>>;
}

/// Where one domain's quotas come from value by value (the demo's accounts: each account's
/// quota asked of the service that keeps it): a counter of a rule of `domain` that is not exact (a
/// key-only or prefix rule) takes the quota `source` gives for its descriptor's value; the
/// failsafe quota and pool govern it while the answer comes, and its last answer stays when
/// the source fails. Exact rules keep their own quotas.
#[derive(Clone)]
pub struct ValueQuotas {
    /// The domain.
    pub domain: String,
    /// The source.
    pub source: Arc<dyn ValueQuotaSource>,
}

impl std::fmt::Debug for ValueQuotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueQuotas")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// The quotas the limiters' source answers: one table of quotas by rule, which a reload that
/// keeps the limiters replaces in place (every clone shares it), after the simulated fetch
/// latency if there is one, or from a [`ValueQuotas`] source.
#[derive(Clone, Default)]
pub(crate) struct RuleQuotas {
    table: Arc<ArcSwap<QuotaTable>>,
    latency: Duration,
}

/// One generation's quotas by rule, and the rules whose quotas come by value.
#[derive(Default)]
pub(crate) struct QuotaTable {
    quotas: HashMap<RuleId, Quota>,
    /// The stacked quotas of the rules that have them ([`Rule::stacked`]).
    stacked: HashMap<RuleId, Vec<Quota>>,
    by_value: Option<AskedByValue>,
}

/// The rules whose counters' quotas a [`ValueQuotaSource`] gives, and that source.
type AskedByValue = (Arc<HashSet<RuleId>>, Arc<dyn ValueQuotaSource>);

impl QuotaTable {
    pub(crate) fn new(quotas: HashMap<RuleId, Quota>, stacked: HashMap<RuleId, Vec<Quota>>) -> Self {
        Self {
            quotas,
            stacked,
            by_value: None,
        }
    }

    /// The rules of `by_value`'s domain that are not exact ask its source.
    pub(crate) fn by_value(mut self, rules: &RuleSet, by_value: &ValueQuotas) -> Self {
        let asked: HashSet<RuleId> = rules
            .domain(&by_value.domain)
            .into_iter()
            .flat_map(|domain| domain.rules())
            .filter(|rule| !rule.exact)
            .map(|rule| rule.id.clone())
            .collect();
        self.by_value = Some((Arc::new(asked), Arc::clone(&by_value.source)));
        self
    }

    /// See [`RuleQuotas::quota_of`].
    fn quota_of(&self, key: &str) -> Option<Quota> {
        if let Some(rest) = key.strip_prefix(BY_OVERRIDE) {
            let (quota, _) = rest.split_once(OVERRIDE_END)?;
            return quota.parse().ok();
        }
        if let Some(rest) = key.strip_prefix(BY_STACKED) {
            let mut rest = rest.chars();
            let nth = rest.next()?.to_digit(10)? as usize;
            let id = rule_of(rest.as_str())?;
            return self.stacked.get(&id)?.get(nth.checked_sub(1)?).copied();
        }
        let id = rule_of(key.strip_prefix(BY_RULE)?)?;
        if self
            .by_value
            .as_ref()
            .is_some_and(|(asked, _)| asked.contains(&id))
        {
            return None;
        }
        self.quotas.get(&id).copied()
    }

    /// The source and value to ask for a key of a rule whose quotas come by value, with the
    /// rule's own quota for a value the source does not know.
    fn asked(&self, key: &str) -> Option<(Arc<dyn ValueQuotaSource>, String, Option<Quota>)> {
        let (asked, source) = self.by_value.as_ref()?;
        let counter = key.strip_prefix(BY_RULE)?;
        let rule = rule_of(counter)?;
        if !asked.contains(&rule) {
            return None;
        }
        Some((
            Arc::clone(source),
            last_value_of(counter)?,
            self.quotas.get(&rule).copied(),
        ))
    }
}

impl RuleQuotas {
    pub(crate) fn new(table: QuotaTable, latency: Duration) -> Self {
        Self {
            table: Arc::new(ArcSwap::from_pointee(table)),
            latency,
        }
    }

    /// The quota of a counter key: its override's, or its rule's in the table in force. `None`
    /// for a key whose quota its value's source gives (it keeps the quota it holds).
    pub(crate) fn quota_of(&self, key: &str) -> Option<Quota> {
        self.table.load().quota_of(key)
    }

    /// Puts `table` in force for every limiter on these quotas.
    pub(crate) fn replace(&self, table: QuotaTable) {
        self.table.store(Arc::new(table));
    }
}

impl QuotaSource<String> for RuleQuotas {
    fn fetch(&self, key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        use futures_util::future::Either;
        let table = self.table.load();
        if let Some((source, value, fallback)) = table.asked(key) {
            // The value's quota, or its rule's when the source does not know it.
            let asking = source.fetch(&value);
            return Either::Left(async move { Ok(asking.await?.or(fallback)) });
        }
        // A key of a rule no longer configured: the unknown-key quota (no check reaches it,
        // as every check finds its rule first).
        let quota = table.quota_of(key);
        let latency = self.latency;
        // Without a latency this is ready at its first poll: the check that fetches it is
        // decided on the rule's quota.
        Either::Right(async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            Ok(quota)
        })
    }
}

/// How the engine's limiters are built.
///
/// The quota of a rule's counter is known at once, so the failsafe quota and pool govern a
/// counter only while a simulated fetch latency runs (the demo's `fetch_latency`, the
/// demo's experiment): by default there is none and they never do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterSettings {
    /// The most counters held per algorithm (the keyed limiter's capacity).
    pub capacity: usize,
    /// The quota of a new counter until its rule's quota is fetched.
    pub failsafe: Quota,
    /// The budget all new counters share until their quotas are fetched.
    pub failsafe_pool: Option<Quota>,
    /// How long a fetch of a counter's quota takes (simulated; zero for none).
    pub fetch_latency: Duration,
    /// The longest a fetch may take before the failsafe quota is kept.
    pub fetch_timeout: Duration,
    /// How often a held counter's quota is fetched again (a reload applies new quotas at
    /// once in any case).
    pub refresh: Duration,
}

impl Default for CounterSettings {
    fn default() -> Self {
        Self {
            capacity: sluice::DEFAULT_CAPACITY,
            failsafe: Quota::deny_all(),
            failsafe_pool: None,
            fetch_latency: Duration::ZERO,
            fetch_timeout: sluice::DEFAULT_FETCH_TIMEOUT,
            refresh: Duration::from_secs(24 * 3600),
        }
    }
}

/// One algorithm's counters, whatever the algorithm.
pub(crate) trait AlgorithmCounters: Send + Sync {
    /// Takes `cost` from `key`'s counter (0 peeks), with what giving it back needs and the
    /// quota it was decided on.
    fn take_quoted(&self, key: &str, cost: u64) -> (TakeAnswer, Quota);
    /// The quota `key`'s counter is held under, if it is held.
    fn quota_of(&self, key: &str) -> Option<Quota>;
    /// Charges `cost` to `key`'s counter whatever is left, down to its quota's debt; with the
    /// quota it was charged under.
    fn charge(&self, key: &str, cost: u64) -> (Charge, Quota);
    /// Gives back a take.
    fn give_back(&self, key: &str, receipt: Receipt, cost: u64);
    /// Moves every counter into `target`, a limiter of the same algorithm, each under its
    /// quota in `quotas` (the target's) from its next check on.
    fn migrate_into(&self, target: &dyn AlgorithmCounters, quotas: &RuleQuotas) -> Migrated;
    /// Puts every held counter under its quota in `quotas` at once, in place, one shard at a
    /// time; how many changed quota.
    fn requote(&self, quotas: &RuleQuotas) -> u64;
    /// The limiter's counters.
    fn metrics(&self) -> KeyedMetrics;
    fn as_any(&self) -> &dyn Any;
}

type Limiter<A> = KeyedLimiter<String, A, RuleQuotas>;

/// A take's answer: the decision and its receipt, or a cost that never fits.
pub(crate) type TakeAnswer = Result<(Decision, Receipt), CheckError>;

impl<A: Algorithm> AlgorithmCounters for Limiter<A> {
    #[inline]
    fn take_quoted(&self, key: &str, cost: u64) -> (TakeAnswer, Quota) {
        KeyedLink::new(self, key).take_quoted(cost)
    }

    fn quota_of(&self, key: &str) -> Option<Quota> {
        KeyedLimiter::quota_of(self, key)
    }

    fn charge(&self, key: &str, cost: u64) -> (Charge, Quota) {
        let charge = self.charge_n(key, cost);
        // Held by the charge (a key the store refused has the unknown-key quota).
        let quota = KeyedLimiter::quota_of(self, key).unwrap_or_else(|| self.resolve_quota(key));
        (charge, quota)
    }

    fn give_back(&self, key: &str, receipt: Receipt, cost: u64) {
        KeyedLink::new(self, key).give_back(receipt, cost);
    }

    fn migrate_into(&self, target: &dyn AlgorithmCounters, quotas: &RuleQuotas) -> Migrated {
        match target.as_any().downcast_ref::<Self>() {
            Some(target) => self.migrate_requoted(target, |key| quotas.quota_of(key)),
            None => Migrated::default(),
        }
    }

    fn requote(&self, quotas: &RuleQuotas) -> u64 {
        KeyedLimiter::requote(self, |key| quotas.quota_of(key))
    }

    fn metrics(&self) -> KeyedMetrics {
        KeyedLimiter::metrics(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A keyed limiter of `kind` over `quotas`.
pub(crate) fn build(
    kind: AlgorithmKind,
    quotas: RuleQuotas,
    settings: CounterSettings,
) -> Result<Arc<dyn AlgorithmCounters>, KeyedBuildError> {
    struct Build(RuleQuotas, CounterSettings);
    impl AlgorithmVisitor for Build {
        type Output = Result<Arc<dyn AlgorithmCounters>, KeyedBuildError>;
        fn visit<A: Algorithm>(self, algorithm: A) -> Self::Output {
            // A key whose rule is gone gets the unknown-key quota: nothing is admitted for it
            // (no check reaches it, as every check finds its rule first).
            let settings = self.1;
            let mut builder = KeyedLimiter::builder(algorithm, settings.failsafe)
                .unknown_key_quota(Quota::deny_all())
                .capacity(settings.capacity)
                .refresh_every(settings.refresh)
                .fetch_timeout(settings.fetch_timeout)
                .on_fetch_error(|key: &String, e| tracing::warn!(key = %key, "quota fetch failed: {e}"));
            // A fetch that does not finish at its first poll (a simulated latency) runs on
            // the runtime the engine is built in.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                builder = builder.spawner(move |task| {
                    runtime.spawn(task);
                });
            }
            if let Some(pool) = settings.failsafe_pool {
                builder = builder.failsafe_pool(pool);
            }
            let limiter: Limiter<A> = builder.source(self.0).build()?;
            Ok(Arc::new(limiter))
        }
    }
    kind.visit(Build(quotas, settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stacked quota's counter hashes with its first's, whatever the key holds (`|`, `:`,
    /// braces, multi-byte values); every other key keeps its own slot.
    #[test]
    fn stacked_counters_share_their_first_counters_slot() {
        let rules = RuleSet::from_yaml(
            "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {quota: [1/s, 5/min, 9/h]}\n",
        )
        .unwrap();
        let rule = rules.rules().next().unwrap();
        for value in ["alice", "a:b|c{d}", "émile"] {
            let entries = [Entry { key: "user", value }];
            let mut keys = String::new();
            push_counter(&mut keys, rule, &entries, None);
            let first = 0..keys.len();
            let first_key = keys.clone();
            assert_eq!(stacked_hash_tag(&first_key), None);
            for nth in 1..=2 {
                let start = keys.len();
                push_stacked_counter(&mut keys, first.clone(), nth);
                let (tag, rest) = stacked_hash_tag(&keys[start..]).unwrap();
                assert_eq!((tag.as_str(), rest), (first_key.as_str(), format!(":s{nth}")));
            }
        }
        let mut overridden = String::new();
        push_counter(
            &mut overridden,
            rule,
            &[Entry {
                key: "user",
                value: "x",
            }],
            Some("2/s".parse().unwrap()),
        );
        assert_eq!(stacked_hash_tag(&overridden), None);
    }
}
