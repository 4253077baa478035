//! What `sluice serve` says about itself on its admin listener: the host's own state (reloads,
//! the rules' revision and source), and every number in OpenMetrics text, read at each scrape
//! from the engines (decisions per rule, latency per front end, the keyed store, quota
//! fetches, Redis) through `prometheus-client`. Labels are rule places and names from the
//! config, never request keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sluice_service::rlqs::Quotas;
use sluice_service::{Engine, FrontEnd, LatencySnapshot, RuleCounts, RuleReport};

use crate::app::App;
use crate::connection::OpenConnections;

/// The host's own state, written by the config watcher and the rules' watcher or poller.
#[derive(Debug, Default)]
pub struct HostState {
    /// Config reloads applied.
    pub config_reloads: AtomicU64,
    /// Config edits refused (the running config stayed).
    pub config_reloads_failed: AtomicU64,
    /// Rule sets applied after the first.
    pub rules_reloads: AtomicU64,
    /// Rule sets refused, and polls that brought none (the running rules stayed).
    pub rules_reloads_failed: AtomicU64,
    /// The rules service's revision in force (0 for rules from files).
    pub rules_revision: AtomicU64,
    /// The rules in force came from the snapshot file, not the rules service.
    pub rules_from_snapshot: AtomicBool,
    /// SIGTERM came: not ready, while still accepting for the drain delay.
    pub draining: AtomicBool,
    /// The rules service is not answering (or answers garbage) now.
    pub rules_service_down: AtomicBool,
    /// `metrics: {per_rule: false}` in the config in force: decisions counted per domain.
    pub metrics_per_domain: AtomicBool,
    /// The buckets of RLQS streams (`rls.rlqs`), once the service serves them.
    pub rlqs: OnceLock<Arc<Quotas>>,
}

/// Everything the admin listener reads.
#[derive(Clone)]
pub struct Observed {
    /// The demo's app (its engine decides the HTTP layer's requests); replaced on reload.
    pub app: Arc<ArcSwap<App>>,
    /// The rate-limit service's engine, if the config has rules.
    pub service: Option<Arc<Engine>>,
    /// The host's own state.
    pub state: Arc<HostState>,
    /// The connections open now.
    pub open: OpenConnections,
    /// The rules service the host polls, if it does (the console edits rules through it).
    pub rules_service: Option<sluice_rules_client::RulesSource>,
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed").finish_non_exhaustive()
    }
}

impl Observed {
    /// The engines, each with the name its metrics carry (`engine="accounts"|"service"`).
    pub fn engines(&self) -> Vec<(&'static str, Arc<Engine>)> {
        let mut engines = vec![("accounts", Arc::clone(self.app.load().engine()))];
        if let Some(service) = &self.service {
            engines.push(("service", Arc::clone(service)));
        }
        engines
    }

    /// The metrics as OpenMetrics text.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::with_prefix("sluice");
        registry.register_collector(Box::new(self.clone()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)?;
        Ok(text)
    }
}

/// One metric: its descriptor, then each labelled value.
fn family<'a>(
    encoder: &'a mut DescriptorEncoder,
    name: &'a str,
    help: &str,
    kind: MetricType,
) -> Result<MetricEncoder<'a>, std::fmt::Error> {
    encoder.encode_descriptor(name, help, None, kind)
}

fn counter(metric: &mut MetricEncoder, labels: &[(&str, &str)], value: u64) -> Result<(), std::fmt::Error> {
    ConstCounter::new(value).encode(metric.encode_family(&labels)?)
}

fn gauge(metric: &mut MetricEncoder, labels: &[(&str, &str)], value: i64) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(metric.encode_family(&labels)?)
}

/// A gauge without labels.
fn lone_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    ConstGauge::new(value).encode(family(encoder, name, help, MetricType::Gauge)?)
}

