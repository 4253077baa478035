//! Waiting on a direct limiter.

use std::time::Duration;

use super::queue::{CountedQueue, Queue, Take};
use super::{Host, WaitError, WaitPolicy, acquire_blocking};
use crate::{Algorithm, CheckError, Clock, Decision, MonotonicClock, RateLimiter};

/// A [`RateLimiter`] whose callers can wait for capacity, in a queue, by a [`WaitPolicy`].
///
/// A granted acquire returns the admitting [`Decision`] (for a shaping leaky bucket, its
/// `delay` is still the caller's to wait).
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
/// let limiter = RateLimiter::new(TokenBucket, "20/s burst 1".parse()?)?;
/// let waiting = WaitingLimiter::new(limiter, WaitPolicy::wait_up_to(Duration::from_secs(5)));
/// waiting.acquire_blocking(1)?; // at once
/// waiting.acquire_blocking(1)?; // after about 50 ms
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// With the `wait` feature, [`WaitingLimiter::acquire`] waits asynchronously, on tokio.
pub struct WaitingLimiter<A: Algorithm, C: Clock = MonotonicClock> {
    limiter: RateLimiter<A, C>,
    policy: WaitPolicy,
    queue: CountedQueue,
}

impl<A: Algorithm, C: Clock> std::fmt::Debug for WaitingLimiter<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingLimiter")
            .field("policy", &self.policy)
            .field("waiters", &self.waiters())
            .finish_non_exhaustive()
    }
}

/// The answer of a rate limit, as the queue sees it.
#[inline]
pub(crate) fn take_decision(result: Result<Decision, CheckError>) -> Take<Decision> {
    match result {
        Ok(decision) if decision.is_allowed() => Take::Granted(decision),
        // A quota that denies everything answers with a retry-after of "never".
        Ok(decision) if decision.retry_after_nanos() == u64::MAX => Take::Never { capacity: 0 },
        Ok(decision) => Take::Retry(Some(decision.retry_after_nanos())),
        Err(CheckError::CostExceedsCapacity { capacity, .. }) => Take::Never { capacity },
    }
}

impl<A: Algorithm, C: Clock> WaitingLimiter<A, C> {
    /// Wraps `limiter`; requests without capacity are treated by `policy`.
    ///
    /// # Example
    /// ```
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "5/s".parse()?)?, WaitPolicy::reject());
    /// assert_eq!(waiting.policy(), WaitPolicy::reject());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(limiter: RateLimiter<A, C>, policy: WaitPolicy) -> Self {
        Self {
            limiter,
            policy,
            queue: CountedQueue::default(),
        }
    }

    /// The limiter (checks on it directly do not queue).
    ///
    /// # Example
    /// ```
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "5/s".parse()?)?, WaitPolicy::wait());
    /// assert_eq!(waiting.limiter().check_n(0)?.remaining(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limiter(&self) -> &RateLimiter<A, C> {
        &self.limiter
    }

    /// The policy.
    ///
    /// # Example
    /// ```
    /// use sluice::{QueueOrder, RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let policy = WaitPolicy::wait().with_queue_order(QueueOrder::NewestFirst);
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "5/s".parse()?)?, policy);
    /// assert_eq!(waiting.policy().queue_order(), QueueOrder::NewestFirst);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy(&self) -> WaitPolicy {
        self.policy
    }

    /// Requests waiting now.
    ///
    /// # Example
    /// ```
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "5/s".parse()?)?, WaitPolicy::wait());
    /// assert_eq!(waiting.waiters(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn waiters(&self) -> usize {
        self.queue.waiters()
    }

    /// Permits (summed costs) waiting now.
    ///
    /// # Example
    /// ```
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "5/s".parse()?)?, WaitPolicy::wait());
    /// assert_eq!(waiting.queued(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn queued(&self) -> u64 {
        self.with_queue(|queue| queue.queued())
    }

    /// Acquires `cost`, waiting as the policy allows; cancel by dropping the future.
    ///
    /// # Errors
    /// [`WaitError`]: queue full, timed out, evicted (newest-first) or a cost above capacity.
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let policy = WaitPolicy::wait_up_to(Duration::from_secs(1));
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "100/s burst 1".parse()?)?, policy);
    /// waiting.acquire(1).await?;
    /// waiting.acquire(1).await?; // about 10 ms later
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "wait")]
    pub async fn acquire(&self, cost: u64) -> Result<Decision, WaitError> {
        if let Some(decision) = self.at_once(cost) {
            return Ok(decision);
        }
        super::future::acquire(self, cost, self.policy.timeout).await
    }

    /// Acquires `cost`, waiting at most `timeout` (instead of the policy's).
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use sluice::{RateLimiter, TokenBucket, WaitError, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "1/min".parse()?)?, WaitPolicy::wait());
    /// waiting.acquire(1).await?;
    /// let late = waiting.acquire_within(1, Duration::from_millis(10)).await;
    /// assert!(matches!(late, Err(WaitError::TimedOut { .. }))); // at once: a minute is too long
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "wait")]
    pub async fn acquire_within(&self, cost: u64, timeout: Duration) -> Result<Decision, WaitError> {
        if let Some(decision) = self.at_once(cost) {
            return Ok(decision);
        }
        super::future::acquire(self, cost, Some(timeout)).await
    }

    /// Acquires `cost`, blocking the thread as the policy allows.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "100/s".parse()?)?, WaitPolicy::wait());
    /// assert_eq!(waiting.acquire_blocking(40)?.remaining(), 60);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn acquire_blocking(&self, cost: u64) -> Result<Decision, WaitError> {
        if let Some(decision) = self.at_once(cost) {
            return Ok(decision);
        }
        acquire_blocking(self, cost, self.policy.timeout)
    }

    /// Acquires `cost`, blocking the thread at most `timeout`.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::{RateLimiter, TokenBucket, WaitPolicy, WaitingLimiter};
    /// let waiting = WaitingLimiter::new(RateLimiter::new(TokenBucket, "1/h".parse()?)?, WaitPolicy::wait());
    /// waiting.acquire_blocking(1)?;
    /// assert!(waiting.acquire_blocking_within(1, Duration::from_millis(5)).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_blocking_within(&self, cost: u64, timeout: Duration) -> Result<Decision, WaitError> {
        if let Some(decision) = self.at_once(cost) {
            return Ok(decision);
        }
        acquire_blocking(self, cost, Some(timeout))
    }

    /// The common case, kept to one check: nobody waits and the limit admits. Anything else
    /// goes the queue's way (which asks again: a denial consumed nothing).
    #[inline]
    fn at_once(&self, cost: u64) -> Option<Decision> {
        if !self.no_waiters() {
            return None;
        }
        self.limiter.check_n(cost).ok().filter(Decision::is_allowed)
    }
}

impl<A: Algorithm, C: Clock> Host for WaitingLimiter<A, C> {
    type Grant = Decision;

    fn policy(&self) -> &WaitPolicy {
        &self.policy
    }

    #[inline]
    fn take(&self, cost: u64) -> Take<Decision> {
        take_decision(self.limiter.check_n(cost))
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.limiter.quota().capacity())
    }

    #[inline]
    fn no_waiters(&self) -> bool {
        self.queue.no_waiters()
    }

    fn with_queue<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        self.queue.with(f)
    }
}
