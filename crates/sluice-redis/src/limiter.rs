//! The strict Redis limiter: every check is one atomic script on Redis, with per-key quotas
//! from a core quota source and a failure policy when Redis does not answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice::{
    CheckError, Clock, DEFAULT_CAPACITY, DEFAULT_REFRESH, Decision, KeyedLimiter, MonotonicClock, Quota,
    QuotaSource, StaticQuotas, Unmetered, saturating_nanos,
};

use crate::algorithm::kind_of;
use crate::metrics::{LimiterCounts, RedisMetrics};
use crate::script::{Kind, Plan};
use crate::source::{Share, SharedSource, share};
use crate::store::CallError;

mod after;
use crate::{Error, FailurePolicy, QuotaTooLarge, RedisAlgorithm, RedisOptions, RedisStore, SetupError};

/// Builds a [`RedisLimiter`]: algorithm, quotas, failure policy, hosts.
///
/// # Example
/// ```no_run
/// use sluice::{StaticQuotas, TokenBucket};
/// use sluice_redis::{FailurePolicy, RedisLimiter, RedisOptions};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let quotas = StaticQuotas::from_iter([("alice".to_string(), "100/s".parse()?)]);
/// let limiter = RedisLimiter::builder(TokenBucket, "10/s".parse()?)
///     .source(quotas)
///     .unknown_key_quota("1/s".parse()?)
///     .policy(FailurePolicy::LocalShare)
///     .hosts(3)
///     .connect("redis://127.0.0.1:6379", RedisOptions::default())
///     .await?;
/// let decision = limiter.check_n("alice", 1).await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until built"]
pub struct RedisLimiterBuilder<A, S> {
    algorithm: A,
    failsafe: Quota,
    unknown: Quota,
    source: S,
    prefix: String,
    policy: FailurePolicy,
    hosts: u64,
    capacity: usize,
    refresh: Duration,
    clock: LocalClock,
    pool: Option<Quota>,
    hash_tag: HashTag,
}

/// Which part of a key names its Redis Cluster slot: `Some((tag, rest))` puts the key's state
/// under `{prefix:tag}rest`, beside the state of the key `tag`, so a group of keys can be
/// decided in one call ([`RedisLimiter::check_all`]); `None` keeps it under `{prefix:key}`.
///
/// # Example
/// ```
/// // `child:NAME` hashes with `NAME`.
/// let tag: sluice_redis::HashTag = |key| {
///     key.strip_prefix("child:").map(|parent| (parent.to_string(), ":child".to_string()))
/// };
/// assert_eq!(tag("child:alice"), Some(("alice".into(), ":child".into())));
/// assert_eq!(tag("alice"), None);
/// ```
pub type HashTag = fn(&str) -> Option<(String, String)>;

fn own_tag(_: &str) -> Option<(String, String)> {
    None
}

/// The host clock of the local share (only the fallback reads the host's clock).
type LocalClock = Arc<dyn Clock>;

impl<A: RedisAlgorithm, S: QuotaSource<String>> RedisLimiterBuilder<A, S> {
    /// Where quotas come from (default: none, so every key gets the unknown-key quota).
    pub fn source<S2: QuotaSource<String>>(self, source: S2) -> RedisLimiterBuilder<A, S2> {
        RedisLimiterBuilder {
            algorithm: self.algorithm,
            failsafe: self.failsafe,
            unknown: self.unknown,
            source,
            prefix: self.prefix,
            policy: self.policy,
            hosts: self.hosts,
            hash_tag: self.hash_tag,
            capacity: self.capacity,
            refresh: self.refresh,
            clock: self.clock,
            pool: self.pool,
        }
    }

    /// The host clock the local share counts with (default [`sluice::MonotonicClock`]).
    /// Checks on Redis never read it: they use Redis' clock, so hosts whose clocks disagree
    /// still share one limit.
    pub fn local_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The quota of keys the source does not know (default [`Quota::deny_all`], as in the core).
    pub fn unknown_key_quota(mut self, quota: Quota) -> Self {
        self.unknown = quota;
        self
    }