/// A metric's name, its help, and how it is read.
type Read<F> = (&'static str, &'static str, F);
/// A store gauge, from the store's counts and its capacity.
type StoreGauge = fn(&sluice::KeyedMetrics, u64) -> u64;
type StoreCount = fn(&sluice::KeyedMetrics) -> u64;
type RedisCount = fn(&sluice_redis::StoreMetrics) -> u64;

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A rule's decisions as the `outcome` label names them.
fn outcomes(counts: &sluice_service::RuleCounts) -> [(&'static str, u64); 3] {
    [
        ("allowed", counts.allowed),
        ("denied", counts.denied),
        ("shadow_denied", counts.shadow_denied),
    ]
}

/// The decision series of one engine: a rule's (its place and name), or with `metrics:
/// {per_rule: false}` a domain's, every rule of it summed.
struct Series {
    domain: String,
    rule: Option<(String, String)>,
    counts: RuleCounts,
}

fn series(rules: &[RuleReport], retired: &[(String, RuleCounts)], per_domain: bool) -> Vec<Series> {
    if !per_domain {
        return (rules.iter())
            .map(|rule| Series {
                domain: rule.domain.clone(),
                rule: Some((rule.rule.to_string(), rule.name.clone().unwrap_or_default())),
                counts: rule.counts,
            })
            .collect();
    }
    // A domain's sum takes in the rules reloads dropped, so it never goes down.
    let counted = (rules.iter()).map(|rule| (&rule.domain, rule.counts));
    let dropped = retired.iter().map(|(domain, counts)| (domain, *counts));
    let mut domains: Vec<Series> = Vec::new();
    for (domain, counts) in counted.chain(dropped) {
        let at = match domains.iter().position(|d| d.domain == *domain) {
            Some(at) => at,
            None => {
                domains.push(Series {
                    domain: domain.clone(),
                    rule: None,
                    counts: RuleCounts::default(),
                });
                domains.len() - 1
            }
        };
        domains[at].counts += counts;
    }
    domains
}

impl Series {
    /// Its labels: the engine's, the domain's, and the rule's place and name if it has them
    /// (`named`: the name too).
    fn labels<'a>(&'a self, engine: &'a str, named: bool) -> Vec<(&'a str, &'a str)> {
        let mut labels = vec![("engine", engine), ("domain", self.domain.as_str())];
        if let Some((place, name)) = &self.rule {
            labels.push(("rule", place.as_str()));
            if named {
                labels.push(("name", name.as_str()));
            }
        }
        labels
    }
}

impl Collector for Observed {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let engines = self.engines();
        let per_domain = self.state.metrics_per_domain.load(Relaxed);
        let reports: Vec<_> = engines.iter().map(|(name, e)| (*name, e.rule_counts())).collect();
        let all: Vec<_> = (reports.iter().zip(&engines))
            .map(|((engine, rules), (_, e))| (*engine, series(rules, &e.retired_counts(), per_domain)))
            .collect();

        let mut m = family(
            &mut encoder,
            "decisions",
            "Requests decided per rule (per domain with metrics.per_rule false): allowed, denied, or denied in shadow mode (admitted).",
            MetricType::Counter,
        )?;
        for (engine, all) in &all {
            for one in all {
                for (outcome, value) in outcomes(&one.counts) {
                    let mut labels = one.labels(engine, true);
                    labels.push(("outcome", outcome));
                    counter(&mut m, &labels, value)?;
                }
            }
        }
        let mut m = family(
            &mut encoder,
            "near_limit",
            "Requests admitted that left less than a fifth of their rule's capacity, per rule (per domain with metrics.per_rule false).",
            MetricType::Counter,
        )?;
        for (engine, all) in &all {
            for one in all {
                counter(&mut m, &one.labels(engine, true), one.counts.near_limit)?;
            }
        }
        if !per_domain {
            let mut m = family(
                &mut encoder,
                "decisions_by_value",
                "Requests decided per value of a detailed_metric or value_to_metric rule (at most 256 values a rule; the rest only in decisions).",
                MetricType::Counter,
            )?;
            for (engine, rules) in &reports {
                for rule in rules {
                    let place = rule.rule.to_string();
                    let name = rule.name.as_deref().unwrap_or("");
                    for (label, counts) in &rule.by_label {
                        for (outcome, value) in outcomes(counts) {
                            let labels = [
                                ("engine", *engine),
                                ("domain", rule.domain.as_str()),
                                ("rule", place.as_str()),
                                ("name", name),
                                ("value", label.as_str()),
                                ("outcome", outcome),
                            ];
                            counter(&mut m, &labels, value)?;
                        }
                    }
                }
            }
        }
        let mut m = family(
            &mut encoder,
            "hits",
            "Hits asked of each rule (each domain with metrics.per_rule false).",
            MetricType::Counter,
        )?;
        for (engine, all) in &all {
            for one in all {
                counter(&mut m, &one.labels(engine, false), one.counts.hits)?;
            }
        }

