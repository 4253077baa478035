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
use sluice_descriptors::{Entry, Limit, Rule, RuleId, RuleSet};
use sluice_http::FieldPolicy;

use crate::counters::{self, CounterSettings, Counters, QuotaTable, RuleQuotas, ValueQuotas, write_counter};
use crate::shared::{self, RedisCounters, SharedCounters};
use crate::stats::{FrontEnd, Latency, LatencySnapshot, RuleCounts, RuleStats};

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

/// Which rate-limit fields an answer carries for the client. None by default, as in envoy's
/// own service: Envoy's rate-limit filter writes the draft's fields itself from the statuses
/// (`enable_x_ratelimit_headers`), so an answer's fields are for callers that want them
/// written for them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldSet {
    /// None.
    #[default]
    None,
    /// The IETF draft's `RateLimit-Policy` and `RateLimit`, and `Retry-After` on a denial.
    Draft,
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`, and `Retry-After` on a denial.
    Legacy,
    /// Both.
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
#[derive(Debug, Clone)]
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
    /// A domain whose quotas are asked value by value, if any.
    pub by_value: Option<ValueQuotas>,
    /// At most this many denials a second are logged (target `sluice::denied`, naming the
    /// rule and the key); 0 logs none.
    pub denied_log_per_second: u32,
    /// Whether decisions are counted per rule and timed per front end (what an exporter
    /// reads); off, a decision costs nothing more than before they were.
    pub observe: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            algorithm: AlgorithmKind::TokenBucket,
            counting: Counting::default(),
            fields: FieldSet::default(),
            bounds: RequestBounds::default(),
            counters: CounterSettings::default(),
            by_value: None,
            denied_log_per_second: 0,
            observe: true,
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

/// Why an engine could not be built (or a reload was refused: the running rules stay).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A memory limiter refused a setting.
    #[error(transparent)]
    Keyed(#[from] KeyedBuildError),
    /// A rule's algorithm or quota cannot be counted on Redis.
    #[error("rule {rule}: {source}")]
    Redis {
        /// The rule, as its place in the rules reads.
        rule: String,
        /// Why.
        source: Box<sluice_redis::Error>,
    },
    /// A Redis limiter could not be built.
    #[error("redis: {0}")]
    RedisLimiter(Box<sluice_redis::Error>),
}

/// Where one generation's counters are.
pub(crate) enum Store {
    /// In this process, by algorithm.
    Memory(Vec<(AlgorithmKind, Arc<dyn Counters>)>),
    /// On Redis, by algorithm.
    Redis(Vec<(AlgorithmKind, Arc<dyn SharedCounters>)>),
}

/// One generation of rules and the counters they are counted on.
pub(crate) struct Generation {
    pub(crate) rules: RuleSet,
    /// The policies answers name, by rule.
    policies: HashMap<RuleId, FieldPolicy>,
    /// The quotas of its rules, by counter key.
    quotas: RuleQuotas,
    pub(crate) store: Store,
    /// Each rule's decisions, carried from the generation before while the rule keeps its
    /// place.
    pub(crate) stats: HashMap<RuleId, Arc<RuleStats>>,
}

impl Generation {
    pub(crate) fn memory(&self, kind: AlgorithmKind) -> Option<&dyn Counters> {
        match &self.store {
            Store::Memory(counters) => counters.iter().find(|(k, _)| *k == kind).map(|(_, c)| &**c),
            Store::Redis(_) => None,
        }
    }

    pub(crate) fn shared(&self, kind: AlgorithmKind) -> Option<&dyn SharedCounters> {
        match &self.store {
            Store::Redis(counters) => counters.iter().find(|(k, _)| *k == kind).map(|(_, c)| &**c),
            Store::Memory(_) => None,
        }
    }

    fn has(&self, kind: AlgorithmKind) -> bool {
        match &self.store {
            Store::Memory(counters) => counters.iter().any(|(k, _)| *k == kind),
            Store::Redis(counters) => counters.iter().any(|(k, _)| *k == kind),
        }
    }
}

/// One limit a request's descriptor is counted against.
struct Count {
    /// The descriptor's place in the request.
    index: usize,
    kind: AlgorithmKind,
    key: String,
    cost: u64,
    limit: AppliedLimit,
}

/// The decision engine: rules, and the counters of every limit they set (in memory, or on
/// Redis with [`Engine::on_redis`]).
///
/// # Example
/// ```
/// use sluice_descriptors::RuleSet;
/// use sluice_service::{CheckRequest, Code, DescriptorRequest, Engine, EngineSettings};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
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
/// assert_eq!(engine.check(&request, false).await?.overall, Code::Ok);
/// assert_eq!(engine.check(&request, false).await?.overall, Code::Ok);
/// assert_eq!(engine.check(&request, false).await?.overall, Code::OverLimit);
/// # Ok(()) }
/// ```
pub struct Engine {
    pub(crate) current: ArcSwap<Generation>,
    pub(crate) settings: EngineSettings,
    redis: Option<RedisCounters>,
    /// Decision latency by front end ([`FrontEnd`] order).
    latency: [Latency; 3],
    /// Paces the denied-request log.
    denied_log: Option<sluice::RateLimiter<sluice::TokenBucket>>,
    /// The engine that took this one's place ([`Engine::replaced_by`]).
    successor: std::sync::OnceLock<Arc<Engine>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("rules", &self.current.load().rules.len())
            .field("settings", &self.settings)
            .field("redis", &self.redis)
            .finish()
    }
}

