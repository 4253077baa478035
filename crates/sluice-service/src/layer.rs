//! The engine behind sluice's HTTP layer: each request's key is one descriptor of one domain
//! (`[(entry_key, key)]`), decided by the same [`Engine::decide`] as RLS and the check API.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::FutureExt;

use sluice::{CheckError, Decision, Quota};
use sluice_descriptors::{Entry, Limit};
use sluice_http::{CheckFuture, LimitBackend, SeveralLimits};

use crate::answer::{Outcome, Status, tighter};
use crate::counters::push_counter;
use crate::decide::{Decided, with_keys};
use crate::engine::Engine;
use crate::request::{CheckRequest, Descriptor, DescriptorRequest, Request, RequestError};
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
    /// Charges sent to a store that answers later (Redis) and not yet answered.
    charging: Arc<AtomicUsize>,
}

/// The most charges after responses in flight to Redis at once, for one backend: beyond it a
/// response's cost is not charged (and counted so by the layer) rather than queue tasks while
/// Redis is slow.
const MAX_CHARGES_IN_FLIGHT: usize = 1024;

/// One charge in flight, counted while its task lives.
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LayerBackend {
    /// The layer's keys as values of `entry_key` in `domain`, decided by `engine`.
    pub fn new(engine: Arc<Engine>, domain: impl Into<String>, entry_key: impl Into<String>) -> Self {
        Self {
            engine,
            domain: domain.into(),
            entry_key: entry_key.into(),
            charging: Arc::default(),
        }
    }

    /// The engine deciding.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

/// The layer's answer for one key: the decision (or a cost its quota can never admit), the
/// quota it was made under if a rule limits the key, and the key's other limits if it has
/// several.
type Answer = (
    Result<Decision, CheckError>,
    Option<Quota>,
    Option<Box<SeveralLimits>>,
);

/// The layer's answer from the engine's outcome of its one descriptor: of its limits (a rule's
/// stacked quotas), the tightest, with every other one at its place in the rule.
fn answer(outcome: &Outcome<'_, '_>) -> Answer {
    let limits = outcome.counts.iter().zip(outcome.statuses);
    let Some((chosen, status)) = limits.clone().reduce(tighter) else {
        return (Ok(Status::UNLIMITED.decision), None, None);
    };
    let (answer, quota) = status.to_layer(outcome.denied);
    // Boxed: the answer travels back through the engine, and most keys have one limit.
    let listed = (outcome.counts.len() > 1).then(|| {
        Box::new(SeveralLimits {
            place: chosen.nth,
            quota,
            others: (limits.filter(|(count, _)| count.nth != chosen.nth))
                .map(|(count, status)| {
                    let (answer, quota) = status.to_layer(outcome.denied);
                    (count.nth, answer.unwrap_or(status.decision), quota)
                })
                .collect(),
        })
    });
    (answer, quota, listed)
}

fn undecidable(error: &RequestError) -> Answer {
    tracing::debug!("HTTP layer key not decided: {error}");
    (Ok(Decision::denied(0, 0, 0, u64::MAX)), None, None)
}

impl LimitBackend for LayerBackend {
    fn check(&self, key: &str, cost: u64) -> CheckFuture {
        self.check_quoted(key, cost).0
    }

    fn quota(&self, key: &str) -> Option<Quota> {
        let engine = self.engine.latest();
        let generation = engine.current.load();
        let entries = [Entry {
            key: &self.entry_key,
            value: key,
        }];
        let rule = generation.rules.find(&self.domain, &entries)?;
        // A rule of several quotas answers with whichever is tightest, which the key alone
        // does not tell: no quota, rather than another one's window in the fields.
        if rule.limit == Limit::Unlimited || !rule.stacked.is_empty() {
            return None;
        }
        let kind = rule.algorithm.unwrap_or(engine.settings.algorithm);
        with_keys(|counter| {
            push_counter(counter, rule, &entries, None);
            generation.store.quota_of(kind, counter)
        })
    }

    fn check_quoted(&self, key: &str, cost: u64) -> (CheckFuture, Option<Quota>) {
        let engine = self.engine.latest();
        if engine.answers_now() {
            let entries = [Entry {
                key: &self.entry_key,
                value: key,
            }];
            let descriptors = [Descriptor {
                entries: &entries,
                hits: cost,
                limit: None,
            }];
            let request = Request {
                domain: &self.domain,
                descriptors: &descriptors,
            };
            // In memory the answer is known now (a future, never polled, is dropped).
            if let Decided::Ready(answer) = engine.decide(Some(FrontEnd::Http), request, false, answer) {
                let (answer, quota, listed) = answer.unwrap_or_else(|e| undecidable(&e));
                let future = match listed {
                    Some(listed) => CheckFuture::ready_listed(answer, listed),
                    None => CheckFuture::ready(answer),
                };
                return (future, quota);
            }
        }
        // On Redis: the future owns what the request borrows, and the layer asks the quota
        // when it writes the fields.
        let (engine, domain, entry_key) = (Arc::clone(engine), self.domain.clone(), self.entry_key.clone());
        let key = key.to_owned();
        let later = async move {
            let entries = [Entry {
                key: &entry_key,
                value: &key,
            }];
            let descriptors = [Descriptor {
                entries: &entries,
                hits: cost,
                limit: None,
            }];
            let request = Request {
                domain: &domain,
                descriptors: &descriptors,
            };
            let decided = engine.decide(Some(FrontEnd::Http), request, false, answer);
            let (answer, _, listed) = decided.answer().await.unwrap_or_else(|e| undecidable(&e));
            (answer, listed)
        };
        (CheckFuture::pending_listed(later), None)
    }

    /// Reports `cost` for `key` ([`Engine::report`]): taken at once in memory; on Redis sent
    /// on a task of the running Tokio runtime (the response does not wait for it; a failure is
    /// logged), at most [`MAX_CHARGES_IN_FLIGHT`] at once, or not taken outside a runtime.
    fn charge(&self, key: &str, cost: u64) -> bool {
        let request = CheckRequest {
            domain: self.domain.clone(),
            descriptors: vec![DescriptorRequest {
                entries: vec![(self.entry_key.clone(), key.to_owned())],
                hits: Some(cost),
                limit: None,
            }],
            hits: None,
        };
        let engine = Arc::clone(self.engine.latest());
        let mut report = Box::pin(async move {
            if let Err(e) = engine.report(&request).await {
                tracing::warn!("a response's cost was not charged: {e}");
                return false;
            }
            true
        });
        if let Some(taken) = (&mut report).now_or_never() {
            return taken;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self.charging.fetch_add(1, Ordering::Relaxed) >= MAX_CHARGES_IN_FLIGHT {
            self.charging.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        let in_flight = InFlight(Arc::clone(&self.charging));
        runtime.spawn(async move {
            let _in_flight = in_flight;
            report.await;
        });
        true
    }
}
