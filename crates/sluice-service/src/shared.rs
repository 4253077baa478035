//! Counters on Redis: the engine's limits shared by every `sluice serve` on the same Redis.
//!
//! One [`RedisLimiter`] per algorithm the rules use, keyed by the same counter keys as the
//! memory counters and given each key's quota by the same [`RuleQuotas`]. The state lives in
//! Redis, so a reload builds new limiters on the same keys and every count stays (the scripts
//! carry a count over to a changed quota, as the core does).

use std::future::Future;
use std::pin::Pin;

use sluice::{AlgorithmKind, Decision, Quota};
use sluice_redis::{FailurePolicy, RedisAlgorithm, RedisAlgorithmVisitor, RedisLimiter, RedisStore};

use crate::counters::{CounterSettings, RuleQuotas};

/// Where and how the engine's counters are kept on Redis.
///
/// # Example
/// ```no_run
/// use sluice_redis::{FailurePolicy, RedisOptions, RedisStore};
/// use sluice_service::RedisCounters;
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379", RedisOptions::default()).await?;
/// let redis = RedisCounters {
///     policy: FailurePolicy::FailClosed,
///     ..RedisCounters::new(store)
/// };
/// # let _ = redis; Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisCounters {
    /// The connection (or cluster) the counters live on.
    pub store: RedisStore,
    /// The answer while Redis does not answer.
    pub policy: FailurePolicy,
    /// How many processes share the limits (each one's share under
    /// [`FailurePolicy::LocalShare`] is `quota / hosts`).
    pub hosts: u64,
    /// The prefix of every Redis key the engine writes.
    pub prefix: String,
}

impl RedisCounters {
    /// Counters on `store`, failing open while it does not answer, one host, prefix
    /// `sluice:descriptors`.
    pub fn new(store: RedisStore) -> Self {
        Self {
            store,
            policy: FailurePolicy::default(),
            hosts: 1,
            prefix: "sluice:descriptors".into(),
        }
    }
}

impl std::fmt::Debug for RedisCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCounters")
            .field("policy", &self.policy)
            .field("hosts", &self.hosts)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A check on Redis, in flight.
pub(crate) type Take<'a> = Pin<Box<dyn Future<Output = Result<Decision, sluice_redis::Error>> + Send + 'a>>;

/// One algorithm's counters on Redis.
pub(crate) trait SharedCounters: Send + Sync {
    /// Takes `cost` from `key`'s counter if all of it fits (0 peeks): the failure policy
    /// answers while Redis does not.
    fn take<'a>(&'a self, key: &'a str, cost: u64) -> Take<'a>;
    /// The quota `key` is governed by now.
    fn quota_of(&self, key: &str) -> Quota;
}

impl<A: RedisAlgorithm> SharedCounters for RedisLimiter<A, RuleQuotas> {
    fn take<'a>(&'a self, key: &'a str, cost: u64) -> Take<'a> {
        Box::pin(self.check_n(key, cost))
    }

    fn quota_of(&self, key: &str) -> Quota {
        RedisLimiter::quota_of(self, key)
    }
}

/// How long a request is told to wait when Redis cannot decide its limit at all.
const UNDECIDED_RETRY_NS: u64 = 1_000_000_000;

/// A take on Redis as a decision. Outages are answered inside the limiter, by its failure
/// policy; a cost beyond the quota is the error; a quota Redis cannot hold exactly (a
/// request's own override) is denied, and logged.
pub(crate) async fn decide(
    counters: &dyn SharedCounters,
    key: &str,
    cost: u64,
) -> Result<Decision, sluice::CheckError> {
    match counters.take(key, cost).await {
        Ok(decision) => Ok(decision),
        Err(sluice_redis::Error::Check(e)) => Err(e),
        Err(e) => {
            tracing::error!(key, "cannot decide on Redis: {e}; denying");
            Ok(Decision::denied(0, 0, 0, UNDECIDED_RETRY_NS))
        }
    }
}

/// The Redis limiter of `kind` over `quotas`.
pub(crate) fn build(
    kind: AlgorithmKind,
    quotas: RuleQuotas,
    redis: &RedisCounters,
    settings: CounterSettings,
) -> Result<std::sync::Arc<dyn SharedCounters>, sluice_redis::Error> {
    struct Build<'a>(RuleQuotas, &'a RedisCounters, CounterSettings);
    impl RedisAlgorithmVisitor for Build<'_> {
        type Output = Result<std::sync::Arc<dyn SharedCounters>, sluice_redis::Error>;
        fn visit<A: RedisAlgorithm>(self, algorithm: A) -> Self::Output {
            let Build(quotas, redis, settings) = self;
            // As in memory: a key whose rule is gone is admitted nothing.
            let builder = RedisLimiter::builder(algorithm, settings.failsafe)
                .source(quotas)
                .unknown_key_quota(Quota::deny_all())
                .policy(redis.policy)
                .hosts(redis.hosts)
                .prefix(redis.prefix.clone())
                .capacity(settings.capacity)
                .refresh_every(settings.refresh);
            let builder = match settings.failsafe_pool {
                Some(pool) => builder.failsafe_pool(pool),
                None => builder,
            };
            Ok(std::sync::Arc::new(builder.build(redis.store.clone())?))
        }
    }
    sluice_redis::visit_scripted(kind, Build(quotas, redis, settings))?
}
