//! The decision engine: one generation of rules and counters behind an `ArcSwap`, replaced
//! whole by a reload while every counter keeps its count; what it has decided so far (per
//! rule, per front end). The decision itself is in `decide.rs`.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice::{KeyedBuildError, Migrated, Quota};
use sluice_descriptors::{Limit, RuleId, RuleSet};

use crate::answer::Verdict;
use crate::counters::{AlgorithmCounters, RuleQuotas};
use crate::generation::Generation;
use crate::request::{CheckRequest, Request, RequestError};
use crate::settings::EngineSettings;
use crate::stats::{FrontEnd, Latency, LatencySnapshot, RuleCounts};
use crate::store::RedisCounters;

/// Why an engine could not be built (or a reload was refused: the running rules stay).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A memory limiter refused a setting.
    #[error(transparent)]
    Keyed(#[from] KeyedBuildError),
    /// A rule's algorithm or quota cannot be counted on Redis.
    #[error("rule {rule}: {source}")]
    Redis {
        /// The rule, as its place in the rules reads.
        rule: String,
        /// Why.
        source: Box<sluice_redis::SetupError>,
    },
    /// A Redis limiter could not be built.
    #[error("redis: {0}")]
    RedisLimiter(Box<sluice_redis::SetupError>),
    /// A rule asks to count over its limit on Redis under an algorithm whose script takes no
    /// charge (only the token bucket's does): refused rather than silently not counted.
    #[error("rule {rule}: count_over_limit on Redis needs the token_bucket algorithm")]
    OverLimitOnRedis {
        /// The rule, as its place in the rules reads.
        rule: String,
    },
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
    pub(crate) redis: Option<RedisCounters>,
    /// Decision latency by front end ([`FrontEnd`] order).
    latency: [Latency; 3],
    /// Paces the denied-request log.
    pub(crate) denied_log: Option<sluice::RateLimiter<sluice::TokenBucket>>,
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
    /// Its limit (with several quotas, the first).
    pub limit: Limit,
    /// Its quotas after the first ([`sluice_descriptors::Rule::stacked`]).
    pub stacked: Vec<sluice::Quota>,
    /// In shadow mode.
    pub shadow_mode: bool,
    /// Its decisions so far (since it took this place, across reloads).
    pub counts: RuleCounts,
    /// Its decisions by metric label, for a `detailed_metric` or `value_to_metric` rule
    /// ([`sluice_descriptors::metric_label`]; at most [`crate::MAX_LABELS`]).
    pub by_label: Vec<(String, RuleCounts)>,
}

/// A key among those denied most ([`Engine::top_denied_across`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    /// The domain of the rule that denied it.
    pub domain: String,
    /// The rule's place.
    pub rule: RuleId,
    /// The rule's name, if it has one.
    pub name: Option<String>,
    /// The request's descriptor, as `key=value` entries.
    pub key: String,
    /// Denials over about the last minute (space-saving's count: over by at most the
    /// smallest count the rule's table held).
    pub denied: u64,
}

