//! How an engine is set up: how a request's descriptors are counted, which fields an answer
//! carries, the bounds of a request and of the counters, and what is observed.

use sluice::AlgorithmKind;

pub use sluice_descriptors::Counting;
pub use sluice_http::FieldSet;

use crate::counters::{CounterSettings, ValueQuotas};
use crate::request::RequestBounds;

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// The algorithm of rules that name none.
    pub algorithm: AlgorithmKind,
    /// How a request's descriptors are counted.
    pub counting: Counting,
    /// The rate-limit header fields answers carry (`rls.headers`).
    pub headers: FieldSet,
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
    /// Every request is answered OK while counted and reported as if enforced (`rls.shadow`,
    /// envoy ratelimit's global shadow mode).
    pub shadow: bool,
    /// Every rule counts in quota mode (`rls.quota_mode`): a request is denied only when
    /// every limit it is counted against is over.
    pub quota_mode: bool,
    /// Answers carry the request and the `metadata:` of the rules that admitted it
    /// (`rls.dynamic_metadata`; RLS's `dynamic_metadata`).
    pub dynamic_metadata: bool,
    /// A decision's trace span names its descriptors (the keys); off, only the domain, the
    /// rule and the outcome.
    pub trace_keys: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            algorithm: AlgorithmKind::TokenBucket,
            counting: Counting::default(),
            headers: FieldSet::default(),
            bounds: RequestBounds::default(),
            counters: CounterSettings::default(),
            by_value: None,
            denied_log_per_second: 0,
            observe: true,
            shadow: false,
            quota_mode: false,
            dynamic_metadata: false,
            trace_keys: false,
        }
    }
}