/// What a reload kept.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Counters kept with their counts: in place on a reload, moved into the other engine on
    /// a migration (none on Redis, where the counts stay in Redis).
    pub moved: u64,
    /// Counters dropped: the other engine had no room, or no rule uses their algorithm any
    /// more.
    pub dropped: u64,
}

/// One rule's decisions, as [`Engine::rule_counts`] reports them.
#[derive(Debug, Clone)]
pub struct RuleReport {
    /// Its domain.
    pub domain: String,
    /// Its place.
    pub rule: RuleId,
    /// Its name, if it has one.
    pub name: Option<String>,
    /// Its limit.
    pub limit: Limit,
    /// In shadow mode.
    pub shadow: bool,
    /// Its decisions so far (since it took this place, across reloads).
    pub counts: RuleCounts,
}

impl Engine {
    /// An engine deciding on `rules`, its counters in this process.
    ///
    /// # Errors
    /// A limiter could not be built with the settings.
    pub fn new(rules: RuleSet, settings: EngineSettings) -> Result<Self, BuildError> {
        let generation = Self::generation(rules, &settings, None, None)?;
        Ok(Self::around(generation, settings, None))
    }

    /// An engine deciding on `rules`, its counters on Redis: every engine on the same Redis
    /// and prefix shares each limit. Must run inside a tokio runtime.
    ///
    /// A request's descriptors are still decided all-or-nothing by default: each limit is
    /// first looked at, and taken only if all would admit; a limit another process fills
    /// between the look and the take denies the request and leaves what the others took.
    ///
    /// # Errors
    /// A rule whose algorithm has no Redis script or whose quota Redis cannot hold exactly
    /// (named by its place), or a limiter that could not be built.
    pub fn on_redis(
        rules: RuleSet,
        settings: EngineSettings,
        redis: RedisCounters,
    ) -> Result<Self, BuildError> {
        let generation = Self::generation(rules, &settings, Some(&redis), None)?;
        Ok(Self::around(generation, settings, Some(redis)))
    }

