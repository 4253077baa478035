//! The messages of Envoy's Rate Limit Quota Service, v3
//! (`envoy.service.rate_limit_quota.v3`), written out by hand with the field numbers and wire
//! types of Envoy's `rlqs.proto`, and of `envoy.type.v3`'s `RateLimitStrategy` and
//! `TokenBucket` they carry: only what the service reads and writes, as the RLS messages
//! ([`crate::proto`]). `tests/rlqs.rs` checks them against the official definitions (the
//! `envoy-types` crate), on bytes and over a socket.
//!
//! Enumerations are carried as their `int32` numbers, which is how they travel on the wire.

use std::collections::BTreeMap;

pub use crate::proto::Duration;

/// `RateLimitQuotaUsageReports`: what a data plane streams, one message per report.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitQuotaUsageReports {
    /// The domain the buckets are matched in: set on a stream's first message, the same or
    /// empty on the others.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// One usage report per bucket, in the order they are to be read.
    #[prost(message, repeated, tag = "2")]
    pub bucket_quota_usages: Vec<BucketQuotaUsage>,
}

/// `RateLimitQuotaUsageReports.BucketQuotaUsage`: one bucket's usage since its last report.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketQuotaUsage {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<BucketId>,
    /// The time since the bucket's last report.
    #[prost(message, optional, tag = "2")]
    pub time_elapsed: Option<Duration>,
    /// Requests let through.
    #[prost(uint64, tag = "3")]
    pub num_requests_allowed: u64,
    /// Requests throttled.
    #[prost(uint64, tag = "4")]
    pub num_requests_denied: u64,
}

/// `BucketId`: a map of strings; the order of its entries does not matter.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct BucketId {
    /// Its entries.
    #[prost(btree_map = "string, string", tag = "1")]
    pub bucket: BTreeMap<String, String>,
}

/// `RateLimitQuotaResponse`: what the server sends, on a report or on its own.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitQuotaResponse {
    /// Actions to apply to buckets, in order.
    #[prost(message, repeated, tag = "1")]
    pub bucket_action: Vec<BucketAction>,
}

/// `RateLimitQuotaResponse.BucketAction`: what one bucket is to do.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BucketAction {
    /// The bucket.
    #[prost(message, optional, tag = "1")]
    pub bucket_id: Option<BucketId>,
    /// The action.
    #[prost(oneof = "Action", tags = "2, 3")]
    pub bucket_action: Option<Action>,
}

/// `RateLimitQuotaResponse.BucketAction.bucket_action`.
#[derive(Clone, Copy, PartialEq, prost::Oneof)]
pub enum Action {
    /// Limit the bucket's requests so, for a while.
    #[prost(message, tag = "2")]
    QuotaAssignmentAction(QuotaAssignmentAction),
    /// Forget the bucket: the server sends it nothing more.
    #[prost(message, tag = "3")]
    AbandonAction(AbandonAction),
}

/// `RateLimitQuotaResponse.BucketAction.QuotaAssignmentAction`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct QuotaAssignmentAction {
    /// How long the assignment holds; unset, for ever.
    #[prost(message, optional, tag = "2")]
    pub assignment_time_to_live: Option<Duration>,
    /// How the bucket's requests are limited; unset, all allowed.
    #[prost(message, optional, tag = "3")]
    pub rate_limit_strategy: Option<RateLimitStrategy>,
}

/// `RateLimitQuotaResponse.BucketAction.AbandonAction`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct AbandonAction {}

/// `envoy.type.v3.RateLimitStrategy`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct RateLimitStrategy {
    /// The strategy; unset, all allowed.
    #[prost(oneof = "Strategy", tags = "1, 2, 3")]
    pub strategy: Option<Strategy>,
}

/// `envoy.type.v3.RateLimitStrategy.strategy`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Oneof)]
pub enum Strategy {
    /// Allow or deny every request: a [`BlanketRule`] number.
    #[prost(int32, tag = "1")]
    BlanketRule(i32),
    /// So many requests per time unit, by whatever algorithm the data plane chooses.
    #[prost(message, tag = "2")]
    RequestsPerTimeUnit(RequestsPerTimeUnit),
    /// A token bucket.
    #[prost(message, tag = "3")]
    TokenBucket(TokenBucket),
}

/// `envoy.type.v3.RateLimitStrategy.BlanketRule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlanketRule {
    /// Every request allowed.
    AllowAll = 0,
    /// Every request denied.
    DenyAll = 1,
}