    /// Which part of each key names its Redis Cluster slot (default: the whole key). Keys
    /// decided together by [`RedisLimiter::check_all`] must share one.
    pub fn hash_tag(mut self, tag: HashTag) -> Self {
        self.hash_tag = tag;
        self
    }

    /// The prefix of every Redis key (default `sluice`); limiters that share a prefix and a
    /// key share the limit.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What checks answer when Redis does not (default [`FailurePolicy::LocalShare`]).
    pub fn policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How many hosts share the limits (default 1): the local share is `quota / hosts`.
    pub fn hosts(mut self, hosts: u64) -> Self {
        self.hosts = hosts.max(1);
        self
    }

    /// How many keys' quotas are held in memory (default [`sluice::DEFAULT_CAPACITY`]), as in
    /// the core keyed limiter.
    pub fn capacity(mut self, keys: usize) -> Self {
        self.capacity = keys;
        self
    }

    /// One shared limit on what keys without a quota of their own yet, and keys the quota
    /// store cannot hold, are admitted together (default: none), as
    /// [`sluice::KeyedBuilder::failsafe_pool`]: drawn on in this process before Redis is asked.
    ///
    /// # Example
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = sluice_redis::RedisLimiter::builder(sluice::TokenBucket, "10/s".parse()?)
    ///     .failsafe_pool("100/s".parse()?) // all new keys together; 10/s each
    ///     .connect("redis://127.0.0.1:6379", Default::default())
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn failsafe_pool(mut self, quota: Quota) -> Self {
        self.pool = Some(quota);
        self
    }

    /// How often a held key's quota is fetched again (default 60 s).
    pub fn refresh_every(mut self, period: Duration) -> Self {
        self.refresh = period;
        self
    }

    /// Connects to `url` and builds the limiter.
    ///
    /// # Errors
    /// As [`RedisStore::connect`], and [`SetupError::QuotaTooLarge`] for a failsafe or
    /// unknown-key quota the backend cannot hold.
    pub async fn connect(self, url: &str, options: RedisOptions) -> Result<RedisLimiter<A, S>, SetupError> {
        let store = RedisStore::connect(url, options).await?;
        self.build(store)
    }

    /// Builds the limiter on an existing connection (several limiters may share one).
    ///
    /// # Errors
    /// [`SetupError::QuotaTooLarge`] for a failsafe or unknown-key quota the backend cannot
    /// hold.
    pub fn build(self, store: RedisStore) -> Result<RedisLimiter<A, S>, SetupError> {
        let kind = kind_of(&self.algorithm);
        for quota in [self.failsafe, self.unknown] {
            if !quota.is_deny_all() {
                Plan::new(kind, &quota)?;
            }
        }
        let source = Arc::new(self.source);
        // Quota fetches that do not finish at once run on the store's runtime.
        let runtime = store.runtime().clone();
        let spawn = move |task| {
            runtime.spawn(task);
        };
        let mut book = KeyedLimiter::builder(Unmetered, self.failsafe)
            .source(SharedSource(Arc::clone(&source)))
            .unknown_key_quota(self.unknown)
            .capacity(self.capacity)
            .refresh_every(self.refresh)
            .spawner(spawn.clone());
        if let Some(pool) = self.pool {
            book = book.failsafe_pool(pool);
        }
        let book = book.build()?;
        let fallback = match self.policy {
            FailurePolicy::LocalShare => {
                let failsafe = share(self.failsafe, self.hosts)?;
                let unknown = share(self.unknown, self.hosts)?;
                let limiter = KeyedLimiter::builder(self.algorithm.clone(), failsafe)
                    .source(Share {
                        source,
                        hosts: self.hosts,
                    })
                    .unknown_key_quota(unknown)
                    .capacity(self.capacity)
                    .refresh_every(self.refresh)
                    .spawner(spawn)
                    .clock(self.clock)
                    .build()?;
                Some(limiter)
            }
            _ => None,
        };
        Ok(RedisLimiter {
            inner: Arc::new(Inner {
                store,
                kind,
                hash_tag: self.hash_tag,
                prefix: self.prefix,
                policy: self.policy,
                hosts: self.hosts,
                book,
                fallback,
                counters: LimiterCounts::default(),
            }),
        })
    }
}