impl Engine {
    /// An engine deciding on `rules`, its counters in this process.
    ///
    /// # Errors
    /// A limiter could not be built with the settings.
    pub fn new(rules: RuleSet, settings: EngineSettings) -> Result<Self, EngineError> {
        let generation = Generation::build(rules, &settings, None, None)?;
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
    ) -> Result<Self, EngineError> {
        let generation = Generation::build(rules, &settings, Some(&redis), None)?;
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

    /// Replaces the rules. Every held counter stays with its count: in memory the limiters
    /// stay and each counter takes its rule's new quota in place, one shard locked at a time
    /// (checks elsewhere go on), by the core's quota-change rule (what still counts stays
    /// consumed, capped); on Redis the counts never left.
    ///
    /// # Errors
    /// A limiter could not be built, or (on Redis) a rule cannot be counted there; the
    /// running rules stay.
    pub fn reload(&self, rules: RuleSet) -> Result<Reloaded, EngineError> {
        let old = self.current.load_full();
        let next = Arc::new(Generation::build(
            rules,
            &self.settings,
            self.redis.as_ref(),
            Some(&old),
        )?);
        self.current.store(Arc::clone(&next));
        let mut reloaded = Reloaded::default();
        if let (Some(before), Some(after)) = (old.store.in_memory(), next.store.in_memory()) {
            for (kind, counters) in &before.by_kind {
                let entries = counters.metrics().entries;
                if after
                    .by_kind
                    .iter()
                    .any(|(k, c)| k == kind && Arc::ptr_eq(c, counters))
                {
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
        let (held, target_held) = (from.store.in_memory()?, to.store.in_memory()?);
        // Every pair found before anything moves: a move is whole or not at all.
        let pairs: Vec<(&dyn AlgorithmCounters, &dyn AlgorithmCounters)> = (held.by_kind.iter())
            .map(|(kind, counters)| Some((&**counters, target_held.get(*kind)?)))
            .collect::<Option<_>>()?;
        Some(move_counters(pairs.into_iter(), &to.quotas))
    }

    /// Every rule's decisions so far, with its domain, name and limit.
    pub fn rule_counts(&self) -> Vec<RuleReport> {
        let generation = self.current.load();
        generation
            .rules
            .domains()
            .flat_map(|domain| domain.rules().map(move |rule| (domain.name(), rule)))
            .map(|(domain, rule)| {
                let stats = generation.stats.get(&rule.id);
                RuleReport {
                    domain: domain.to_owned(),
                    rule: rule.id.clone(),
                    name: rule.name.clone(),
                    limit: rule.limit,
                    stacked: rule.stacked.clone(),
                    shadow_mode: rule.shadow_mode,
                    counts: stats.map(|s| s.counts()).unwrap_or_default(),
                    by_label: stats.map(|s| s.labels()).unwrap_or_default(),
                }
            })
            .collect()
    }

    /// By domain, the decisions of rules that reloads have dropped since this engine started:
    /// added to a domain's sum, it never goes down.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::RuleSet;
    /// use sluice_service::{CheckRequest, DescriptorRequest, Engine, EngineSettings};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::new(RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: 1/h}\n")?, EngineSettings::default())?;
    /// let request = CheckRequest {
    ///     domain: "d".into(),
    ///     descriptors: vec![DescriptorRequest { entries: vec![("k".into(), "v".into())], ..Default::default() }],
    ///     hits: None,
    /// };
    /// engine.check(&request, false).await?;
    /// engine.reload(RuleSet::from_yaml("domain: d\ndescriptors: []\n")?)?;
    /// let retired = engine.retired_counts();
    /// assert_eq!((retired[0].0.as_str(), retired[0].1.allowed), ("d", 1));
    /// # Ok(()) }
    /// ```
    pub fn retired_counts(&self) -> Vec<(String, RuleCounts)> {
        let generation = self.current.load();
        let mut retired: Vec<(String, RuleCounts)> = (generation.retired.iter())
            .map(|(domain, counts)| (domain.clone(), *counts))
            .collect();
        retired.sort_by(|a, b| a.0.cmp(&b.0));
        retired
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

    /// The keys denied most over about the last minute across every rule (of `domain` only,
    /// if given), each with its rule, most first, at most `n`; `None` if `domain` names no
    /// domain. A key denied under two rules is listed once for each.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::RuleSet;
    /// use sluice_service::{CheckRequest, DescriptorRequest, Engine, EngineSettings};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let rules = RuleSet::from_yaml("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")?;
    /// let engine = Engine::new(rules, EngineSettings::default())?;
    /// let request = CheckRequest {
    ///     domain: "edge".into(),
    ///     descriptors: vec![DescriptorRequest { entries: vec![("user".into(), "eve".into())], ..Default::default() }],
    ///     hits: None,
    /// };
    /// for _ in 0..3 {
    ///     engine.check(&request, false).await?;
    /// }
    /// let top = engine.top_denied_across(Some("edge"), 10).unwrap();
    /// assert_eq!((top[0].key.as_str(), top[0].denied), ("user=eve", 2));
    /// assert!(engine.top_denied_across(Some("elsewhere"), 10).is_none());
    /// # Ok(()) }
    /// ```
    pub fn top_denied_across(&self, domain: Option<&str>, n: usize) -> Option<Vec<TopKey>> {
        let generation = self.current.load();
        if let Some(domain) = domain
            && generation.rules.domain(domain).is_none()
        {
            return None;
        }
        let mut keys = Vec::new();
        for within in generation.rules.domains() {
            if domain.is_some_and(|domain| domain != within.name()) {
                continue;
            }
            for rule in within.rules() {
                let Some(stats) = generation.stats.get(&rule.id) else {
                    continue;
                };
                keys.extend(stats.top(n).into_iter().map(|(key, denied)| TopKey {
                    domain: within.name().to_owned(),
                    rule: rule.id.clone(),
                    name: rule.name.clone(),
                    key,
                    denied,
                }));
            }
        }
        keys.sort_by(|a, b| b.denied.cmp(&a.denied).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(n);
        Some(keys)
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
        let held = generation.store.in_memory()?;
        let capacity = u64::try_from(self.settings.counters.capacity).unwrap_or(u64::MAX);
        Some((held.metrics(), capacity.saturating_mul(held.by_kind.len() as u64)))
    }

    /// Whether a decision is known at once (the counters are in this process).
    pub(crate) fn answers_now(&self) -> bool {
        self.redis.is_none()
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
        (self.current.load().store.in_memory()).map_or(0, |held| held.metrics().entries)
    }

    /// Decides `request` as a direct call (timed under no front end); with `peek`, counts
    /// nothing and says what a check would answer. In memory this never waits; on Redis it
    /// waits for Redis (or its failure policy).
    ///
    /// # Errors
    /// The request is outside the bounds ([`crate::RequestBounds`]), or names no domain or
    /// no descriptor.
    pub async fn check(&self, request: &CheckRequest, peek: bool) -> Result<Verdict, RequestError> {
        self.check_from(None, request, peek).await
    }

    /// [`check`](Self::check), asked through `front` (and timed under it).
    pub(crate) async fn check_from(
        &self,
        front: Option<FrontEnd>,
        request: &CheckRequest,
        peek: bool,
    ) -> Result<Verdict, RequestError> {
        let (headers, dynamic_metadata) = (self.settings.headers, self.settings.dynamic_metadata);
        let entries = request.entries();
        let descriptors = request.descriptors(&entries);
        let view = Request {
            domain: &request.domain,
            descriptors: &descriptors,
        };
        self.decide(front, view, peek, move |outcome| {
            let mut verdict = outcome.to_verdict(headers);
            if dynamic_metadata {
                verdict.dynamic_metadata = Some(outcome.dynamic_metadata(request));
            }
            verdict
        })
        .answer()
        .await
    }
}

/// Moves each limiter's counters into its pair, under `quotas` (the target generation's).
fn move_counters<'a>(
    pairs: impl Iterator<Item = (&'a dyn AlgorithmCounters, &'a dyn AlgorithmCounters)>,
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
