//! The decision every front end asks for: a request's descriptors matched against the rules,
//! each matched limit counted, the answer per descriptor and overall.
//!
//! By default one request's descriptors are decided all-or-nothing: if any limit denies, every
//! unit this request took is given back, so a denied request consumes nothing (envoy's own
//! service counts each descriptor on its own, which [`Counting::Independent`] keeps).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice::{AlgorithmKind, CheckError, Decision, KeyedBuildError, Migrated, Quota, Receipt};
use sluice_descriptors::{Entry, Limit, Rule, RuleId, RuleSet, counter_key};
use sluice_http::FieldPolicy;

use crate::counters::{self, CounterSettings, Counters, RuleQuotas, override_counter, rule_counter};

/// How one request's descriptors are counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Counting {
    /// A denied request consumes nothing from any of its limits.
    #[default]
    AllOrNothing,
    /// Each descriptor is counted on its own, as envoy's ratelimit service does: a request
    /// denied by its second descriptor has still consumed from its first.
    Independent,
}

/// Which rate-limit fields an answer carries for the client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldSet {
    /// None.
    None,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, and `Retry-After` on a denial.
    Draft,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`, and `Retry-After` on a denial.
    Legacy,
    /// Both.
    #[default]
    All,
}

impl std::str::FromStr for FieldSet {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "draft" => Ok(Self::Draft),
            "legacy" => Ok(Self::Legacy),
            "all" => Ok(Self::All),
            other => Err(format!(
                "unknown field set '{other}' (use none, draft, legacy or all)"
            )),
        }
    }
}

impl std::str::FromStr for Counting {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "all_or_nothing" => Ok(Self::AllOrNothing),
            "independent" => Ok(Self::Independent),
            other => Err(format!(
                "unknown counting '{other}' (use all_or_nothing or independent)"
            )),
        }
    }
}

/// Bounds on one request: beyond them it is refused as invalid, before anything is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBounds {
    /// Descriptors per request.
    pub descriptors: usize,
    /// Entries per descriptor.
    pub entries: usize,
    /// Bytes of the domain and of each key and value.
    pub text_bytes: usize,
}

impl Default for RequestBounds {
    fn default() -> Self {
        Self {
            descriptors: 64,
            entries: 16,
            text_bytes: 1024,
        }
    }
}

/// The engine's settings.
#[derive(Debug, Clone, Copy)]
pub struct EngineSettings {
    /// The algorithm of rules that name none.
    pub algorithm: AlgorithmKind,
    /// How a request's descriptors are counted.
    pub counting: Counting,
    /// The fields answers carry.
    pub fields: FieldSet,
    /// Bounds on a request.
    pub bounds: RequestBounds,
    /// The counters' bounds.
    pub counters: CounterSettings,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            algorithm: AlgorithmKind::TokenBucket,
            counting: Counting::default(),
            fields: FieldSet::default(),
            bounds: RequestBounds::default(),
            counters: CounterSettings::default(),
        }
    }
}

/// One descriptor of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DescriptorRequest {
    /// Its key/value entries, in order.
    pub entries: Vec<(String, String)>,
    /// Hits for this descriptor, in place of the request's.
    pub hits: Option<u64>,
    /// A quota the caller sets for it, in place of its rule's.
    pub limit: Option<Quota>,
}

/// A request to decide.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckRequest {
    /// The domain whose rules apply.
    pub domain: String,
    /// Its descriptors.
    pub descriptors: Vec<DescriptorRequest>,
    /// Hits each descriptor adds (1 if not given).
    pub hits: Option<u64>,
}

/// The answer for one descriptor, or for a whole request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within its limits (or not limited).
    Ok,
    /// Over a limit.
    OverLimit,
}

/// The limit a descriptor was counted against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedLimit {
    /// Its quota (the rule's, or the request's override).
    pub quota: Quota,
    /// The rule's name, if it has one.
    pub name: Option<String>,
    /// The rule's place in the rules.
    pub rule: RuleId,
    /// Counted and reported, never denying.
    pub shadow: bool,
}

/// One descriptor's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorStatus {
    /// Over its limit or not (a shadow rule over its limit says so here, and the request
    /// is still admitted).
    pub code: Code,
    /// The limit counted, if a rule with a limit matched.
    pub limit: Option<AppliedLimit>,
    /// Units left.
    pub remaining: u64,
    /// Until the limit is whole again.
    pub reset_after: Duration,
    /// Until this descriptor's hits could be admitted (zero if admitted).
    pub retry_after: Duration,
}

/// A request's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Over a limit if any descriptor not in shadow mode is.
    pub overall: Code,
    /// One per descriptor, in order.
    pub statuses: Vec<DescriptorStatus>,
    /// The rate-limit fields for the client's response, from the most restrictive status.
    pub fields: Vec<(String, String)>,
}

/// Why a request was not decided.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No domain.
    #[error("domain is empty")]
    NoDomain,
    /// No descriptors.
    #[error("descriptors is empty")]
    NoDescriptors,
    /// Too many descriptors.
    #[error("{count} descriptors, at most {max}")]
    TooManyDescriptors {
        /// Sent.
        count: usize,
        /// Allowed.
        max: usize,
    },
    /// A descriptor with no entries, or too many.
    #[error("descriptors[{index}] has {count} entries, 1 to {max} allowed")]
    Entries {
        /// The descriptor.
        index: usize,
        /// Sent.
        count: usize,
        /// Allowed.
        max: usize,
    },
    /// A domain, key or value too long.
    #[error("{field} is {len} bytes, at most {max}")]
    TooLong {
        /// Where.
        field: String,
        /// Sent.
        len: usize,
        /// Allowed.
        max: usize,
    },
}

/// One generation of rules and the counters they are counted on.
struct Generation {
    rules: RuleSet,
    /// The policies answers name, by rule.
    policies: HashMap<RuleId, FieldPolicy>,
    /// The counters by algorithm.
    counters: Vec<(AlgorithmKind, Arc<dyn Counters>)>,
}

impl Generation {
    fn counters(&self, kind: AlgorithmKind) -> Option<&dyn Counters> {
        self.counters
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, counters)| &**counters)
    }
}

/// The decision engine: rules, and the counters of every limit they set.
///
/// # Example
/// ```
/// use sluice_descriptors::RuleSet;
/// use sluice_service::{CheckRequest, Code, DescriptorRequest, Engine, EngineSettings};
/// let rules = RuleSet::from_yaml(
///     "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
/// )?;
/// let engine = Engine::new(rules, EngineSettings::default())?;
/// let request = CheckRequest {
///     domain: "api".into(),
///     descriptors: vec![DescriptorRequest {
///         entries: vec![("user".into(), "alice".into())],
///         ..Default::default()
///     }],
///     hits: None,
/// };
/// assert_eq!(engine.check(&request, false)?.overall, Code::Ok);
/// assert_eq!(engine.check(&request, false)?.overall, Code::Ok);
/// assert_eq!(engine.check(&request, false)?.overall, Code::OverLimit);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Engine {
    current: ArcSwap<Generation>,
    settings: EngineSettings,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("rules", &self.current.load().rules.len())
            .field("settings", &self.settings)
            .finish()
    }
}