    fn around(generation: Generation, settings: EngineSettings, redis: Option<RedisCounters>) -> Self {
        let denied_log =
            std::num::NonZeroU64::new(u64::from(settings.denied_log_per_second)).and_then(|per_second| {
                sluice::RateLimiter::new(sluice::TokenBucket, Quota::per_second(per_second)).ok()
            });
        Self {
            current: ArcSwap::from_pointee(generation),
            settings,
            redis,
            latency: Default::default(),
            denied_log,
            successor: std::sync::OnceLock::new(),
        }
    }

    /// Says that `next` took this engine's place (a reload built a new one): the layer
    /// backends ([`LayerBackend`](crate::LayerBackend)) on this engine ask `next` from now on,
    /// so requests still held by an old layer (waiting for capacity) are decided by the
    /// running engine. Only the first successor counts; `self` itself is ignored.
    ///
    /// # Example
    /// ```
    /// use std::sync::Arc;
    /// use sluice_descriptors::{DomainRules, RuleSet};
    /// use sluice_service::{Engine, EngineSettings, LayerBackend};
    /// use sluice_http::LimitBackend;
    /// let rules = || -> Result<RuleSet, Box<dyn std::error::Error>> {
    ///     let domain = DomainRules::by_value("accounts", "account", [("alice".to_string(), "1/h".parse()?)], None)?;
    ///     Ok(RuleSet::from_domains(vec![domain])?)
    /// };
    /// let old = Arc::new(Engine::new(rules()?, EngineSettings::default())?);
    /// let backend = LayerBackend::new(Arc::clone(&old), "accounts", "account");
    /// let new = Arc::new(Engine::new(rules()?, EngineSettings::default())?);
    /// assert!(backend.check("alice", 1).into_ready().ok().unwrap()?.is_allowed());
    /// old.replaced_by(Arc::clone(&new));
    /// // Decided by the new engine, whose alice has her hour's request left.
    /// assert!(backend.check("alice", 1).into_ready().ok().unwrap()?.is_allowed());
    /// assert!(!backend.check("alice", 1).into_ready().ok().unwrap()?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replaced_by(&self, next: Arc<Engine>) {
        if !std::ptr::eq(self, &*next) {
            let _ = self.successor.set(next);
        }
    }

    /// The engine running now in this one's line: itself, or the last that replaced it.
    pub(crate) fn latest(self: &Arc<Self>) -> &Arc<Self> {
        let mut engine = self;
        while let Some(next) = engine.successor.get() {
            engine = next;
        }
        engine
    }

    fn generation(
        rules: RuleSet,
        settings: &EngineSettings,
        redis: Option<&RedisCounters>,
        previous: Option<&Generation>,
    ) -> Result<Generation, BuildError> {
        let stats = rules
            .rules()
            .map(|rule| {
                let held = previous.and_then(|p| p.stats.get(&rule.id));
                (rule.id.clone(), held.cloned().unwrap_or_default())
            })
            .collect();
        let mut quotas = HashMap::new();
        let mut policies = HashMap::new();
        let mut kinds = vec![settings.algorithm];
        for rule in rules.rules() {
            let kind = rule.algorithm.unwrap_or(settings.algorithm);
            if let Limit::Quota(quota) = rule.limit {
                if redis.is_some() {
                    sluice_redis::check_quota(kind, &quota).map_err(|source| BuildError::Redis {
                        rule: rule.id.to_string(),
                        source: Box::new(source),
                    })?;
                }
                quotas.insert(rule.id.clone(), quota);
            }
            let name = rule.name.as_deref().unwrap_or("sluice");
            let policy = FieldPolicy::new(name)
                .or_else(|| FieldPolicy::new("sluice"))
                .expect("\"sluice\" is a valid policy name");
            policies.insert(rule.id.clone(), policy);
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        let mut table = QuotaTable::new(quotas);
        if let Some(by_value) = &settings.by_value {
            table = table.by_value(&rules, by_value);
        }
        let (quotas, store) = match (redis, previous.map(|p| (&p.store, &p.quotas))) {
            // In memory after a generation in memory: its limiters stay, with every counter
            // in place, and read the new table once nothing else can fail; a limiter is built
            // only for an algorithm new to the rules.
            (None, Some((Store::Memory(held), quotas))) => {
                let counters = kinds
                    .into_iter()
                    .map(|kind| {
                        let kept = held.iter().find(|(k, _)| *k == kind).map(|(_, c)| Arc::clone(c));
                        match kept {
                            Some(counters) => Ok((kind, counters)),
                            None => Ok((kind, counters::build(kind, quotas.clone(), settings.counters)?)),
                        }
                    })
                    .collect::<Result<_, KeyedBuildError>>()?;
                quotas.replace(table);
                (quotas.clone(), Store::Memory(counters))
            }
            (None, _) => {
                let quotas = RuleQuotas::new(table, settings.counters.fetch_latency);
                let counters = kinds
                    .into_iter()
                    .map(|kind| Ok((kind, counters::build(kind, quotas.clone(), settings.counters)?)))
                    .collect::<Result<_, KeyedBuildError>>()?;
                (quotas, Store::Memory(counters))
            }
            (Some(redis), _) => {
                let quotas = RuleQuotas::new(table, settings.counters.fetch_latency);
                let counters = kinds
                    .into_iter()
                    .map(|kind| {
                        Ok((
                            kind,
                            shared::build(kind, quotas.clone(), redis, settings.counters)?,
                        ))
                    })
                    .collect::<Result<_, sluice_redis::Error>>()
                    .map_err(|e| BuildError::RedisLimiter(Box::new(e)))?;
                (quotas, Store::Redis(counters))
            }
        };
        Ok(Generation {
            rules,
            policies,
            quotas,
            store,
            stats,
        })
    }

    /// Replaces the rules. Every held counter stays with its count: in memory the limiters
    /// stay and each counter takes its rule's new quota in place, one shard locked at a time
    /// (checks elsewhere go on), by the core's quota-change rule (what still counts stays
    /// consumed, capped); on Redis the counts never left.
    ///
    /// # Errors
    /// A limiter could not be built, or (on Redis) a rule cannot be counted there; the
    /// running rules stay.
    pub fn reload(&self, rules: RuleSet) -> Result<Reloaded, BuildError> {
        let old = self.current.load_full();
        let next = Arc::new(Self::generation(
            rules,
            &self.settings,
            self.redis.as_ref(),
            Some(&old),
        )?);
        self.current.store(Arc::clone(&next));
        let mut reloaded = Reloaded::default();
        if let (Store::Memory(before), Store::Memory(after)) = (&old.store, &next.store) {
            for (kind, counters) in before {
                let entries = counters.metrics().entries;
                if after.iter().any(|(k, c)| k == kind && Arc::ptr_eq(c, counters)) {
                    // Kept: each counter takes its rule's new quota now, one shard at a time.
                    counters.requote(&next.quotas);
                    reloaded.moved += entries;
                } else {
                    // An algorithm no rule uses any more: its counters go with the old rules.
                    reloaded.dropped += entries;
                }
            }
        }
        Ok(reloaded)
    }

    /// Moves every counter held in memory into `target`, an engine of other settings (its
    /// capacity, failsafe...) that takes this one's place: each keeps its count, under its
    /// quota in `target`'s rules. `None` if either keeps its counters on Redis (they stay
    /// there) or `target` has no limiter of an algorithm this one counts on.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::RuleSet;
    /// use sluice_service::{CounterSettings, Engine, EngineSettings};
    /// let rules = || RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n");
    /// let running = Engine::new(rules()?, EngineSettings::default())?;
    /// let bigger = EngineSettings {
    ///     counters: CounterSettings { capacity: 1_000_000, ..CounterSettings::default() },
    ///     ..EngineSettings::default()
    /// };
    /// let next = Engine::new(rules()?, bigger)?;
    /// assert_eq!(running.migrate_into(&next).map(|moved| moved.moved), Some(0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn migrate_into(&self, target: &Engine) -> Option<Reloaded> {
        let (from, to) = (self.current.load(), target.current.load());
        let Store::Memory(counters) = &from.store else {
            return None;
        };
        // Every pair found before anything moves: a move is whole or not at all.
        let pairs: Vec<(&dyn Counters, &dyn Counters)> = counters
            .iter()
            .map(|(kind, counters)| Some((&**counters, to.memory(*kind)?)))
            .collect::<Option<_>>()?;
        Some(move_counters(pairs.into_iter(), &to.quotas))
    }

    /// Counts each limited status of a decided request under its rule.
    fn record(&self, generation: &Generation, request: &CheckRequest, statuses: &[DescriptorStatus]) {
        let hits = request.hits.filter(|h| *h > 0).unwrap_or(1);
        for (status, descriptor) in statuses.iter().zip(&request.descriptors) {
            let Some(limit) = &status.limit else { continue };
            let over = status.code == Code::OverLimit;
            let key = || Some(descriptor_key(descriptor));
            if over && !limit.shadow {
                self.log_denied(&limit.rule, || descriptor_key(descriptor));
            }
            if !self.settings.observe {
                continue;
            }
            if let Some(stats) = generation.stats.get(&limit.rule) {
                let hits = descriptor.hits.filter(|h| *h > 0).unwrap_or(hits);
                stats.record(hits, over, limit.shadow, key);
            }
        }
    }

    /// Logs a denial, at most `denied_log_per_second` a second.
    pub(crate) fn log_denied(&self, rule: &RuleId, key: impl FnOnce() -> String) {
        if self
            .denied_log
            .as_ref()
            .is_some_and(|pace| pace.check().is_allowed())
        {
            tracing::info!(target: "sluice::denied", rule = %rule, key = key(), "denied");
        }
    }

    /// Every rule's decisions so far, with its domain, name and limit.
    pub fn rule_counts(&self) -> Vec<RuleReport> {
        let generation = self.current.load();
        generation
            .rules
            .domains()
            .flat_map(|domain| domain.rules().map(move |rule| (domain.name(), rule)))
            .map(|(domain, rule)| RuleReport {
                domain: domain.to_owned(),
                rule: rule.id.clone(),
                name: rule.name.clone(),
                limit: rule.limit,
                shadow: rule.shadow_mode,
                counts: generation
                    .stats
                    .get(&rule.id)
                    .map(|s| s.counts())
                    .unwrap_or_default(),
            })
            .collect()
    }

    /// The keys `rule` (its place as [`RuleId`]'s text reads, or its name) denied most over
    /// about the last minute, most first, at most `n`; `None` if no rule is so called.
    pub fn top_denied(&self, rule: &str, n: usize) -> Option<Vec<(String, u64)>> {
        let generation = self.current.load();
        let found = generation
            .rules
            .rules()
            .find(|r| r.id.to_string() == rule || r.name.as_deref() == Some(rule))?;
        Some(
            generation
                .stats
                .get(&found.id)
                .map(|s| s.top(n))
                .unwrap_or_default(),
        )
    }

    /// Times one decision asked through `front` (nothing unless [`EngineSettings::observe`]).
    pub fn record_latency(&self, front: FrontEnd, took: Duration) {
        if self.settings.observe {
            self.latency[front as usize].record(took);
        }
    }

    /// Whether decisions are counted and timed ([`EngineSettings::observe`]).
    pub fn observes(&self) -> bool {
        self.settings.observe
    }

    /// The decision latency through `front` so far.
    pub fn latency(&self, front: FrontEnd) -> LatencySnapshot {
        self.latency[front as usize].snapshot()
    }

    /// The counters held in memory and their store's counts, over every algorithm (none on
    /// Redis), with the capacity they share.
    pub fn store_metrics(&self) -> Option<(sluice::KeyedMetrics, u64)> {
        let generation = self.current.load();
        let Store::Memory(counters) = &generation.store else {
            return None;
        };
        let mut sum = sluice::KeyedMetrics::default();
        for (_, c) in counters {
            sum += c.metrics();
        }
        let capacity = u64::try_from(self.settings.counters.capacity).unwrap_or(u64::MAX);
        Some((sum, capacity.saturating_mul(counters.len() as u64)))
    }

    /// The Redis the counters are on, if they are.
    pub fn redis(&self) -> Option<&RedisCounters> {
        self.redis.as_ref()
    }

    /// The rules in force.
    pub fn with_rules<T>(&self, read: impl FnOnce(&RuleSet) -> T) -> T {
        read(&self.current.load().rules)
    }

    /// The counters held in memory, over every algorithm (0 on Redis).
    pub fn entries(&self) -> u64 {
        match &self.current.load().store {
            Store::Memory(counters) => counters.iter().map(|(_, c)| c.metrics().entries).sum(),
            Store::Redis(_) => 0,
        }
    }

    /// Decides `request`; with `peek`, counts nothing and says what a check would answer.
    /// In memory this never waits; on Redis it waits for Redis (or its failure policy).
    ///
    /// # Errors
    /// The request is outside the bounds ([`RequestBounds`]), or names no domain or no
    /// descriptor.
    pub async fn check(&self, request: &CheckRequest, peek: bool) -> Result<Verdict, RequestError> {
        self.validate(request)?;
        let generation = self.current.load_full();
        let mut statuses = vec![unlimited(); request.descriptors.len()];
        let counts = self.counts(&generation, request, peek);
        let denied = match &generation.store {
            Store::Memory(_) => self.count_in_memory(&generation, counts, &mut statuses, peek),
            Store::Redis(_) => {
                self.count_on_redis(&generation, counts, &mut statuses, peek)
                    .await
            }
        };
        if !peek {
            self.record(&generation, request, &statuses);
        }
        let overall = if denied { Code::OverLimit } else { Code::Ok };
        let fields = self.fields(&generation, &statuses, denied);
        Ok(Verdict {
            overall,
            statuses,
            fields,
        })
    }

    /// The limits the request's descriptors are counted against: each descriptor's rule (if
    /// one matches, is not replaced and has a limit), its counter and its cost.
    fn counts(&self, generation: &Generation, request: &CheckRequest, peek: bool) -> Vec<Count> {
        let hits = request.hits.filter(|h| *h > 0).unwrap_or(1);
        let matched: Vec<(Vec<Entry<'_>>, Option<&Rule>)> = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let entries: Vec<Entry<'_>> = descriptor
                    .entries
                    .iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect();
                let rule = generation.rules.find(&request.domain, &entries);
                (entries, rule)
            })
            .collect();
        let replaced = replaced_names(matched.iter().map(|(_, rule)| *rule));
        let mut counts = Vec::with_capacity(matched.len());
        for (index, (descriptor, (entries, rule))) in request.descriptors.iter().zip(&matched).enumerate() {
            let Some(rule) = rule.filter(|rule| !is_replaced(rule, &replaced)) else {
                continue;
            };
            let quota = match (descriptor.limit, rule.limit) {
                (Some(quota), _) | (None, Limit::Quota(quota)) => quota,
                (None, Limit::Unlimited) => continue,
            };
            let kind = rule.algorithm.unwrap_or(self.settings.algorithm);
            if !generation.has(kind) {
                continue;
            }
            let mut key = String::new();
            write_counter(&mut key, rule, entries, descriptor.limit);
            let cost = if peek {
                0
            } else {
                descriptor.hits.filter(|h| *h > 0).unwrap_or(hits)
            };
            counts.push(Count {
                index,
                kind,
                key,
                cost,
                limit: AppliedLimit {
                    quota,
                    name: rule.name.clone(),
                    rule: rule.id.clone(),
                    shadow: rule.shadow_mode,
                },
            });
        }
        counts
    }

    /// Counts in memory, in the request's order; all-or-nothing gives back every take of a
    /// denied request. Whether the request is denied.
    fn count_in_memory(
        &self,
        generation: &Generation,
        counts: Vec<Count>,
        statuses: &mut [DescriptorStatus],
        peek: bool,
    ) -> bool {
        let all_or_nothing = self.settings.counting == Counting::AllOrNothing;
        // Takes to give back if the request is denied.
        let mut taken: Vec<(usize, &dyn Counters, String, Receipt, u64)> = Vec::new();
        let mut denied = false;
        for count in counts {
            let Some(counters) = generation.memory(count.kind) else {
                continue;
            };
            // After a denial that counts, the rest are only looked at.
            let cost = if peek || (denied && all_or_nothing) {
                0
            } else {
                count.cost
            };
            let shadow = count.limit.shadow;
            let status = match counters.take(&count.key, cost) {
                Ok((decision, receipt)) => {
                    if decision.is_allowed() && cost > 0 {
                        taken.push((count.index, counters, count.key, receipt, cost));
                    }
                    limited(decision, count.limit)
                }
                Err(CheckError::CostExceedsCapacity { .. }) => never_fits(count.limit),
            };
            denied |= status.code == Code::OverLimit && !shadow;
            statuses[count.index] = status;
        }
        if denied && all_or_nothing {
            for (index, counters, key, receipt, cost) in taken {
                counters.give_back(&key, receipt, cost);
                given_back(&mut statuses[index], cost);
            }
        }
        denied
    }

    /// Counts on Redis, every limit at once. All-or-nothing with more than one limit looks
    /// first (a peek), takes only if every limit would admit, and takes for real those that
    /// would not (a denial consumes nothing, and says when to retry). Whether the request is
    /// denied.
    async fn count_on_redis(
        &self,
        generation: &Generation,
        counts: Vec<Count>,
        statuses: &mut [DescriptorStatus],
        peek: bool,
    ) -> bool {
        let look_first = !peek && self.settings.counting == Counting::AllOrNothing && counts.len() > 1;
        if !look_first {
            let decisions = take_all(generation, &counts, |count| count.cost).await;
            return settle(counts, decisions, statuses);
        }
        let looks = take_all(generation, &counts, |_| 0).await;
        let short = |count: &Count, look: &Option<Decision>| {
            !count.limit.shadow && look.is_none_or(|look| look.remaining() < count.cost)
        };
        if !counts.iter().zip(&looks).any(|(count, look)| short(count, look)) {
            let decisions = take_all(generation, &counts, |count| count.cost).await;
            return settle(counts, decisions, statuses);
        }
        // Take only where a limit would deny: a denied take consumes nothing and says when to
        // retry. The rest keep what their look said.
        let (deciding, looked): (Vec<_>, Vec<_>) = counts
            .into_iter()
            .zip(looks)
            .partition(|(count, look)| short(count, look));
        let deciding: Vec<Count> = deciding.into_iter().map(|(count, _)| count).collect();
        let decisions = take_all(generation, &deciding, |count| count.cost).await;
        if settle(deciding, decisions, statuses) {
            for (count, look) in looked {
                let index = count.index;
                statuses[index] = match look {
                    // What a take would have said: over, if the look leaves less than the cost
                    // (a shadow limit, which never decides).
                    Some(look) => {
                        let over = look.remaining() < count.cost;
                        let mut status = limited(look, count.limit);
                        if over {
                            status.code = Code::OverLimit;
                        }
                        status
                    }
                    None => never_fits(count.limit),
                };
            }
            return true;
        }
        // Another process freed what was short between the look and the take: those took,
        // so the rest take too.
        let rest: Vec<Count> = looked.into_iter().map(|(count, _)| count).collect();
        let decisions = take_all(generation, &rest, |count| count.cost).await;
        settle(rest, decisions, statuses)
    }

    fn validate(&self, request: &CheckRequest) -> Result<(), RequestError> {
        let bounds = self.settings.bounds;
        // The field is named only for a text too long: most requests name none.
        let long = |field: &dyn Fn() -> String, text: &str| {
            (text.len() > bounds.text_bytes).then(|| RequestError::TooLong {
                field: field(),
                len: text.len(),
                max: bounds.text_bytes,
            })
        };
        if request.domain.is_empty() {
            return Err(RequestError::NoDomain);
        }
        if let Some(e) = long(&|| "domain".into(), &request.domain) {
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
                if let Some(e) = long(&|| format!("descriptors[{index}].entries[{i}].key"), key)
                    .or_else(|| long(&|| format!("descriptors[{index}].entries[{i}].value"), value))
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
fn replaced_names<'a>(matched: impl Iterator<Item = Option<&'a Rule>>) -> HashSet<&'a str> {
    matched
        .flatten()
        .flat_map(|rule| rule.replaces.iter().map(String::as_str))
        .collect()
}

