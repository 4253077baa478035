//! Waiting on a keyed limiter: one queue per key, existing only while the key has waiters.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sync::lock;
use std::time::Duration;

use super::direct::take_decision;
use super::queue::{Queue, Take};
use super::{Host, WaitError, WaitPolicy, acquire_blocking};
use crate::{Algorithm, Clock, Decision, KeyedLimiter, MonotonicClock, QuotaSource, StaticQuotas};

/// Shards of the queue map: waiting is the slow path, a few locks spread it enough.
const SHARDS: usize = 64;

/// A [`KeyedLimiter`] whose callers can wait for their key's capacity, in a queue per key,
/// by a [`WaitPolicy`] (the queue limit applies to each key's queue).
///
/// While no key has waiters an acquire is one check of the keyed limiter and an atomic load.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "50/s".parse()?)
///     .unknown_key_quota("50/s burst 1".parse()?)
///     .build()?;
/// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait_up_to(Duration::from_secs(5)));
/// waiting.acquire_blocking("alice", 1)?;
/// waiting.acquire_blocking("bob", 1)?;   // another key: at once
/// waiting.acquire_blocking("alice", 1)?; // about 20 ms later
/// assert_eq!(waiting.queued_keys(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WaitingKeyed<K, A: Algorithm, S = StaticQuotas<K>, C = MonotonicClock> {
    limiter: KeyedLimiter<K, A, S, C>,
    policy: WaitPolicy,
    queues: Box<[Mutex<HashMap<K, Queue>>]>,
    hasher: RandomState,
    /// Waiters over all keys.
    waiters: AtomicUsize,
}

impl<K, A: Algorithm, S, C> std::fmt::Debug for WaitingKeyed<K, A, S, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingKeyed")
            .field("policy", &self.policy)
            .field("waiters", &self.waiters.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

/// One key of a [`WaitingKeyed`], as a queue host.
struct KeyHost<'a, K, A: Algorithm, S, C> {
    waiting: &'a WaitingKeyed<K, A, S, C>,
    key: K,
}

