//! The one decision every front end asks for ([`Engine::decide`]): the HTTP layer, RLS and the
//! check API. A request's descriptors are matched to their rules (a rule another matched rule
//! `replaces` is dropped, an `unlimited` one counts nothing), the limits are counted by the
//! generation's store, and the answer is recorded (statistics, the paced denied log, latency)
//! before the front end reads it. Shadow-mode limits count and report but never deny; a
//! quota-mode limit over denies only with every other quota-mode limit of the request
//! ([`Denial`]); in global shadow mode every request is answered OK.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sluice::{Clock, MonotonicClock, TRACE_TARGET};
use sluice_descriptors::{Limit, Rule, metric_label};
use tracing::{Instrument, Span, field::Empty};

use crate::answer::{Outcome, Status};
use crate::counters::{push_counter, push_stacked_counter};
use crate::engine::Engine;
use crate::generation::Generation;
use crate::request::{Descriptor, Request, RequestError, descriptor_key, write_descriptor_key};
use crate::stats::{FrontEnd, Standing};
use crate::store::{Count, Counted, Denial, Tally};

thread_local! {
    /// The counters' keys of a decision in memory, kept between decisions on this thread so a
    /// held counter's check allocates nothing (taken while in use: a nested one starts empty).
    static KEYS: Cell<String> = const { Cell::new(String::new()) };
}

