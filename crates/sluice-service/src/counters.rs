//! The counters the engine decides on: one bounded keyed limiter per algorithm the rules use,
//! keyed by counter keys (a rule's place and the request's values), each key's quota given by
//! its rule at once (a source that never waits).

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice::{
    Algorithm, AlgorithmKind, AlgorithmVisitor, CheckError, Decision, FetchResult, KeyedBuildError,
    KeyedLimiter, KeyedLink, KeyedMetrics, Link, Migrated, Quota, QuotaSource, Receipt,
};
use sluice_descriptors::{RuleId, rule_of};

/// How a counter key starts: governed by its rule's quota, or by a quota the request set.
const BY_RULE: char = 'r';
const BY_OVERRIDE: char = 'o';
/// Ends an override's quota text (which never holds it).
const OVERRIDE_END: char = '\u{1d}';

/// The key of a counter governed by its rule's quota.
pub(crate) fn rule_counter(counter_key: &str) -> String {
    let mut key = String::with_capacity(1 + counter_key.len());
    key.push(BY_RULE);
    key.push_str(counter_key);
    key
}

/// The key of a counter governed by a quota the request set for it: another counter than the
/// rule's own, so an override never spends the configured limit.
pub(crate) fn override_counter(quota: Quota, counter_key: &str) -> String {
    format!("{BY_OVERRIDE}{quota}{OVERRIDE_END}{counter_key}")
}

/// The quotas of one generation of rules, by rule: what the limiters' source answers.
#[derive(Clone, Default)]
pub(crate) struct RuleQuotas(Arc<HashMap<RuleId, Quota>>);

impl RuleQuotas {
    pub(crate) fn new(quotas: HashMap<RuleId, Quota>) -> Self {
        Self(Arc::new(quotas))
    }

    /// The quota of a counter key: its override's, or its rule's in this generation.
    pub(crate) fn quota_of(&self, key: &str) -> Option<Quota> {
        if let Some(rest) = key.strip_prefix(BY_OVERRIDE) {
            let (quota, _) = rest.split_once(OVERRIDE_END)?;
            return quota.parse().ok();
        }
        let id = rule_of(key.strip_prefix(BY_RULE)?)?;
        self.0.get(&id).copied()
    }
}

impl QuotaSource<String> for RuleQuotas {
    fn fetch(&self, key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        // A key of a rule no longer configured: the unknown-key quota (no check reaches it,
        // as every check finds its rule first).
        std::future::ready(Ok(self.quota_of(key)))
    }
}

/// How the engine's limiters are built.
#[derive(Debug, Clone, Copy)]
pub struct CounterSettings {
    /// The most counters held per algorithm (the keyed limiter's capacity).
    pub capacity: usize,
}

impl Default for CounterSettings {
    fn default() -> Self {
        Self {
            capacity: sluice::DEFAULT_CAPACITY,
        }
    }
}

/// One algorithm's counters, whatever the algorithm.
pub(crate) trait Counters: Send + Sync {
    /// Takes `cost` from `key`'s counter (0 peeks).
    fn take(&self, key: &str, cost: u64) -> Result<(Decision, Receipt), CheckError>;
    /// Gives back a take.
    fn give_back(&self, key: &str, receipt: Receipt, cost: u64);
    /// Moves every counter into `target`, a limiter of the same algorithm, each under its
    /// quota in `quotas` (the target's) from its next check on.
    fn migrate_into(&self, target: &dyn Counters, quotas: &RuleQuotas) -> Migrated;
    /// The limiter's counters.
    fn metrics(&self) -> KeyedMetrics;
    fn as_any(&self) -> &dyn Any;
}

type Limiter<A> = KeyedLimiter<String, A, RuleQuotas>;

impl<A: Algorithm> Counters for Limiter<A> {
    #[inline]
    fn take(&self, key: &str, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        KeyedLink::new(self, key).take(cost)
    }

    fn give_back(&self, key: &str, receipt: Receipt, cost: u64) {
        KeyedLink::new(self, key).give_back(receipt, cost);
    }

    fn migrate_into(&self, target: &dyn Counters, quotas: &RuleQuotas) -> Migrated {
        match target.as_any().downcast_ref::<Self>() {
            Some(target) => self.migrate_requoted(target, |key| quotas.quota_of(key)),
            None => Migrated::default(),
        }
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
) -> Result<Arc<dyn Counters>, KeyedBuildError> {
    struct Build(RuleQuotas, CounterSettings);
    impl AlgorithmVisitor for Build {
        type Output = Result<Arc<dyn Counters>, KeyedBuildError>;
        fn visit<A: Algorithm>(self, algorithm: A) -> Self::Output {
            // Every key's quota is known at once, so the failsafe and unknown-key quotas
            // only ever govern a key whose rule is gone: nothing is admitted for it.
            let limiter: Limiter<A> = KeyedLimiter::builder(algorithm, Quota::deny_all())
                .unknown_key_quota(Quota::deny_all())
                .capacity(self.1.capacity)
                // Rules change only by a reload, which makes every refresh due at once.
                .refresh_every(Duration::from_secs(24 * 3600))
                .source(self.0)
                .build()?;
            Ok(Arc::new(limiter))
        }
    }
    kind.visit(Build(quotas, settings))
}
