//! How an engine is set up: how a request's descriptors are counted, which fields an answer
//! carries, the bounds of a request and of the counters, and what is observed.

use sluice::AlgorithmKind;

use crate::counters::{CounterSettings, ValueQuotas};
use crate::request::RequestBounds;

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
