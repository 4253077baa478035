//! The engine behind sluice's HTTP layer: each request's key is one descriptor of one domain
//! (`[(entry_key, key)]`), decided on the same rules and counters as the service's requests.

use std::sync::Arc;
use std::time::Instant;

use sluice::{CheckError, Decision, Quota};
use sluice_descriptors::{Entry, Limit, Rule, RuleId};
use sluice_http::{CheckFuture, LimitBackend};

use crate::counters::write_counter;
use crate::engine::{Engine, Generation, Store};
use crate::stats::FrontEnd;

/// An [`Engine`] as the HTTP layer's [`LimitBackend`]: the layer's key for a request is the
/// value of the descriptor `[(entry_key, key)]` in `domain`. A key no rule limits is admitted
/// (and has no quota to report).
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use sluice_descriptors::{DomainRules, RuleSet};
/// use sluice_http::LimitBackend;
/// use sluice_service::{Engine, EngineSettings, LayerBackend};
/// let accounts = DomainRules::by_value("accounts", "account", [("alice".into(), "1/h".parse()?)], None)?;
/// let engine = Arc::new(Engine::new(RuleSet::from_domains(vec![accounts])?, EngineSettings::default())?);
/// let backend = LayerBackend::new(engine, "accounts", "account");
/// let first = backend.check("alice", 1).into_ready().ok().unwrap()?;
/// assert!(first.is_allowed());
/// assert!(!backend.check("alice", 1).into_ready().ok().unwrap()?.is_allowed());
/// assert!(backend.check("bob", 1).into_ready().ok().unwrap()?.is_allowed());
/// assert_eq!(backend.quota("alice"), Some("1/h".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct LayerBackend {
    engine: Arc<Engine>,
    domain: String,
    entry_key: String,
}

impl LayerBackend {
    /// The layer's keys as values of `entry_key` in `domain`, decided by `engine`.
    pub fn new(engine: Arc<Engine>, domain: impl Into<String>, entry_key: impl Into<String>) -> Self {
        Self {
            engine,
            domain: domain.into(),
            entry_key: entry_key.into(),
        }
    }

    /// The engine deciding.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The rule limiting `key` in `generation`, with its counter's key written in `counter`
    /// (emptied first).
    fn place<'g>(&self, generation: &'g Generation, key: &str, counter: &mut String) -> Option<&'g Rule> {
        let entries = [Entry {
            key: &self.entry_key,
            value: key,
        }];
        let rule = generation.rules.find(&self.domain, &entries)?;
        if rule.limit == Limit::Unlimited {
            return None;
        }
        write_counter(counter, rule, &entries, None);
        Some(rule)
    }

    /// Runs `f` with this thread's counter-key buffer: a check in memory allocates no key.
    fn with_buffer<T>(f: impl FnOnce(&mut String) -> T) -> T {
        thread_local! {
            static COUNTER: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        COUNTER.with(|buffer| match buffer.try_borrow_mut() {
            Ok(mut buffer) => f(&mut buffer),
            // Only if a check ran inside another on this thread: a buffer of its own.
            Err(_) => f(&mut String::new()),
        })
    }
}

/// The decision for a key no rule limits.
fn unlimited() -> Decision {
    Decision::allowed(u64::MAX, u64::MAX, 0)
}

impl LimitBackend for LayerBackend {
    fn check(&self, key: &str, cost: u64) -> CheckFuture {
        self.check_quoted(key, cost).0
    }

    fn quota(&self, key: &str) -> Option<Quota> {
        let engine = self.engine.latest();
        let generation = engine.current.load();
        Self::with_buffer(|counter| {
            let rule = self.place(&generation, key, counter)?;
            let kind = rule.algorithm.unwrap_or(engine.settings.algorithm);
            match &generation.store {
                Store::Memory(_) => generation.memory(kind)?.quota_of(counter),
                Store::Redis(_) => Some(generation.shared(kind)?.quota_of(counter)),
            }
        })
    }

    fn check_quoted(&self, key: &str, cost: u64) -> (CheckFuture, Option<Quota>) {
        let engine = self.engine.latest();
        let generation = engine.current.load();
        Self::with_buffer(|counter| {
            let Some(rule) = self.place(&generation, key, counter) else {
                return (CheckFuture::ready(Ok(unlimited())), None);
            };
            let kind = rule.algorithm.unwrap_or(engine.settings.algorithm);
            match &generation.store {
                Store::Memory(_) => match generation.memory(kind) {
                    Some(counters) => {
                        let started = engine.observes().then(Instant::now);
                        let (answer, quota) = counters.take_quoted(counter, cost);
                        if let Some(started) = started {
                            engine.record_latency(FrontEnd::Http, started.elapsed());
                        }
                        if let Ok(decision) = &answer {
                            count(
                                engine,
                                &generation,
                                (&rule.id, rule.shadow_mode),
                                key,
                                cost,
                                decision,
                            );
                        }
                        (CheckFuture::ready(answer), Some(quota))
                    }
                    None => (CheckFuture::ready(Ok(unlimited())), None),
                },
                Store::Redis(_) => {
                    let quota = generation.shared(kind).map(|shared| shared.quota_of(counter));
                    let asked = Asked {
                        engine: Arc::clone(engine),
                        rule: rule.id.clone(),
                        shadow: rule.shadow_mode,
                        counter: counter.clone(),
                        key: key.to_owned(),
                        cost,
                    };
                    let generation = arc_swap::Guard::into_inner(generation);
                    (CheckFuture::pending(on_redis(generation, kind, asked)), quota)
                }
            }
        })
    }
}

/// Counts a decision of the layer's under its rule (and logs a denial, paced).
fn count(
    engine: &Engine,
    generation: &Generation,
    (rule, shadow): (&RuleId, bool),
    key: &str,
    cost: u64,
    decision: &Decision,
) {
    let over = !decision.is_allowed();
    if over && !shadow {
        engine.log_denied(rule, || key.to_owned());
    }
    if !engine.observes() {
        return;
    }
    if let Some(stats) = generation.stats.get(rule) {
        stats.record(cost, over, shadow, || Some(key.to_owned()));
    }
}

/// What a check on Redis needs once it is off the request's thread.
struct Asked {
    engine: Arc<Engine>,
    rule: RuleId,
    shadow: bool,
    counter: String,
    key: String,
    cost: u64,
}

/// A check of the layer's on Redis.
async fn on_redis(
    generation: Arc<Generation>,
    kind: sluice::AlgorithmKind,
    asked: Asked,
) -> Result<Decision, CheckError> {
    let Some(shared) = generation.shared(kind) else {
        return Ok(unlimited());
    };
    let started = Instant::now();
    let answer = crate::shared::decide(shared, &asked.counter, asked.cost).await;
    asked.engine.record_latency(FrontEnd::Http, started.elapsed());
    if let Ok(decision) = &answer {
        count(
            &asked.engine,
            &generation,
            (&asked.rule, asked.shadow),
            &asked.key,
            asked.cost,
            decision,
        );
    }
    answer
}