fn is_replaced(rule: &Rule, replaced: &HashSet<&str>) -> bool {
    !replaced.is_empty() && rule.name.as_deref().is_some_and(|name| replaced.contains(name))
}

/// Moves each limiter's counters into its pair, under `quotas` (the target generation's).
fn move_counters<'a>(
    pairs: impl Iterator<Item = (&'a dyn Counters, &'a dyn Counters)>,
    quotas: &RuleQuotas,
) -> Reloaded {
    let mut reloaded = Reloaded::default();
    for (counters, target) in pairs {
        let Migrated { moved, dropped, .. } = counters.migrate_into(target, quotas);
        reloaded.moved += moved;
        reloaded.dropped += dropped;
    }
    reloaded
}

/// A descriptor as the top keys and the denied log name it: `key=value,key=value`.
fn descriptor_key(descriptor: &DescriptorRequest) -> String {
    let mut key = String::new();
    for (i, (name, value)) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(name);
        key.push('=');
        key.push_str(value);
    }
    key
}

/// Each limit's decision on Redis for `cost` of it, all at once: `None` where the cost can
/// never fit its quota.
async fn take_all(
    generation: &Generation,
    counts: &[Count],
    cost: impl Fn(&Count) -> u64,
) -> Vec<Option<Decision>> {
    let takes = counts.iter().map(|count| {
        let cost = cost(count);
        async move {
            let counters = generation.shared(count.kind)?;
            // The one error left is a cost the quota can never admit.
            shared::decide(counters, &count.key, cost).await.ok()
        }
    });
    futures_util::future::join_all(takes).await
}

/// Writes each limit's status from its decision. Whether any limit that counts denied.
fn settle(counts: Vec<Count>, decisions: Vec<Option<Decision>>, statuses: &mut [DescriptorStatus]) -> bool {
    let mut denied = false;
    for (count, decision) in counts.into_iter().zip(decisions) {
        let shadow = count.limit.shadow;
        let status = match decision {
            Some(decision) => limited(decision, count.limit),
            None => never_fits(count.limit),
        };
        denied |= status.code == Code::OverLimit && !shadow;
        statuses[count.index] = status;
    }
    denied
}

/// The status of a cost its limit can never admit.
fn never_fits(limit: AppliedLimit) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::OverLimit,
        limit: Some(limit),
        remaining: 0,
        reset_after: Duration::ZERO,
        retry_after: Duration::MAX,
    }
}

/// A status after its take was given back.
fn given_back(status: &mut DescriptorStatus, cost: u64) {
    let capacity = status.limit.as_ref().map_or(0, |limit| limit.quota.capacity());
    status.remaining = status.remaining.saturating_add(cost).min(capacity);
}