/// `envoy.type.v3.RateLimitStrategy.RequestsPerTimeUnit`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct RequestsPerTimeUnit {
    /// Requests per unit; 0 denies every request.
    #[prost(uint64, tag = "1")]
    pub requests_per_time_unit: u64,
    /// An `envoy.type.v3.RateLimitUnit` number (1 second, 2 minute, 3 hour, 4 day, 5 month,
    /// 6 year).
    #[prost(int32, tag = "2")]
    pub time_unit: i32,
}

/// `envoy.type.v3.TokenBucket`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct TokenBucket {
    /// The most tokens it holds, and how many it starts with.
    #[prost(uint32, tag = "1")]
    pub max_tokens: u32,
    /// Tokens added each fill; unset, one.
    #[prost(message, optional, tag = "2")]
    pub tokens_per_fill: Option<UInt32Value>,
    /// The time between fills.
    #[prost(message, optional, tag = "3")]
    pub fill_interval: Option<Duration>,
}

/// `google.protobuf.UInt32Value`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct UInt32Value {
    /// The value.
    #[prost(uint32, tag = "1")]
    pub value: u32,
}

impl BucketAction {
    /// An assignment of `strategy` to `bucket_id` for `ttl`.
    ///
    /// ```
    /// use sluice_service::rlqs::proto::{Action, BlanketRule, BucketAction, BucketId, Duration, RateLimitStrategy, Strategy};
    /// let deny = RateLimitStrategy { strategy: Some(Strategy::BlanketRule(BlanketRule::DenyAll as i32)) };
    /// let action = BucketAction::assign(BucketId::default(), deny, Duration { seconds: 3, nanos: 0 });
    /// assert!(matches!(action.bucket_action, Some(Action::QuotaAssignmentAction(_))));
    /// ```
    pub fn assign(bucket_id: BucketId, strategy: RateLimitStrategy, ttl: Duration) -> Self {
        Self {
            bucket_id: Some(bucket_id),
            bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(ttl),
                rate_limit_strategy: Some(strategy),
            })),
        }
    }

    /// An abandon of `bucket_id`.
    ///
    /// ```
    /// use sluice_service::rlqs::proto::{Action, BucketAction, BucketId};
    /// let action = BucketAction::abandon(BucketId::default());
    /// assert!(matches!(action.bucket_action, Some(Action::AbandonAction(_))));
    /// ```
    pub fn abandon(bucket_id: BucketId) -> Self {
        Self {
            bucket_id: Some(bucket_id),
            bucket_action: Some(Action::AbandonAction(AbandonAction {})),
        }
    }
}

impl RateLimitStrategy {
    /// A blanket rule.
    ///
    /// ```
    /// use sluice_service::rlqs::proto::{BlanketRule, RateLimitStrategy, Strategy};
    /// let allow = RateLimitStrategy::blanket(BlanketRule::AllowAll);
    /// assert_eq!(allow.strategy, Some(Strategy::BlanketRule(0)));
    /// ```
    pub fn blanket(rule: BlanketRule) -> Self {
        Self {
            strategy: Some(Strategy::BlanketRule(rule as i32)),
        }
    }
}

impl Duration {
    /// The protobuf duration of `duration`, saturating at `i64::MAX` seconds.
    ///
    /// ```
    /// use sluice_service::rlqs::proto::Duration;
    /// let d = Duration::of(std::time::Duration::from_millis(1500));
    /// assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
    /// ```
    pub fn of(duration: std::time::Duration) -> Self {
        Self {
            seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(duration.subsec_nanos()).unwrap_or(0),
        }
    }

    /// The duration it is, if it is one: `None` when negative or its nanoseconds are out of
    /// range.
    ///
    /// ```
    /// use sluice_service::rlqs::proto::Duration;
    /// assert_eq!(Duration { seconds: 2, nanos: 5 }.to_std(), Some(std::time::Duration::new(2, 5)));
    /// assert_eq!(Duration { seconds: -1, nanos: 0 }.to_std(), None);
    /// ```
    pub fn to_std(self) -> Option<std::time::Duration> {
        let seconds = u64::try_from(self.seconds).ok()?;
        let nanos = u32::try_from(self.nanos).ok().filter(|n| *n < 1_000_000_000)?;
        Some(std::time::Duration::new(seconds, nanos))
    }
}
