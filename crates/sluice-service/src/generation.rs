//! One generation of rules and the counters they are counted on: what a reload replaces whole.

use std::collections::HashMap;
use std::sync::Arc;

use sluice::{AlgorithmKind, KeyedBuildError};
use sluice_descriptors::{Limit, RuleId, RuleSet};
use sluice_http::FieldPolicy;

use crate::counters::{self, QuotaTable, RuleQuotas};
use crate::engine::EngineError;
use crate::settings::EngineSettings;
use crate::stats::{RuleCounts, RuleStats};
use crate::store::{CounterStore, InMemory, OnRedis, RedisCounters};

/// One generation of rules and the counters they are counted on.
pub(crate) struct Generation {
    pub(crate) rules: RuleSet,
    /// The policies answers name, by rule.
    pub(crate) policies: ByRule<FieldPolicy>,
    /// The policies of the stacked quotas of the rules that have them, in order: the rule's
    /// own name with `-2`, `-3`... so each item of the fields has a name of its own.
    pub(crate) stacked_policies: ByRule<Vec<FieldPolicy>>,
    /// The quotas of its rules, by counter key.
    pub(crate) quotas: RuleQuotas,
    pub(crate) store: Box<dyn CounterStore>,
    /// Whether some rule `replaces` another (a request's rules are then all found first).
    pub(crate) replacing: bool,
    /// Each rule's decisions, carried from the generation before while the rule keeps its
    /// place.
    pub(crate) stats: ByRule<Arc<RuleStats>>,
    /// By domain, the decisions of rules earlier generations had and this one has not: a sum
    /// per domain keeps them, so it never goes down when a reload drops a rule.
    pub(crate) retired: HashMap<String, RuleCounts>,
}

/// A map by rule, read by every decision.
pub(crate) type ByRule<V> = HashMap<RuleId, V, foldhash::fast::RandomState>;

impl Generation {
    /// The generation of `rules`. In memory after a generation in memory, its limiters stay
    /// with every counter in place and read the new quotas once nothing else can fail (see
    /// [`crate::Engine::reload`]); a limiter is built only for an algorithm new to the rules.
    pub(crate) fn build(
        rules: RuleSet,
        settings: &EngineSettings,
        redis: Option<&RedisCounters>,
        previous: Option<&Generation>,
    ) -> Result<Self, EngineError> {
        let stats = rules
            .rules()
            .map(|rule| {
                let held = previous.and_then(|p| p.stats.get(&rule.id));
                (rule.id.clone(), held.cloned().unwrap_or_default())
            })
            .collect();
        let mut quotas = HashMap::new();
        let mut stacked = HashMap::new();
        let mut policies = ByRule::default();
        let mut stacked_policies = ByRule::default();
        let mut kinds = vec![settings.algorithm];
        for rule in rules.rules() {
            let kind = rule.algorithm.unwrap_or(settings.algorithm);
            if let Limit::Quota(quota) = rule.limit {
                if redis.is_some() && rule.count_over_limit && kind != AlgorithmKind::TokenBucket {
                    return Err(EngineError::OverLimitOnRedis {
                        rule: rule.id.to_string(),
                    });
                }
                if redis.is_some() {
                    for quota in std::iter::once(&quota).chain(&rule.stacked) {
                        sluice_redis::check_quota(kind, quota).map_err(|source| EngineError::Redis {
                            rule: rule.id.to_string(),
                            source: Box::new(source),
                        })?;
                    }
                }
                quotas.insert(rule.id.clone(), quota);
                if !rule.stacked.is_empty() {
                    stacked.insert(rule.id.clone(), rule.stacked.clone());
                }
            }
            if let Some(policy) = policy_of(rule.name.as_deref()) {
                let base = policy.name().to_owned();
                policies.insert(rule.id.clone(), policy);
                let stacked: Vec<FieldPolicy> = (2..=rule.stacked.len() + 1)
                    .filter_map(|n| FieldPolicy::new(format!("{base}-{n}")))
                    .collect();
                if !stacked.is_empty() {
                    stacked_policies.insert(rule.id.clone(), stacked);
                }
            }
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        let mut table = QuotaTable::new(quotas, stacked);
        if let Some(by_value) = &settings.by_value {
            table = table.by_value(&rules, by_value);
        }
        let held = previous.and_then(|p| Some((p.store.in_memory()?, &p.quotas)));
        let (quotas, store): (RuleQuotas, Box<dyn CounterStore>) = match (redis, held) {
            (None, Some((held, quotas))) => {
                let by_kind = kinds
                    .into_iter()
                    .map(|kind| {
                        let kept = held
                            .by_kind
                            .iter()
                            .find(|(k, _)| *k == kind)
                            .map(|(_, c)| Arc::clone(c));
                        match kept {
                            Some(counters) => Ok((kind, counters)),
                            None => Ok((kind, counters::build(kind, quotas.clone(), settings.counters)?)),
                        }
                    })
                    .collect::<Result<_, KeyedBuildError>>()?;
                quotas.replace(table);
                (quotas.clone(), Box::new(InMemory { by_kind }))
            }
            (None, None) => {
                let quotas = RuleQuotas::new(table, settings.counters.fetch_latency);
                let by_kind = kinds
                    .into_iter()
                    .map(|kind| Ok((kind, counters::build(kind, quotas.clone(), settings.counters)?)))
                    .collect::<Result<_, KeyedBuildError>>()?;
                (quotas, Box::new(InMemory { by_kind }))
            }
            (Some(redis), _) => {
                let quotas = RuleQuotas::new(table, settings.counters.fetch_latency);
                let store = OnRedis::build(&kinds, &quotas, redis, settings.counters)
                    .map_err(|e| EngineError::RedisLimiter(Box::new(e)))?;
                (quotas, Box::new(store))
            }
        };
        let replacing = rules.rules().any(|rule| !rule.replaces.is_empty());
        let retired = previous.map(|p| p.retired_into(&stats)).unwrap_or_default();
        Ok(Self {
            replacing,
            rules,
            policies,
            stacked_policies,
            quotas,
            store,
            stats,
            retired,
        })
    }

    /// The decisions by domain of rules this generation had or inherited and `kept` (the next
    /// generation's rules) has not.
    fn retired_into(&self, kept: &ByRule<Arc<RuleStats>>) -> HashMap<String, RuleCounts> {
        let mut retired = self.retired.clone();
        for domain in self.rules.domains() {
            for rule in domain.rules() {
                if let Some(stats) = self.stats.get(&rule.id).filter(|_| !kept.contains_key(&rule.id)) {
                    *retired.entry(domain.name().to_owned()).or_default() += stats.counts();
                }
            }
        }
        retired
    }

    /// Whether limits of `kind` are counted in this generation.
    pub(crate) fn counts(&self, kind: AlgorithmKind) -> bool {
        self.store.has(kind)
    }
}

/// The policy answers name for a rule called `name` (`sluice` for a rule with no name, or a
/// name the field cannot carry).
fn policy_of(name: Option<&str>) -> Option<FieldPolicy> {
    name.and_then(FieldPolicy::new)
        .or_else(|| FieldPolicy::new("sluice"))
}
