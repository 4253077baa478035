//! The one decision every front end asks for ([`Engine::decide`]): the HTTP layer, RLS and the
//! check API. A request's descriptors are matched to their rules (a rule another matched rule
//! `replaces` is dropped, an `unlimited` one counts nothing), the limits are counted by the
//! generation's store, and the answer is recorded (statistics, the paced denied log, latency)
//! before the front end reads it. Shadow-mode limits count and report but never deny.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use sluice_descriptors::{Limit, Rule};
use smallvec::SmallVec;

use crate::answer::{Outcome, Status};
use crate::counters::push_counter;
use crate::engine::Engine;
use crate::generation::Generation;
use crate::request::{Request, RequestError, descriptor_key};
use crate::stats::FrontEnd;
use crate::store::{Count, Counted, Tally};

thread_local! {
    /// The counters' keys of a decision in memory, kept between decisions on this thread so a
    /// held counter's check allocates nothing (taken while in use: a nested one starts empty).
    static KEYS: Cell<String> = const { Cell::new(String::new()) };
}

/// A decision, known now (in memory) or later (on Redis).
pub(crate) enum Decided<'a, T> {
    Ready(Result<T, RequestError>),
    Pending(Pin<Box<dyn Future<Output = Result<T, RequestError>> + Send + 'a>>),
}

impl<T> Decided<'_, T> {
    /// The answer, waiting for it if it is still to come.
    pub(crate) async fn answer(self) -> Result<T, RequestError> {
        match self {
            Self::Ready(answer) => answer,
            Self::Pending(later) => later.await,
        }
    }
}

impl Engine {
    /// Decides `request` asked through `front` (`None`: a direct call, timed under no front
    /// end); with `peek`, counts nothing and records nothing. `read` turns the outcome into
    /// what the front end answers, while the rules it was decided on are at hand.
    pub(crate) fn decide<'a, T, R>(
        &'a self,
        front: Option<FrontEnd>,
        request: Request<'a>,
        peek: bool,
        read: R,
    ) -> Decided<'a, T>
    where
        R: FnOnce(&Outcome<'_, '_>) -> T + Send + 'a,
        T: 'a,
    {
        if let Err(e) = request.validate(self.settings.bounds) {
            return Decided::Ready(Err(e));
        }
        let started = (self.settings.observe && front.is_some()).then(Instant::now);
        {
            let generation = self.current.load();
            if generation.store.answers_now() {
                let mut tally = self.plan(&generation, request, peek, KEYS.with(Cell::take));
                let now = match generation.store.count(&mut tally, self.settings.counting) {
                    Counted::Now(denied) => Some(denied),
                    Counted::Later(_) => None,
                };
                if let Some(denied) = now {
                    let answer =
                        self.finish(&generation, request, &tally, denied, peek, (front, started), read);
                    KEYS.with(|keys| keys.set(tally.keys));
                    return Decided::Ready(Ok(answer));
                }
            }
        }
        // A store that answers later: the future owns the generation it decides on.
        Decided::Pending(Box::pin(async move {
            let generation = self.current.load_full();
            let mut tally = self.plan(&generation, request, peek, String::new());
            let denied = match generation.store.count(&mut tally, self.settings.counting) {
                Counted::Now(denied) => denied,
                Counted::Later(later) => later.await,
            };
            Ok(self.finish(&generation, request, &tally, denied, peek, (front, started), read))
        }))
    }

    /// The limits the request's descriptors are counted against: each descriptor's rule (if
    /// one matches, is not replaced and has a limit), its counter and its cost.
    /// `keys` is the buffer the counters' keys are written in (emptied first).
    fn plan<'g>(
        &self,
        generation: &'g Generation,
        request: Request<'_>,
        peek: bool,
        mut keys: String,
    ) -> Tally<'g> {
        keys.clear();
        let descriptors = request.descriptors;
        let rules: SmallVec<[Option<&'g Rule>; 2]> = (descriptors.iter())
            .map(|descriptor| generation.rules.find(request.domain, descriptor.entries))
            .collect();
        let mut tally = Tally {
            keys,
            counts: SmallVec::new(),
            statuses: SmallVec::from_elem(Status::UNLIMITED, descriptors.len()),
        };
        for (index, (descriptor, rule)) in descriptors.iter().zip(&rules).enumerate() {
            let Some(rule) = rule.filter(|rule| !is_replaced(rule, &rules)) else {
                continue;
            };
            let quota = match (descriptor.limit, rule.limit) {
                (Some(quota), _) | (None, Limit::Quota(quota)) => quota,
                (None, Limit::Unlimited) => continue,
            };
            let kind = rule.algorithm.unwrap_or(self.settings.algorithm);
            if !generation.counts(kind) {
                continue;
            }
            let start = tally.keys.len();
            push_counter(&mut tally.keys, rule, descriptor.entries, descriptor.limit);
            tally.counts.push(Count {
                index,
                rule,
                kind,
                key: start..tally.keys.len(),
                cost: if peek { 0 } else { descriptor.hits },
                quota,
            });
        }
        tally
    }

    /// Records a decided request (unless it was a look) and lets the front end read it.
    #[allow(clippy::too_many_arguments)]
    fn finish<T>(
        &self,
        generation: &Generation,
        request: Request<'_>,
        tally: &Tally<'_>,
        denied: bool,
        peek: bool,
        (front, started): (Option<FrontEnd>, Option<Instant>),
        read: impl FnOnce(&Outcome<'_, '_>) -> T,
    ) -> T {
        if !peek {
            self.record(generation, request, &tally.statuses);
        }
        if let (Some(front), Some(started)) = (front, started) {
            self.record_latency(front, started.elapsed());
        }
        read(&Outcome {
            denied,
            statuses: &tally.statuses,
            generation,
        })
    }

    /// Counts each limited status of a decided request under its rule, and logs a denial
    /// (paced).
    fn record(&self, generation: &Generation, request: Request<'_>, statuses: &[Status<'_>]) {
        for (status, descriptor) in statuses.iter().zip(request.descriptors) {
            let Some(rule) = status.rule else { continue };
            let over = status.is_over();
            if over && !rule.shadow_mode {
                self.log_denied(rule, || descriptor_key(descriptor.entries));
            }
            if !self.settings.observe {
                continue;
            }
            if let Some(stats) = generation.stats.get(&rule.id) {
                stats.record(descriptor.hits, over, rule.shadow_mode, || {
                    Some(descriptor_key(descriptor.entries))
                });
            }
        }
    }

    /// Logs a denial, at most `denied_log_per_second` a second.
    fn log_denied(&self, rule: &Rule, key: impl FnOnce() -> String) {
        if self
            .denied_log
            .as_ref()
            .is_some_and(|pace| pace.check().is_allowed())
        {
            tracing::info!(target: "sluice::denied", rule = %rule.id, key = key(), "denied");
        }
    }
}

/// Whether some other matched rule replaces `rule` (names it in its `replaces`).
fn is_replaced(rule: &Rule, matched: &[Option<&Rule>]) -> bool {
    let Some(name) = rule.name.as_deref() else {
        return false;
    };
    matched
        .iter()
        .flatten()
        .any(|other| other.replaces.iter().any(|replaced| replaced == name))
}
