//! Hybrid mode: admit locally, and every sync interval push the consumed counts to Redis and
//! pull the global state back.
//!
//! Each host holds, per key, an allowance for the current interval: what Redis reported
//! remaining at the last sync, capped at one interval's refill, `ceil(rate × interval)`.
//! Checks take from it with one compare-and-swap and no network. One background task per
//! limiter pushes each key's consumption to Redis with a forced check (Redis' state may go
//! below empty: a debt that the refill repays before Redis reports room again) and sets the
//! next allowance. When the allowance is spent but Redis reported more room (a burst), checks
//! go to Redis and are decided exactly there; when Redis had no room either, they are denied
//! locally until the next sync.
//!
//! Over-admission bound: only local admissions are unknown to Redis, at most
//! `ceil(rate × interval)` per host between two syncs, so the hosts together admit at most
//! `hosts × ceil(rate × interval)` more than the strict limit. For the token bucket and the
//! sliding windows the excess is a debt in Redis and does not accumulate; a fixed window
//! forgets its count when it ends, so there the bound holds per window.
//!
//! Under-admission bound: a host denies locally only when Redis reported no room at its last
//! sync, and room that appears later is seen at the next one; so with demand on every host,
//! the hosts admit at least the strict limit less `hosts × ceil(rate × interval)`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use sluice::{Clock, Decision, MonotonicClock, Quota, QuotaSource, StaticQuotas, saturating_nanos};

use crate::limiter::{Consume, Prepared, ScriptTime};
use crate::sync::{read, write};
use crate::{Error, RedisAlgorithm, RedisLimiter};

/// Counts of a [`HybridLimiter`].
///
/// # Example
/// ```
/// let m = sluice_redis::HybridMetrics::default();
/// assert_eq!(m.local_allowed + m.local_denied, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HybridMetrics {
    /// Keys held locally.
    pub keys: u64,
    /// Checks admitted from the local allowance.
    pub local_allowed: u64,
    /// Checks denied locally: the allowance was spent and Redis had no room at the last contact.
    pub local_denied: u64,
    /// Checks sent to Redis: a key's first check, a cost above one interval's allowance, or
    /// the allowance spent while Redis still reported room.
    pub strict_checks: u64,
    /// Sync rounds run.
    pub syncs: u64,
    /// Keys whose push failed (their counts are kept for the next round).
    pub sync_failures: u64,
}

#[derive(Default)]
struct HybridCounts {
    local_allowed: AtomicU64,
    local_denied: AtomicU64,
    strict_checks: AtomicU64,
    syncs: AtomicU64,
    sync_failures: AtomicU64,
}

/// One key's local allowance: the high 32 bits hold the allowance of the interval, the low
/// 32 bits what was admitted from it and not yet pushed.
struct Entry {
    state: AtomicU64,
    capacity: AtomicU64,
    /// The most one interval's allowance can be.
    max_allowance: AtomicU64,
    /// What Redis said remains, at the last contact.
    global: AtomicU64,
    reset_ns: AtomicU64,
    touched: AtomicBool,
}

const LOW: u64 = 0xFFFF_FFFF;

fn pack(allowance: u64, used: u64) -> u64 {
    (allowance.min(LOW) << 32) | used.min(LOW)
}

fn unpack(state: u64) -> (u64, u64) {
    (state >> 32, state & LOW)
}

impl Entry {
    fn new(quota: &Quota, max_allowance: u64, decision: Decision) -> Self {
        let remaining = decision.remaining();
        Self {
            state: AtomicU64::new(pack(remaining.min(max_allowance), 0)),
            capacity: AtomicU64::new(quota.capacity()),
            max_allowance: AtomicU64::new(max_allowance),
            global: AtomicU64::new(remaining),
            reset_ns: AtomicU64::new(decision.reset_after_nanos()),
            touched: AtomicBool::new(true),
        }
    }

    /// Takes `cost` from the allowance if it fits; returns what was left before.
    fn take(&self, cost: u64) -> Result<u64, u64> {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let (allowance, used) = unpack(s);
                (used + cost <= allowance).then(|| pack(allowance, used + cost))
            })
            .map(|s| {
                let (allowance, used) = unpack(s);
                allowance - used
            })
            .map_err(|s| {
                let (allowance, used) = unpack(s);
                allowance.saturating_sub(used)
            })
    }

    /// Takes the unpushed count, leaving what is left of the allowance.
    fn drain(&self) -> u64 {
        let previous = self
            .state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                let (allowance, used) = unpack(s);
                Some(pack(allowance.saturating_sub(used), 0))
            })
            .unwrap_or(0);
        unpack(previous).1
    }

    /// A new allowance; checks admitted since the drain count against it.
    fn refill(&self, allowance: u64) {
        let _ = self.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            Some(pack(allowance, unpack(s).1))
        });
    }

    /// Puts back a count whose push failed.
    fn restore(&self, count: u64) {
        let _ = self.state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
            let (allowance, used) = unpack(s);
            Some(pack(allowance + count, used + count))
        });
    }
}