/// Many limits by key, shared by every process that uses the same Redis (or Redis Cluster)
/// and key prefix. Each check is one atomic Lua script on Redis' own clock; quotas come from
/// a core [`QuotaSource`] exactly as in [`sluice::KeyedLimiter`] (failsafe quota while a fetch
/// runs, unknown-key quota); when Redis does not answer within the timeout the
/// [`FailurePolicy`] decides, and Redis is probed with backoff until it answers again.
///
/// Cheap to clone (all clones share the same state).
///
/// # Example
/// ```no_run
/// use sluice::TokenBucket;
/// use sluice_redis::{RedisLimiter, RedisOptions};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RedisLimiter::builder(TokenBucket, "100/s".parse()?)
///     .unknown_key_quota("100/s".parse()?)
///     .connect("redis://127.0.0.1:6379", RedisOptions::default())
///     .await?;
/// if limiter.check_n("client-42", 1).await?.is_allowed() {
///     // serve
/// }
/// # Ok(()) }
/// ```
pub struct RedisLimiter<A: RedisAlgorithm, S = StaticQuotas<String>> {
    inner: Arc<Inner<A, S>>,
}

impl<A: RedisAlgorithm, S> Clone for RedisLimiter<A, S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<A: RedisAlgorithm, S> std::fmt::Debug for RedisLimiter<A, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("kind", &self.inner.kind)
            .field("prefix", &self.inner.prefix)
            .field("policy", &self.inner.policy)
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

struct Inner<A: RedisAlgorithm, S> {
    store: RedisStore,
    kind: Kind,
    hash_tag: HashTag,
    prefix: String,
    policy: FailurePolicy,
    hosts: u64,
    /// The quota of each key, from the source, with the core's failsafe and unknown-key
    /// rules (it counts nothing: the counting is on Redis).
    book: KeyedLimiter<String, Unmetered, SharedSource<S>>,
    fallback: Option<KeyedLimiter<String, A, Share<S>, LocalClock>>,
    counters: LimiterCounts,
}

impl<A: RedisAlgorithm> RedisLimiter<A> {
    /// A builder for `algorithm`, with `failsafe` as the quota of a key whose own quota is
    /// still being fetched.
    pub fn builder(algorithm: A, failsafe: Quota) -> RedisLimiterBuilder<A, StaticQuotas<String>> {
        RedisLimiterBuilder {
            algorithm,
            failsafe,
            unknown: Quota::deny_all(),
            source: StaticQuotas::from_iter(std::iter::empty()),
            prefix: "sluice".to_string(),
            policy: FailurePolicy::default(),
            hosts: 1,
            capacity: DEFAULT_CAPACITY,
            refresh: DEFAULT_REFRESH,
            clock: Arc::new(MonotonicClock),
            pool: None,
            hash_tag: own_tag,
        }
    }
}

/// Whether a script consumes a cost its limit does not admit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Consume {
    /// Only if admitted: a check.
    IfAdmitted,
    /// Even beyond the limit: the hybrid limiter's sync of what it admitted locally.
    Regardless,
}

/// The time a script decides at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScriptTime {
    /// Redis' own clock, so hosts with skewed clocks agree.
    Redis,
    /// A given time in microseconds, for tests that replay a sequence of instants.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    AtMicros(u64),
}

/// A check that could not be decided, or the quota it ran under.
pub(crate) enum Prepared {
    Done(Result<Decision, Error>),
    Plan(Quota, Plan),
}