        let mut m = family(
            &mut encoder,
            "decision_seconds",
            "Time to decide one request, per front end.",
            MetricType::Histogram,
        )?;
        for front in FrontEnd::ALL {
            let mut merged: Option<LatencySnapshot> = None;
            for (_, engine) in &engines {
                let snapshot = engine.latency(front);
                merged = Some(match merged {
                    None => snapshot,
                    Some(mut sum) => {
                        sum.count += snapshot.count;
                        sum.sum_seconds += snapshot.sum_seconds;
                        for (into, from) in sum.buckets.iter_mut().zip(&snapshot.buckets) {
                            into.1 += from.1;
                        }
                        sum
                    }
                });
            }
            if let Some(snapshot) = merged {
                // The encoder sums the buckets itself: it takes each bucket's own count.
                let mut below = 0;
                let own: Vec<(f64, u64)> = (snapshot.buckets.iter())
                    .map(|&(bound, cumulative)| {
                        (bound, cumulative - std::mem::replace(&mut below, cumulative))
                    })
                    .collect();
                let labels = [("front", front.name())];
                let mut one = m.encode_family(&labels)?;
                one.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                    snapshot.sum_seconds,
                    snapshot.count,
                    &own,
                    None,
                )?;
            }
        }

        let stores: Vec<_> = engines
            .iter()
            .filter_map(|(name, engine)| Some((*name, engine.store_metrics()?)))
            .collect();
        let gauges: [Read<StoreGauge>; 5] = [
            ("store_entries", "Counters held in memory.", |m, _| m.entries),
            (
                "store_capacity",
                "The most counters held in memory.",
                |_, capacity| capacity,
            ),
            ("quota_fetches_in_flight", "Quota fetches running now.", |m, _| {
                m.fetches_in_flight
            }),
            (
                "failsafe_pool_used",
                "Units of the failsafe pool in use now (keys still without their own quota).",
                |m, _| m.pool_used,
            ),
            (
                "failsafe_pool_capacity",
                "The failsafe pool's capacity (0: none).",
                |m, _| m.pool_capacity,
            ),
        ];
        for (name, help, read) in gauges {
            let mut m = family(&mut encoder, name, help, MetricType::Gauge)?;
            for (engine, (metrics, capacity)) in &stores {
                gauge(&mut m, &[("engine", engine)], clamp(read(metrics, *capacity)))?;
            }
        }
        let mut m = family(
            &mut encoder,
            "store_evictions",
            "Counters evicted to make room: idle ones, then the least used of a sample.",
            MetricType::Counter,
        )?;
        for (engine, (metrics, _)) in &stores {
            counter(
                &mut m,
                &[("engine", engine), ("reason", "idle")],
                metrics.evicted_idle,
            )?;
            counter(
                &mut m,
                &[("engine", engine), ("reason", "frequency")],
                metrics.evicted_frequency,
            )?;
        }
        let counters: [Read<StoreCount>; 4] = [
            (
                "store_refused",
                "Newcomers not stored: every counter they could replace was used more.",
                |m| m.refused,
            ),
            ("quota_fetches", "Quota fetches started.", |m| m.fetches),
            (
                "quota_fetch_errors",
                "Quota fetches that failed (the key kept its last quota), timeouts among them.",
                |m| m.fetch_errors,
            ),
            ("quota_fetch_timeouts", "Quota fetches that timed out.", |m| {
                m.fetch_timeouts
            }),
        ];
        for (name, help, read) in counters {
            let mut m = family(&mut encoder, name, help, MetricType::Counter)?;
            for (engine, (metrics, _)) in &stores {
                counter(&mut m, &[("engine", engine)], read(metrics))?;
            }
        }

        let redis: Vec<_> = engines
            .iter()
            .filter_map(|(name, engine)| Some((*name, engine.redis()?.store.metrics())))
            .collect();
        if !redis.is_empty() {
            let mut m = family(
                &mut encoder,
                "redis_degraded",
                "1 while Redis counts as unavailable.",
                MetricType::Gauge,
            )?;
            for (engine, metrics) in &redis {
                gauge(&mut m, &[("engine", engine)], i64::from(metrics.degraded))?;
            }
            let counters: [Read<RedisCount>; 5] = [
                ("redis_calls", "Calls Redis answered.", |m| m.calls),
                ("redis_failures", "Calls that failed (error or timeout).", |m| {
                    m.failures
                }),
                ("redis_timeouts", "Calls that timed out.", |m| m.timeouts),
                ("redis_outages", "Times Redis was declared unavailable.", |m| {
                    m.outages
                }),
                (
                    "redis_recoveries",
                    "Times Redis answered again after an outage.",
                    |m| m.recoveries,
                ),
            ];
            for (name, help, read) in counters {
                let mut m = family(&mut encoder, name, help, MetricType::Counter)?;
                for (engine, metrics) in &redis {
                    counter(&mut m, &[("engine", engine)], read(metrics))?;
                }
            }
        }

        let state = &self.state;
        let mut m = family(
            &mut encoder,
            "config_reloads",
            "Config edits applied or refused.",
            MetricType::Counter,
        )?;
        counter(&mut m, &[("result", "ok")], state.config_reloads.load(Relaxed))?;
        counter(
            &mut m,
            &[("result", "failed")],
            state.config_reloads_failed.load(Relaxed),
        )?;
        if self.service.is_some() {
            let mut m = family(
                &mut encoder,
                "rules_reloads",
                "Rule sets applied or refused.",
                MetricType::Counter,
            )?;
            counter(&mut m, &[("result", "ok")], state.rules_reloads.load(Relaxed))?;
            counter(
                &mut m,
                &[("result", "failed")],
                state.rules_reloads_failed.load(Relaxed),
            )?;
            lone_gauge(
                &mut encoder,
                "rules_revision",
                "The rules service's revision in force (0: rules from files).",
                clamp(state.rules_revision.load(Relaxed)),
            )?;
        }
        if let Some(quotas) = state.rlqs.get() {
            encode_rlqs(&mut encoder, quotas)?;
        }
        let app = self.app.load();
        let room = app.wait_room();
        lone_gauge(
            &mut encoder,
            "waiting_requests",
            "Requests over their quota waiting for capacity now (on_excess: wait).",
            clamp(room.waiters() as u64),
        )?;
        let waits = room.counts();
        let mut m = family(
            &mut encoder,
            "wait_outcomes",
            "Requests over their quota that may wait: served after waiting, refused at once \
             (by reason: max_wait, queue_limit, max_waiters), refused after waiting (late).",
            MetricType::Counter,
        )?;
        counter(&mut m, &[("result", "served")], waits.served)?;
        for (reason, n) in [
            ("max_wait", waits.refused_max_wait),
            ("queue_limit", waits.refused_queue_limit),
            ("max_waiters", waits.refused_max_waiters),
        ] {
            counter(&mut m, &[("result", "refused"), ("reason", reason)], n)?;
        }
        counter(&mut m, &[("result", "late")], waits.late)?;
        if let Some(charges) = app.charge_counts() {
            let mut m = family(
                &mut encoder,
                "response_charges",
                "Admitted responses that reported a cost (charge_from): charged (of which capped: \
                 charged the maximum), not a whole number (malformed), not taken by the store \
                 (uncharged).",
                MetricType::Counter,
            )?;
            counter(&mut m, &[("outcome", "charged")], charges.charged)?;
            counter(&mut m, &[("outcome", "capped")], charges.capped)?;
            counter(&mut m, &[("outcome", "malformed")], charges.malformed)?;
            counter(&mut m, &[("outcome", "uncharged")], charges.uncharged)?;
            let mut m = family(
                &mut encoder,
                "response_charged_units",
                "Units charged after responses (charge_from), as reported (capped at the maximum).",
                MetricType::Counter,
            )?;
            counter(&mut m, &[], charges.units)?;
        }
        if let Some(upstream) = app.upstream_stats() {
            encode_upstream(&mut encoder, &upstream.snapshot())?;
        }
        lone_gauge(
            &mut encoder,
            "open_connections",
            "Connections open now.",
            clamp(self.open.get() as u64),
        )?;
        Ok(())
    }
}