/// A limiter that admits from a local allowance and syncs with Redis every interval: the
/// speed of an in-process limiter for a bounded over-admission (see the module docs: about
/// `hosts × rate × interval`). Wraps a [`RedisLimiter`], whose quotas, hosts and failure
/// policy it uses. One background task per limiter, stopped when the last clone is dropped.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use sluice::TokenBucket;
/// use sluice_redis::{HybridLimiter, RedisLimiter, RedisOptions};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let strict = RedisLimiter::builder(TokenBucket, "1000/s".parse()?)
///     .unknown_key_quota("1000/s".parse()?)
///     .hosts(3)
///     .connect("redis://127.0.0.1:6379", RedisOptions::default())
///     .await?;
/// let limiter = HybridLimiter::new(strict, Duration::from_millis(100));
/// let decision = limiter.check_n("client-42", 1).await?;
/// # Ok(()) }
/// ```
pub struct HybridLimiter<A: RedisAlgorithm, S = StaticQuotas<String>> {
    inner: Arc<Inner<A, S>>,
}

impl<A: RedisAlgorithm, S> Clone for HybridLimiter<A, S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<A: RedisAlgorithm, S> std::fmt::Debug for HybridLimiter<A, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridLimiter")
            .field("interval", &self.inner.interval)
            .finish_non_exhaustive()
    }
}

struct Inner<A: RedisAlgorithm, S> {
    strict: RedisLimiter<A, S>,
    interval: Duration,
    entries: RwLock<HashMap<String, Arc<Entry>>>,
    /// Monotonic ns of the next sync.
    next_sync: AtomicU64,
    counters: HybridCounts,
}

impl<A: RedisAlgorithm, S: QuotaSource<String>> HybridLimiter<A, S> {
    /// Starts hybrid mode over `strict`, syncing every `interval` (at least 1 ms). The sync
    /// task runs on the runtime the store was connected on.
    pub fn new(strict: RedisLimiter<A, S>, interval: Duration) -> Self {
        let interval = interval.max(Duration::from_millis(1));
        let inner = Arc::new(Inner {
            strict,
            interval,
            entries: RwLock::new(HashMap::new()),
            next_sync: AtomicU64::new(MonotonicClock.now().saturating_add(saturating_nanos(interval))),
            counters: HybridCounts::default(),
        });
        let weak: Weak<Inner<A, S>> = Arc::downgrade(&inner);
        let runtime = inner.strict.store().runtime().clone();
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                inner.sync().await;
            }
        });
        Self { inner }
    }

    /// Checks `cost` units for `key`: from the local allowance when the key is held, else
    /// (its first check, a cost above one interval's allowance, or the allowance spent while
    /// Redis reported room) strictly through Redis. A local decision's `remaining` is what is
    /// left of this host's allowance, its `reset_after` as of the last sync, and a local
    /// denial's `retry_after` the time until the next sync.
    ///
    /// # Errors
    /// As [`RedisLimiter::check_n`].
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let inner = &*self.inner;
        let entry = read(&inner.entries).get(key).cloned();
        let Some(entry) = entry else {
            return self.check_strict(key, cost, None).await;
        };
        let capacity = entry.capacity.load(Ordering::Relaxed);
        entry.touched.store(true, Ordering::Relaxed);
        if cost <= capacity && cost <= entry.max_allowance.load(Ordering::Relaxed) {
            let reset = entry.reset_ns.load(Ordering::Relaxed);
            match entry.take(cost) {
                Ok(left) => {
                    inner.counters.local_allowed.fetch_add(1, Ordering::Relaxed);
                    return Ok(Decision::allowed(capacity, left - cost, reset));
                }
                // Spent here, and Redis had nothing more either at the last contact: deny
                // until the next sync brings news. (Redis down: the failure policy answers.)
                Err(left)
                    if entry.global.load(Ordering::Relaxed) < cost && !inner.strict.store().is_degraded() =>
                {
                    inner.counters.local_denied.fetch_add(1, Ordering::Relaxed);
                    let next_sync = inner.next_sync.load(Ordering::Relaxed);
                    let until_sync = next_sync.saturating_sub(MonotonicClock.now());
                    return Ok(Decision::denied(capacity, left, reset, until_sync));
                }
                Err(_) => {}
            }
        }
        // This interval's allowance is spent but Redis has room (or the cost is above one
        // interval's allowance): decide exactly on Redis.
        self.check_strict(key, cost, Some(&entry)).await
    }

    async fn check_strict(&self, key: &str, cost: u64, entry: Option<&Entry>) -> Result<Decision, Error> {
        let inner = &*self.inner;
        let (quota, plan) = match inner.strict.prepare(key, cost) {
            Prepared::Done(result) => return result,
            Prepared::Plan(quota, plan) => (quota, plan),
        };
        inner.counters.strict_checks.fetch_add(1, Ordering::Relaxed);
        match inner
            .strict
            .run(key, &plan, cost, Consume::IfAdmitted, ScriptTime::Redis)
            .await
        {
            Ok(decision) => {
                match entry {
                    Some(entry) => entry.global.store(decision.remaining(), Ordering::Relaxed),
                    None => {
                        let max_allowance = inner.per_interval(&quota);
                        let fresh = Entry::new(&quota, max_allowance, decision);
                        let mut entries = write(&inner.entries);
                        entries.entry(key.to_string()).or_insert_with(|| Arc::new(fresh));
                    }
                }
                Ok(decision)
            }
            Err(error) => inner.strict.by_policy(key, &quota, cost, &error),
        }
    }

    /// Counts of local and strict checks and of syncs.
    pub fn metrics(&self) -> HybridMetrics {
        let c = &self.inner.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HybridMetrics {
            keys: read(&self.inner.entries).len() as u64,
            local_allowed: load(&c.local_allowed),
            local_denied: load(&c.local_denied),
            strict_checks: load(&c.strict_checks),
            syncs: load(&c.syncs),
            sync_failures: load(&c.sync_failures),
        }
    }

    /// The strict limiter underneath (its metrics include the store's).
    pub fn strict(&self) -> &RedisLimiter<A, S> {
        &self.inner.strict
    }

    /// Runs one sync round now (the background task runs one every interval).
    pub async fn sync_now(&self) {
        self.inner.sync().await;
    }
}