impl<A: RedisAlgorithm, S: QuotaSource<String>> RedisLimiter<A, S> {
    /// Checks `cost` units for `key`, all or nothing (0 peeks), as
    /// [`sluice::KeyedLimiter::check_n`] does, on the state shared through Redis.
    ///
    /// # Errors
    /// [`Error::Check`] if the key's quota can never admit `cost`; [`Error::QuotaTooLarge`] if
    /// the key's quota cannot be held exactly by the backend. An unreachable Redis is not an
    /// error: the failure policy answers.
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_with(key, cost, ScriptTime::Redis).await
    }

    /// As [`RedisLimiter::check_n`], at a given Redis time in microseconds instead of Redis'
    /// clock: for tests that replay a sequence of instants (feature `test-hooks`).
    #[cfg(feature = "test-hooks")]
    pub async fn check_n_at_micros(&self, key: &str, cost: u64, now_micros: u64) -> Result<Decision, Error> {
        self.check_with(key, cost, ScriptTime::AtMicros(now_micros)).await
    }

    async fn check_with(&self, key: &str, cost: u64, now: ScriptTime) -> Result<Decision, Error> {
        let (quota, plan) = match self.prepare(key, cost) {
            Prepared::Done(result) => return result,
            Prepared::Plan(quota, plan) => (quota, plan),
        };
        match self.run(key, &plan, cost, Consume::IfAdmitted, now).await {
            Ok(decision) => Ok(decision),
            Err(error) => self.by_policy(key, &quota, cost, &error),
        }
    }

    /// The key's quota and plan, or the answer when Redis is not needed.
    pub(crate) fn prepare(&self, key: &str, cost: u64) -> Prepared {
        // The book counts nothing (Unmetered) but answers a cost above capacity, a deny-all
        // quota and, for a key without its own quota yet, the failsafe pool (drawn on).
        let (answer, quota) = self.inner.book.check_n_quoted(key, cost);
        match answer {
            Err(error) => return Prepared::Done(Err(error.into())),
            Ok(d) if !d.is_allowed() || quota.is_deny_all() => return Prepared::Done(Ok(d)),
            Ok(_) => {}
        }
        match Plan::new(self.inner.kind, &quota) {
            Ok(plan) => Prepared::Plan(quota, plan),
            Err(e) => Prepared::Done(Err(e.into())),
        }
    }

    /// The Redis name of `key`'s state (before the algorithm's suffix): in braces, the part
    /// that names its Redis Cluster slot.
    fn redis_key(&self, key: &str) -> String {
        let prefix = &self.inner.prefix;
        match (self.inner.hash_tag)(key) {
            Some((tag, rest)) => format!("{{{prefix}:{tag}}}{rest}"),
            None => format!("{{{prefix}:{key}}}"),
        }
    }

    /// The quota `key` is governed by now (fetching it from the source if new).
    pub fn quota_of(&self, key: &str) -> Quota {
        self.inner.book.resolve_quota(key)
    }

    /// The script arguments of a quota (not [`Quota::deny_all`]) under this limiter's algorithm.
    pub(crate) fn plan(&self, quota: &Quota) -> Result<Plan, QuotaTooLarge> {
        Plan::new(self.inner.kind, quota)
    }

    /// Runs the key's script.
    pub(crate) async fn run(
        &self,
        key: &str,
        plan: &Plan,
        cost: u64,
        consume: Consume,
        now: ScriptTime,
    ) -> Result<Decision, CallError> {
        let keys = plan.kind.keys(&self.redis_key(key));
        let to_arg = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let [a, b, c] = plan.args().map(to_arg);
        let force = match consume {
            Consume::IfAdmitted => 0,
            Consume::Regardless => 1,
        };
        // The scripts read Redis' own clock when given a negative time.
        let now = match now {
            ScriptTime::Redis => -1,
            ScriptTime::AtMicros(micros) => to_arg(micros),
        };
        let args = [to_arg(cost), force, now, a, b, c];
        let reply = self.inner.store.eval(plan.kind.script(), &keys, &args).await?;
        self.inner.counters.redis_checks.fetch_add(1, Ordering::Relaxed);
        plan.decision(&reply).ok_or_else(|| {
            tracing::error!(key, ?reply, "unexpected script reply; the failure policy answers");
            CallError::BadReply(reply)
        })
    }

    /// The decision of the failure policy for a check Redis did not answer.
    pub(crate) fn by_policy(
        &self,
        key: &str,
        quota: &Quota,
        cost: u64,
        error: &CallError,
    ) -> Result<Decision, Error> {
        tracing::trace!(key, %error, policy = ?self.inner.policy, "check answered by the failure policy");
        let capacity = quota.capacity();
        let counters = &self.inner.counters;
        match (self.inner.policy, &self.inner.fallback) {
            (FailurePolicy::FailOpen, _) => {
                counters.failed_open.fetch_add(1, Ordering::Relaxed);
                Ok(Decision::allowed(capacity, capacity - cost, 0))
            }
            (FailurePolicy::LocalShare, Some(local)) => {
                counters.local_share.fetch_add(1, Ordering::Relaxed);
                match local.check_n(key, cost) {
                    Ok(decision) => Ok(decision),
                    // More than this host's share can ever admit: wait for Redis.
                    Err(CheckError::CostExceedsCapacity { capacity, .. }) => Ok(Decision::denied(
                        capacity,
                        0,
                        0,
                        saturating_nanos(self.inner.store.until_probe()),
                    )),
                }
            }
            _ => {
                counters.failed_closed.fetch_add(1, Ordering::Relaxed);
                Ok(Decision::denied(
                    capacity,
                    0,
                    0,
                    saturating_nanos(self.inner.store.until_probe()),
                ))
            }
        }
    }

    /// A handle on one key's limit.
    ///
    /// # Example
    /// ```no_run
    /// # async fn demo(limiter: sluice_redis::RedisLimiter<sluice::TokenBucket>) {
    /// let global = limiter.limit("global");
    /// let decision = global.check_n(1).await;
    /// # }
    /// ```
    pub fn limit(&self, key: impl Into<String>) -> RedisLimit<A, S> {
        RedisLimit {
            limiter: self.clone(),
            key: key.into(),
        }
    }

    /// Counters: checks by Redis, by each policy, and the connection's own.
    pub fn metrics(&self) -> RedisMetrics {
        let c = &self.inner.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RedisMetrics {
            store: self.inner.store.metrics(),
            redis_checks: load(&c.redis_checks),
            failed_open: load(&c.failed_open),
            failed_closed: load(&c.failed_closed),
            local_share: load(&c.local_share),
        }
    }

    /// The connection this limiter uses.
    pub fn store(&self) -> &RedisStore {
        &self.inner.store
    }

    /// How many hosts share the limits.
    pub fn hosts(&self) -> u64 {
        self.inner.hosts
    }
}

/// One key of a [`RedisLimiter`], checked without naming the key each time.
///
/// # Example
/// ```no_run
/// # async fn demo(limiter: sluice_redis::RedisLimiter<sluice::FixedWindow>) -> Result<(), sluice_redis::Error> {
/// let uploads = limiter.limit("uploads");
/// assert!(uploads.check_n(0).await?.remaining() <= 10);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedisLimit<A: RedisAlgorithm, S = StaticQuotas<String>> {
    limiter: RedisLimiter<A, S>,
    key: String,
}

impl<A: RedisAlgorithm, S: QuotaSource<String>> RedisLimit<A, S> {
    /// Checks `cost` units of this key ([`RedisLimiter::check_n`]).
    ///
    /// # Errors
    /// As [`RedisLimiter::check_n`].
    pub async fn check_n(&self, cost: u64) -> Result<Decision, Error> {
        self.limiter.check_n(&self.key, cost).await
    }
}