/// Runs `f` with this thread's counter-key buffer, emptied (a nested use gets an empty one).
pub(crate) fn with_keys<T>(f: impl FnOnce(&mut String) -> T) -> T {
    let mut keys = KEYS.with(Cell::take);
    keys.clear();
    let answer = f(&mut keys);
    KEYS.with(|buffer| buffer.set(keys));
    answer
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
        // Exported only when a subscriber enables the target; otherwise a level check.
        let span = tracing::trace_span!(
            target: TRACE_TARGET,
            "sluice.decision",
            domain = request.domain,
            rule = Empty,
            outcome = Empty,
            shadow = Empty,
            descriptors = Empty,
        );
        if let Err(e) = request.validate(self.settings.bounds) {
            span.record("outcome", "invalid");
            return Decided::Ready(Err(e));
        }
        // The time-stamp counter where it is the kernel's clock: half an `Instant`'s cost.
        let started = (self.settings.observe && front.is_some()).then(|| MonotonicClock.now());
        {
            let generation = self.current.load();
            if generation.store.answers_now() {
                // One descriptor of one limit (every HTTP layer request of a rule with one
                // quota): the same plan, take and record, with no list to hold and nothing to
                // give back.
                let single = match request.descriptors {
                    [descriptor] if !generation.replacing => {
                        let rule = (generation.rules.domain(request.domain))
                            .and_then(|domain| domain.find(descriptor.entries));
                        Some((descriptor, rule))
                    }
                    _ => None,
                };
                let lone = single.filter(|(descriptor, rule)| {
                    rule.is_none_or(|rule| rule.stacked.is_empty() || descriptor.limit.is_some())
                });
                if let Some((descriptor, rule)) = lone {
                    let mut keys = KEYS.with(Cell::take);
                    keys.clear();
                    let count = rule
                        .and_then(|rule| self.count_of(&generation, (0, descriptor, rule), peek, &mut keys));
                    let status = count
                        .as_ref()
                        .and_then(|count| generation.store.take_now(count, &keys));
                    if count.is_none() || status.is_some() {
                        let (counts, statuses) = (count.as_slice(), status.as_slice());
                        let denied = Denial::of(counts, statuses);
                        let answer = self.finish(
                            &generation,
                            request,
                            (counts, statuses),
                            denied,
                            peek,
                            (front, started, &span),
                            read,
                        );
                        KEYS.with(|buffer| buffer.set(keys));
                        return Decided::Ready(Ok(answer));
                    }
                }
                let mut tally = Tally::new(KEYS.with(Cell::take));
                match single {
                    // One descriptor of several limits: its rule is found already.
                    Some((descriptor, Some(rule))) => {
                        tally.keys.clear();
                        self.plan_one(&generation, (0, descriptor, rule), peek, &mut tally);
                    }
                    _ => self.plan(&generation, request, peek, &mut tally),
                }
                let now = match generation.store.count(&mut tally, self.settings.counting) {
                    Counted::Now(denied) => Some(denied),
                    Counted::Later(_) => None,
                };
                if let Some(denied) = now {
                    let limits = (tally.counts.as_slice(), tally.statuses.as_slice());
                    let answer = self.finish(
                        &generation,
                        request,
                        limits,
                        denied,
                        peek,
                        (front, started, &span),
                        read,
                    );
                    KEYS.with(|keys| keys.set(tally.keys));
                    return Decided::Ready(Ok(answer));
                }
            }
        }
        // A store that answers later: the future owns the generation it decides on. Its
        // calls (Redis) are the decision span's children.
        let within = span.clone();
        Decided::Pending(Box::pin(
            async move {
                let generation = self.current.load_full();
                let mut tally = Tally::new(String::new());
                self.plan(&generation, request, peek, &mut tally);
                let denied = match generation.store.count(&mut tally, self.settings.counting) {
                    Counted::Now(denied) => denied,
                    Counted::Later(later) => later.await,
                };
                let limits = (tally.counts.as_slice(), tally.statuses.as_slice());
                Ok(self.finish(
                    &generation,
                    request,
                    limits,
                    denied,
                    peek,
                    (front, started, &span),
                    read,
                ))
            }
            .instrument(within),
        ))
    }

    /// Writes into `tally` the limits the request's descriptors are counted against: each
    /// descriptor's rule (if one matches, is not replaced and has a limit), its counter and its
    /// cost. Filled in place, keeping `tally`'s buffers.
    pub(crate) fn plan<'g>(
        &self,
        generation: &'g Generation,
        request: Request<'_>,
        peek: bool,
        tally: &mut Tally<'g>,
    ) {
        tally.keys.clear();
        tally.counts.clear();
        let Some(domain) = generation.rules.domain(request.domain) else {
            return;
        };
        let descriptors = request.descriptors.iter().enumerate();
        if !generation.replacing {
            for (index, descriptor) in descriptors {
                if let Some(rule) = domain.find(descriptor.entries) {
                    self.plan_one(generation, (index, descriptor, rule), peek, tally);
                }
            }
            return;
        }
        // Every descriptor's rule first: one may replace another's.
        let rules: Vec<Option<&'g Rule>> = (request.descriptors.iter())
            .map(|descriptor| domain.find(descriptor.entries))
            .collect();
        let replaced: Vec<&str> = (rules.iter().flatten())
            .flat_map(|rule| rule.replaces.iter().map(String::as_str))
            .collect();
        for ((index, descriptor), rule) in descriptors.zip(rules) {
            let Some(rule) = rule else { continue };
            if !rule.name.as_deref().is_some_and(|name| replaced.contains(&name)) {
                self.plan_one(generation, (index, descriptor, rule), peek, tally);
            }
        }
    }

    /// Adds to `tally` the limits of the descriptor at `index` under `rule`, if it has any:
    /// its quota's, then each stacked quota's (one after another, so a descriptor's limits are
    /// together) unless the request set the descriptor's quota.
    #[inline]
    fn plan_one<'g>(
        &self,
        generation: &Generation,
        at: (usize, &Descriptor<'_>, &'g Rule),
        peek: bool,
        tally: &mut Tally<'g>,
    ) {
        let Some(count) = self.count_of(generation, at, peek, &mut tally.keys) else {
            return;
        };
        let (_, descriptor, rule) = at;
        let stacked = if descriptor.limit.is_none() {
            rule.stacked.as_slice()
        } else {
            &[]
        };
        let (index, kind, cost, quota_mode) = (count.index, count.kind, count.cost, count.quota_mode);
        let first = count.key.clone();
        tally.counts.push(count);
        for (nth, quota) in (1..).zip(stacked) {
            let start = tally.keys.len();
            push_stacked_counter(&mut tally.keys, first.clone(), nth);
            tally.counts.push(Count {
                index,
                rule,
                kind,
                key: start..tally.keys.len(),
                cost,
                quota: *quota,
                quota_mode,
                nth,
            });
        }
    }

    /// The limit of the descriptor at `index` under `rule`, if it has one, its counter's key
    /// appended to `keys`.
    #[inline]
    fn count_of<'g>(
        &self,
        generation: &Generation,
        (index, descriptor, rule): (usize, &Descriptor<'_>, &'g Rule),
        peek: bool,
        keys: &mut String,
    ) -> Option<Count<'g>> {
        let quota = match (descriptor.limit, rule.limit) {
            (Some(quota), _) | (None, Limit::Quota(quota)) => quota,
            (None, Limit::Unlimited) => return None,
        };
        let kind = rule.algorithm.unwrap_or(self.settings.algorithm);
        if !generation.counts(kind) {
            return None;
        }
        let start = keys.len();
        push_counter(keys, rule, descriptor.entries, descriptor.limit);
        Some(Count {
            index,
            rule,
            kind,
            key: start..keys.len(),
            cost: if peek { 0 } else { descriptor.hits },
            quota,
            quota_mode: rule.quota_mode || self.settings.quota_mode,
            nth: 0,
        })
    }

    /// Records a decided request (unless it was a look) and lets the front end read it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn finish<T>(
        &self,
        generation: &Generation,
        request: Request<'_>,
        (counts, statuses): (&[Count<'_>], &[Status<'_>]),
        denied: bool,
        peek: bool,
        (front, started, span): (Option<FrontEnd>, Option<u64>, &Span),
        read: impl FnOnce(&Outcome<'_, '_>) -> T,
    ) -> T {
        // One reading for the latency and the heavy hitters' window.
        let now = started.map(|_| MonotonicClock.now());
        if !peek {
            self.record(generation, request, counts, statuses, now);
        }
        if let (Some(front), Some(started), Some(now)) = (front, started, now) {
            self.record_latency(front, Duration::from_nanos(now.saturating_sub(started)));
        }
        if !span.is_disabled() {
            self.trace(span, request, statuses, denied);
        }
        read(&Outcome {
            // Global shadow mode: counted and recorded as enforced, answered OK.
            denied: denied && !self.settings.shadow,
            descriptors: request.descriptors.len(),
            counts,
            statuses,
            generation,
        })
    }

    /// Counts each limited status of a decided request under its rule (at `now`, when the
    /// decision was timed), and logs a denial (paced).
    fn record(
        &self,
        generation: &Generation,
        request: Request<'_>,
        counts: &[Count<'_>],
        statuses: &[Status<'_>],
        now: Option<u64>,
    ) {
        let mut limits = counts.iter().zip(statuses).peekable();
        while let Some((count, status)) = limits.next() {
            // A descriptor's limits (its rule's stacked quotas) are one decision: recorded
            // once, at the worst standing among them.
            let mut standing = Standing::of(&status.decision, status.quota.capacity());
            while let Some((_, next)) = limits.next_if(|(next, _)| next.index == count.index) {
                standing = standing.max(Standing::of(&next.decision, next.quota.capacity()));
            }
            let (Some(rule), Some(descriptor)) = (status.rule, request.descriptors.get(count.index)) else {
                continue;
            };
            let over = standing == Standing::Over;
            if over && !rule.shadow_mode {
                self.log_denied(rule, || descriptor_key(descriptor.entries));
            }
            if !self.settings.observe {
                continue;
            }
            if let Some(stats) = generation.stats.get(&rule.id) {
                stats.record(descriptor.hits, standing, rule.shadow_mode, now, |key| {
                    write_descriptor_key(descriptor.entries, key);
                });
                if let Some(label) = metric_label(rule, descriptor.entries) {
                    stats.record_label(label, descriptor.hits, over, rule.shadow_mode);
                }
            }
        }
    }

    /// Writes a decided request into its span: the outcome, the rule that denied it (or every
    /// rule it was counted against), and its descriptors only if the settings ask for keys.
    #[cold]
    fn trace(&self, span: &Span, request: Request<'_>, statuses: &[Status<'_>], denied: bool) {
        let outcome = if denied && !self.settings.shadow {
            "OVER_LIMIT"
        } else {
            "OK"
        };
        span.record("outcome", outcome);
        if denied && self.settings.shadow {
            span.record("shadow", true);
        }
        let named = if denied {
            (statuses.iter().find(|status| status.denies()))
                .and_then(|status| status.rule)
                .map(|rule| rule.id.to_string())
        } else {
            let ids: Vec<String> = (statuses.iter().filter_map(|status| status.rule))
                .map(|rule| rule.id.to_string())
                .collect();
            (!ids.is_empty()).then(|| ids.join(","))
        };
        if let Some(named) = named {
            span.record("rule", named);
        }
        if self.settings.trace_keys {
            let keys: Vec<String> = (request.descriptors.iter())
                .map(|descriptor| descriptor_key(descriptor.entries))
                .collect();
            span.record("descriptors", keys.join("; "));
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