impl<A: RedisAlgorithm, S: QuotaSource<String>> Inner<A, S> {
    /// The most one host admits locally between two syncs: what the quota refills in one
    /// interval, rounded up (at least 1).
    fn per_interval(&self, quota: &Quota) -> u64 {
        let units = (u128::from(saturating_nanos(self.interval)) * u128::from(quota.count()))
            .div_ceil(u128::from(quota.period_nanos().max(1)));
        u64::try_from(units).unwrap_or(u64::MAX).max(1)
    }

    async fn sync(self: &Arc<Self>) {
        self.next_sync.store(
            MonotonicClock
                .now()
                .saturating_add(saturating_nanos(self.interval)),
            Ordering::Relaxed,
        );
        self.counters.syncs.fetch_add(1, Ordering::Relaxed);
        // Keys untouched for a whole interval are dropped (their next check goes to Redis);
        // what they admitted meanwhile is still pushed below.
        let mut round: Vec<(String, Arc<Entry>, bool)> = Vec::new();
        {
            let mut entries = write(&self.entries);
            entries.retain(|key, entry| {
                let keep = entry.touched.swap(false, Ordering::Relaxed);
                round.push((key.clone(), Arc::clone(entry), keep));
                keep
            });
        }
        let mut pushes = tokio::task::JoinSet::new();
        for (key, entry, kept) in round {
            let used = entry.drain();
            if used == 0 && !kept {
                continue;
            }
            let this = Arc::clone(self);
            pushes.spawn(async move { this.push(&key, &entry, used).await });
        }
        while pushes.join_next().await.is_some() {}
    }

    /// Pushes `used` units of `key` (forced: admitted already) and sets the next allowance.
    async fn push(&self, key: &str, entry: &Entry, used: u64) {
        let quota = self.strict.quota_of(key);
        let plan = match self.strict.plan(&quota) {
            Ok(plan) if !quota.is_deny_all() => plan,
            _ => {
                entry.refill(0);
                return;
            }
        };
        match self
            .strict
            .run(key, &plan, used, Consume::Regardless, ScriptTime::Redis)
            .await
        {
            Ok(decision) => {
                let max_allowance = self.per_interval(&quota);
                let remaining = decision.remaining();
                entry.capacity.store(quota.capacity(), Ordering::Relaxed);
                entry.max_allowance.store(max_allowance, Ordering::Relaxed);
                entry.global.store(remaining, Ordering::Relaxed);
                entry
                    .reset_ns
                    .store(decision.reset_after_nanos(), Ordering::Relaxed);
                entry.refill(remaining.min(max_allowance));
            }
            Err(error) => {
                self.counters.sync_failures.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(key, %error, "hybrid push failed; the count is kept for the next sync");
                entry.restore(used);
            }
        }
    }
}