/// What a reload kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Counters moved into the new generation with their counts.
    pub moved: u64,
    /// Counters dropped (the new limiters had no room).
    pub dropped: u64,
}

impl Engine {
    /// An engine deciding on `rules`.
    ///
    /// # Errors
    /// A limiter could not be built with the settings.
    pub fn new(rules: RuleSet, settings: EngineSettings) -> Result<Self, KeyedBuildError> {
        let generation = Self::generation(rules, &settings)?;
        Ok(Self {
            current: ArcSwap::from_pointee(generation),
            settings,
        })
    }

    fn generation(rules: RuleSet, settings: &EngineSettings) -> Result<Generation, KeyedBuildError> {
        let mut quotas = HashMap::new();
        let mut policies = HashMap::new();
        let mut kinds = vec![settings.algorithm];
        for rule in rules.rules() {
            if let Limit::Quota(quota) = rule.limit {
                quotas.insert(rule.id.clone(), quota);
            }
            let name = rule.name.as_deref().unwrap_or("sluice");
            let policy = FieldPolicy::new(name)
                .or_else(|| FieldPolicy::new("sluice"))
                .expect("\"sluice\" is a valid policy name");
            policies.insert(rule.id.clone(), policy);
            if let Some(kind) = rule.algorithm
                && !kinds.contains(&kind)
            {
                kinds.push(kind);
            }
        }
        let quotas = RuleQuotas::new(quotas);
        let counters = kinds
            .into_iter()
            .map(|kind| Ok((kind, counters::build(kind, quotas.clone(), settings.counters)?)))
            .collect::<Result<_, KeyedBuildError>>()?;
        Ok(Generation {
            rules,
            policies,
            counters,
        })
    }