/// The proxy's series: answers by code, failures by reason, the time to a response head.
fn encode_upstream(
    encoder: &mut DescriptorEncoder,
    read: &crate::upstream::UpstreamSnapshot,
) -> Result<(), std::fmt::Error> {
    let mut m = family(
        encoder,
        "upstream_requests",
        "Requests forwarded to an upstream, by the status code answered: the upstream's, or the \
         502, 504 (or 408 for a stalled request body) sluice answered for it.",
        MetricType::Counter,
    )?;
    for (code, count) in &read.codes {
        counter(&mut m, &[("code", itoa::Buffer::new().format(*code))], *count)?;
    }
    let mut m = family(
        encoder,
        "upstream_failures",
        "Upstream requests that got no response head: no connection (connect), none within the \
         connect timeout (connect_timeout), no head within the head timeout (head_timeout), the \
         connection broke or the upstream spoke garbage (broken).",
        MetricType::Counter,
    )?;
    for (reason, count) in &read.failures {
        counter(&mut m, &[("reason", reason)], *count)?;
    }
    let mut m = family(
        encoder,
        "upstream_seconds",
        "Time from sending a request upstream to its response head.",
        MetricType::Histogram,
    )?;
    m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
        read.sum_seconds,
        read.count,
        &read.buckets,
        None,
    )
}

/// RLQS (`rls.rlqs`): its streams and the buckets they share.
fn encode_rlqs(encoder: &mut DescriptorEncoder, quotas: &Quotas) -> Result<(), std::fmt::Error> {
    lone_gauge(
        encoder,
        "rlqs_streams",
        "RLQS streams open now.",
        clamp(quotas.streams() as u64),
    )?;
    lone_gauge(
        encoder,
        "rlqs_buckets",
        "RLQS buckets held now: those whose rule's limit is shared among their clients (a blanket allow or deny holds none).",
        clamp(quotas.buckets() as u64),
    )
}