impl<K, A, S, C> WaitingKeyed<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Wraps `limiter`; requests without capacity for their key are treated by `policy`.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("10/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait().with_queue_limit(50));
    /// assert_eq!(waiting.waiters(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(limiter: KeyedLimiter<K, A, S, C>, policy: WaitPolicy) -> Self {
        Self {
            limiter,
            policy,
            queues: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            waiters: AtomicUsize::new(0),
        }
    }

    /// The keyed limiter (checks on it directly do not queue).
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("10/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// waiting.acquire_blocking("a", 4)?;
    /// assert_eq!(waiting.limiter().check_n("a", 0)?.remaining(), 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limiter(&self) -> &KeyedLimiter<K, A, S, C> {
        &self.limiter
    }

    /// Requests waiting now, over all keys.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("10/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// assert_eq!(waiting.waiters(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::SeqCst)
    }

    /// Keys that have a queue now (keys with waiters).
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("10/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// waiting.acquire_blocking("a", 1)?;
    /// assert_eq!(waiting.queued_keys(), 0); // granted at once: no queue was made
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queued_keys(&self) -> usize {
        self.queues.iter().map(|shard| lock(shard).len()).sum()
    }

    fn host<Q>(&self, key: &Q) -> KeyHost<'_, K, A, S, C>
    where
        Q: ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        KeyHost {
            waiting: self,
            key: key.to_owned().into(),
        }
    }

    /// Acquires `cost` for `key`, waiting as the policy allows; cancel by dropping the future.
    ///
    /// # Errors
    /// [`WaitError`]: queue full, timed out, evicted (newest-first) or a cost above the key's
    /// capacity.
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, "100/s".parse()?)
    ///     .unknown_key_quota("100/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// assert!(waiting.acquire(&7, 2).await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "wait")]
    pub async fn acquire<Q>(&self, key: &Q, cost: u64) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if let Some(decision) = self.at_once(key, cost)? {
            return Ok(decision);
        }
        super::future::acquire(&self.host(key), cost, self.policy.timeout()).await
    }

    /// Acquires `cost` for `key`, waiting at most `timeout` (instead of the policy's).
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("10/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// waiting.acquire_within("a", 10, Duration::from_millis(5)).await?;
    /// assert!(waiting.acquire_within("a", 10, Duration::from_millis(5)).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "wait")]
    pub async fn acquire_within<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if let Some(decision) = self.at_once(key, cost)? {
            return Ok(decision);
        }
        super::future::acquire(&self.host(key), cost, Some(timeout)).await
    }

    /// Acquires `cost` for `key`, blocking the thread as the policy allows.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?)
    ///     .unknown_key_quota("10/s".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// assert_eq!(waiting.acquire_blocking("a", 3)?.remaining(), 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking<Q>(&self, key: &Q, cost: u64) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.acquire_blocking_for(key, cost, self.policy.timeout())
    }

    /// Acquires `cost` for `key`, blocking the thread at most `timeout`.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy, WaitingKeyed};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/h".parse()?)
    ///     .unknown_key_quota("1/h".parse()?)
    ///     .build()?;
    /// let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait());
    /// waiting.acquire_blocking("k", 1)?;
    /// assert!(waiting.acquire_blocking_within("k", 1, Duration::from_millis(5)).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_within<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Duration,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        self.acquire_blocking_for(key, cost, Some(timeout))
    }

    fn acquire_blocking_for<Q>(
        &self,
        key: &Q,
        cost: u64,
        timeout: Option<Duration>,
    ) -> Result<Decision, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if let Some(decision) = self.at_once(key, cost)? {
            return Ok(decision);
        }
        acquire_blocking(&self.host(key), cost, timeout)
    }

    /// The lock-free path: while no key has waiters, one check on the borrowed key decides
    /// unless the key must wait (then the queue path asks again, under its lock).
    fn at_once<Q>(&self, key: &Q, cost: u64) -> Result<Option<Decision>, WaitError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned + ?Sized,
        Q::Owned: Into<K>,
    {
        if self.waiters.load(Ordering::SeqCst) != 0 {
            return Ok(None);
        }
        match take_decision(self.limiter.check_n(key, cost)) {
            Take::Granted(decision) => Ok(Some(decision)),
            Take::Never { capacity } => Err(WaitError::CostExceedsCapacity { cost, capacity }),
            Take::Retry(_) => Ok(None),
        }
    }
}

impl<K, A, S, C> Host for KeyHost<'_, K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    type Grant = Decision;

    fn policy(&self) -> &WaitPolicy {
        &self.waiting.policy
    }

    #[inline]
    fn take(&self, cost: u64) -> Take<Decision> {
        take_decision(self.waiting.limiter.check_n(&self.key, cost))
    }

    fn capacity(&self) -> Option<u64> {
        self.waiting
            .limiter
            .quota_of(&self.key)
            .map(|quota| quota.capacity())
    }

    #[inline]
    fn no_waiters(&self) -> bool {
        // Asked already by `at_once` when no key had waiters; the queue path decides.
        false
    }

    fn with_queue<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        let waiting = self.waiting;
        let shard = (waiting.hasher.hash_one(&self.key) as usize) % SHARDS;
        let mut map = lock(&waiting.queues[shard]);
        let (before, result, after) = match map.get_mut(&self.key) {
            Some(queue) => {
                let before = queue.len();
                let result = f(queue);
                let after = queue.len();
                if after == 0 {
                    map.remove(&self.key);
                }
                (before, result, after)
            }
            None => {
                let mut queue = Queue::default();
                let result = f(&mut queue);
                let after = queue.len();
                if after > 0 {
                    map.insert(self.key.clone(), queue);
                }
                (0, result, after)
            }
        };
        if after > before {
            waiting.waiters.fetch_add(after - before, Ordering::SeqCst);
        } else {
            waiting.waiters.fetch_sub(before - after, Ordering::SeqCst);
        }
        result
    }
}