    /// Replaces the rules. Every held counter moves into the new generation with its count;
    /// a counter whose rule's quota changed takes the new quota at its next check, by the
    /// core's quota-change rule (what still counts stays consumed, capped).
    ///
    /// # Errors
    /// A limiter could not be built; the running rules stay.
    pub fn reload(&self, rules: RuleSet) -> Result<Reloaded, KeyedBuildError> {
        let next = Self::generation(rules, &self.settings)?;
        let old = self.current.load_full();
        let mut reloaded = Reloaded::default();
        for (kind, counters) in &old.counters {
            if let Some(target) = next.counters(*kind) {
                let Migrated { moved, dropped, .. } = counters.migrate_into(target);
                reloaded.moved += moved;
                reloaded.dropped += dropped;
            }
        }
        self.current.store(Arc::new(next));
        Ok(reloaded)
    }

    /// The rules in force.
    pub fn with_rules<T>(&self, read: impl FnOnce(&RuleSet) -> T) -> T {
        read(&self.current.load().rules)
    }

    /// The counters held, over every algorithm.
    pub fn entries(&self) -> u64 {
        self.current
            .load()
            .counters
            .iter()
            .map(|(_, counters)| counters.metrics().entries)
            .sum()
    }

    /// Decides `request`; with `peek`, counts nothing and says what a check would answer.
    ///
    /// # Errors
    /// The request is outside the bounds ([`RequestBounds`]), or names no domain or no
    /// descriptor.
    pub fn check(&self, request: &CheckRequest, peek: bool) -> Result<Verdict, RequestError> {
        self.validate(request)?;
        let generation = self.current.load();
        let hits = request.hits.filter(|h| *h > 0).unwrap_or(1);
        let matched: Vec<Option<&Rule>> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let entries: Vec<Entry<'_>> = descriptor
                    .entries
                    .iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect();
                generation.rules.find(&request.domain, &entries)
            })
            .collect();
        let replaced = replaced_names(&matched);
        let mut statuses = Vec::with_capacity(request.descriptors.len());
        // Takes to give back if the request is denied: (status, counters, key, receipt, cost).
        let mut taken: Vec<(usize, &dyn Counters, String, Receipt, u64)> = Vec::new();
        let mut denied = false;
        for (descriptor, rule) in request.descriptors.iter().zip(&matched) {
            let Some(rule) = rule.filter(|rule| !is_replaced(rule, &replaced)) else {
                statuses.push(unlimited());
                continue;
            };
            let quota = match (descriptor.limit, rule.limit) {
                (Some(quota), _) => quota,
                (None, Limit::Quota(quota)) => quota,
                (None, Limit::Unlimited) => {
                    statuses.push(unlimited());
                    continue;
                }
            };
            let kind = rule.algorithm.unwrap_or(self.settings.algorithm);
            let Some(counters) = generation.counters(kind) else {
                statuses.push(unlimited());
                continue;
            };
            let entries: Vec<Entry<'_>> = descriptor
                .entries
                .iter()
                .map(|(key, value)| Entry { key, value })
                .collect();
            let place = counter_key(rule, &entries);
            let key = match descriptor.limit {
                Some(quota) => override_counter(quota, &place),
                None => rule_counter(&place),
            };
            let cost = descriptor.hits.filter(|h| *h > 0).unwrap_or(hits);
            // After a denial that counts, the rest are only looked at.
            let cost = if peek || (denied && self.settings.counting == Counting::AllOrNothing) {
                0
            } else {
                cost
            };
            let applied = AppliedLimit {
                quota,
                name: rule.name.clone(),
                rule: rule.id.clone(),
                shadow: rule.shadow_mode,
            };
            let status = match counters.take(&key, cost) {
                Ok((decision, receipt)) => {
                    if decision.is_allowed() && cost > 0 {
                        taken.push((statuses.len(), counters, key, receipt, cost));
                    }
                    limited(decision, applied)
                }
                Err(CheckError::CostExceedsCapacity { .. }) => DescriptorStatus {
                    code: Code::OverLimit,
                    limit: Some(applied),
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    retry_after: Duration::MAX,
                },
            };
            if status.code == Code::OverLimit && !rule.shadow_mode {
                denied = true;
            }
            statuses.push(status);
        }
        if denied && self.settings.counting == Counting::AllOrNothing {
            for (index, counters, key, receipt, cost) in taken {
                counters.give_back(&key, receipt, cost);
                if let Some(status) = statuses.get_mut(index) {
                    let capacity = status.limit.as_ref().map_or(0, |limit| limit.quota.capacity());
                    status.remaining = status.remaining.saturating_add(cost).min(capacity);
                }
            }
        }
        let overall = if denied { Code::OverLimit } else { Code::Ok };
        let fields = self.fields(&generation, &statuses, denied);
        Ok(Verdict {
            overall,
            statuses,
            fields,
        })
    }

    fn validate(&self, request: &CheckRequest) -> Result<(), RequestError> {
        let bounds = self.settings.bounds;
        let long = |field: String, text: &str| {
            (text.len() > bounds.text_bytes).then_some(RequestError::TooLong {
                field,
                len: text.len(),
                max: bounds.text_bytes,
            })
        };
        if request.domain.is_empty() {
            return Err(RequestError::NoDomain);
        }
        if let Some(e) = long("domain".into(), &request.domain) {
            return Err(e);
        }
        let count = request.descriptors.len();
        if count == 0 {
            return Err(RequestError::NoDescriptors);
        }
        if count > bounds.descriptors {
            return Err(RequestError::TooManyDescriptors {
                count,
                max: bounds.descriptors,
            });
        }
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let count = descriptor.entries.len();
            if count == 0 || count > bounds.entries {
                return Err(RequestError::Entries {
                    index,
                    count,
                    max: bounds.entries,
                });
            }
            for (i, (key, value)) in descriptor.entries.iter().enumerate() {
                if let Some(e) = long(format!("descriptors[{index}].entries[{i}].key"), key)
                    .or_else(|| long(format!("descriptors[{index}].entries[{i}].value"), value))
                {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// The fields of the most restrictive status: a denying one, else the limited one with
    /// the fewest units left.
    fn fields(
        &self,
        generation: &Generation,
        statuses: &[DescriptorStatus],
        denied: bool,
    ) -> Vec<(String, String)> {
        if self.settings.fields == FieldSet::None {
            return Vec::new();
        }
        let counts = |status: &&DescriptorStatus| status.limit.as_ref().is_some_and(|limit| !limit.shadow);
        let chosen = if denied {
            statuses
                .iter()
                .filter(counts)
                .find(|status| status.code == Code::OverLimit)
        } else {
            statuses
                .iter()
                .filter(counts)
                .min_by_key(|status| status.remaining)
        };
        let Some(status) = chosen else {
            return Vec::new();
        };
        let Some(limit) = &status.limit else {
            return Vec::new();
        };
        let Some(policy) = generation.policies.get(&limit.rule) else {
            return Vec::new();
        };
        let decision = if status.code == Code::Ok {
            Decision::allowed(
                limit.quota.capacity(),
                status.remaining,
                saturating_nanos(status.reset_after),
            )
        } else {
            Decision::denied(
                limit.quota.capacity(),
                status.remaining,
                saturating_nanos(status.reset_after),
                saturating_nanos(status.retry_after),
            )
        };
        let wanted = |name: &str| match self.settings.fields {
            FieldSet::None => false,
            FieldSet::All => true,
            FieldSet::Draft => !name.starts_with("x-"),
            FieldSet::Legacy => !name.starts_with("ratelimit"),
        };
        policy
            .fields(&decision, Some(limit.quota))
            .iter()
            .filter(|(name, _)| wanted(name.as_str()))
            .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
            .collect()
    }
}

fn saturating_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

fn unlimited() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok,
        limit: None,
        remaining: 0,
        reset_after: Duration::ZERO,
        retry_after: Duration::ZERO,
    }
}

fn limited(decision: Decision, limit: AppliedLimit) -> DescriptorStatus {
    DescriptorStatus {
        code: if decision.is_allowed() {
            Code::Ok
        } else {
            Code::OverLimit
        },
        limit: Some(limit),
        remaining: decision.remaining(),
        reset_after: decision.reset_after(),
        retry_after: decision.retry_after(),
    }
}

/// The names of limits some matched rule replaces.
fn replaced_names<'a>(matched: &[Option<&'a Rule>]) -> HashSet<&'a str> {
    matched
        .iter()
        .flatten()
        .flat_map(|rule| rule.replaces.iter().map(String::as_str))
        .collect()
}

fn is_replaced(rule: &Rule, replaced: &HashSet<&str>) -> bool {
    !replaced.is_empty() && rule.name.as_deref().is_some_and(|name| replaced.contains(name))
}
