//! Waiting on a concurrency limiter: permits come back when guards drop, and wake the head.

use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use super::queue::{CountedQueue, Queue, Take};
use super::{Host, WaitError, WaitPolicy, acquire_blocking};
use crate::{AcquireError, ConcurrencyLimiter};

/// A [`ConcurrencyLimiter`] whose callers can wait for permits, in a queue, by a
/// [`WaitPolicy`]. Cloning shares it.
///
/// The head of the queue is woken when permits come back (a [`QueuedPermit`] drops); no
/// timer is involved.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::{WaitPolicy, WaitingConcurrency};
/// let limiter = WaitingConcurrency::new(2, WaitPolicy::wait_up_to(Duration::from_secs(5)));
/// let held = limiter.acquire_blocking(2)?;
/// let other = limiter.clone();
/// let waiter = std::thread::spawn(move || other.acquire_blocking(1).map(|p| p.permits()));
/// drop(held); // wakes the waiter
/// assert_eq!(waiter.join().unwrap()?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct WaitingConcurrency {
    shared: Arc<PermitQueue>,
}

/// The permits, the policy and the queue of waiters, shared by the clones of a waiting limiter.
struct PermitQueue {
    limiter: ConcurrencyLimiter,
    policy: WaitPolicy,
    queue: CountedQueue,
}

impl std::fmt::Debug for PermitQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitingConcurrency")
            .field("limiter", &self.limiter)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Permits granted by a [`WaitingConcurrency`]; released on drop, waking the next waiter.
///
/// # Example
/// ```
/// use sluice::{WaitPolicy, WaitingConcurrency};
/// let limiter = WaitingConcurrency::new(3, WaitPolicy::reject());
/// let permit = limiter.acquire_blocking(2)?;
/// assert_eq!((permit.permits(), limiter.available()), (2, 1));
/// drop(permit);
/// assert_eq!(limiter.available(), 3);
/// # Ok::<(), sluice::WaitError>(())
/// ```
#[derive(Debug)]
#[must_use = "the permits are released as soon as the guard is dropped"]
pub struct QueuedPermit {
    permits: u64,
    shared: Arc<PermitQueue>,
}

impl QueuedPermit {
    /// How many permits this guard holds.
    ///
    /// # Example
    /// ```
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(4, WaitPolicy::wait());
    /// assert_eq!(limiter.acquire_blocking(3)?.permits(), 3);
    /// # Ok::<(), sluice::WaitError>(())
    /// ```
    pub fn permits(&self) -> u64 {
        self.permits
    }
}

impl Drop for QueuedPermit {
    fn drop(&mut self) {
        self.shared.limiter.release(self.permits);
        // Pairs with the fence in `take`: either the head sees these permits, or this sees
        // the head waiting and wakes it.
        fence(Ordering::SeqCst);
        if !self.shared.no_waiters() {
            let order = self.shared.policy.queue_order();
            self.shared.with_queue(|queue| queue.wake_head(order));
        }
    }
}

impl WaitingConcurrency {
    /// A limiter of `capacity` permits; requests without permits are treated by `policy`.
    ///
    /// # Example
    /// ```
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(8, WaitPolicy::wait().with_queue_limit(100));
    /// assert_eq!(limiter.capacity(), 8);
    /// ```
    pub fn new(capacity: u64, policy: WaitPolicy) -> Self {
        Self {
            shared: Arc::new(PermitQueue {
                limiter: ConcurrencyLimiter::new(capacity),
                policy,
                queue: CountedQueue::default(),
            }),
        }
    }

    /// All permits.
    ///
    /// # Example
    /// ```
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// assert_eq!(WaitingConcurrency::new(8, WaitPolicy::wait()).capacity(), 8);
    /// ```
    pub fn capacity(&self) -> u64 {
        self.shared.limiter.capacity()
    }

    /// Permits not held right now.
    ///
    /// # Example
    /// ```
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(8, WaitPolicy::wait());
    /// let _held = limiter.acquire_blocking(5)?;
    /// assert_eq!(limiter.available(), 3);
    /// # Ok::<(), sluice::WaitError>(())
    /// ```
    pub fn available(&self) -> u64 {
        self.shared.limiter.available()
    }

    /// Requests waiting now.
    ///
    /// # Example
    /// ```
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// assert_eq!(WaitingConcurrency::new(8, WaitPolicy::wait()).waiters(), 0);
    /// ```
    pub fn waiters(&self) -> usize {
        self.shared.queue.waiters()
    }

    fn wrap(&self, permits: u64) -> QueuedPermit {
        QueuedPermit {
            permits,
            shared: Arc::clone(&self.shared),
        }
    }

    /// Acquires `permits`, waiting as the policy allows; cancel by dropping the future.
    ///
    /// # Errors
    /// [`WaitError`]: queue full, timed out, evicted (newest-first) or more than the capacity.
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), sluice::WaitError> {
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(1, WaitPolicy::wait());
    /// let first = limiter.acquire(1).await?;
    /// let other = limiter.clone();
    /// let second = tokio::spawn(async move { other.acquire(1).await.map(|p| p.permits()) });
    /// drop(first);
    /// assert_eq!(second.await.unwrap()?, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "wait")]
    pub async fn acquire(&self, permits: u64) -> Result<QueuedPermit, WaitError> {
        let permit = super::future::acquire(&*self.shared, permits, self.shared.policy.timeout()).await?;
        Ok(self.wrap(permit))
    }

    /// Acquires `permits`, waiting at most `timeout` (instead of the policy's).
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use sluice::{WaitError, WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(1, WaitPolicy::wait());
    /// let _held = limiter.acquire(1).await?;
    /// let late = limiter.acquire_within(1, Duration::from_millis(5)).await;
    /// assert!(matches!(late, Err(WaitError::TimedOut { .. })));
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "wait")]
    pub async fn acquire_within(&self, permits: u64, timeout: Duration) -> Result<QueuedPermit, WaitError> {
        let permit = super::future::acquire(&*self.shared, permits, Some(timeout)).await?;
        Ok(self.wrap(permit))
    }

    /// Acquires `permits`, blocking the thread as the policy allows.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// use sluice::{WaitError, WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(2, WaitPolicy::wait());
    /// assert_eq!(limiter.acquire_blocking(3).unwrap_err(), WaitError::CostExceedsCapacity { cost: 3, capacity: 2 });
    /// ```
    #[inline]
    pub fn acquire_blocking(&self, permits: u64) -> Result<QueuedPermit, WaitError> {
        let permit = acquire_blocking(&*self.shared, permits, self.shared.policy.timeout())?;
        Ok(self.wrap(permit))
    }

    /// Acquires `permits`, blocking the thread at most `timeout`.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::{WaitPolicy, WaitingConcurrency};
    /// let limiter = WaitingConcurrency::new(1, WaitPolicy::wait());
    /// let _held = limiter.acquire_blocking(1)?;
    /// assert!(limiter.acquire_blocking_within(1, Duration::from_millis(5)).is_err());
    /// # Ok::<(), sluice::WaitError>(())
    /// ```
    pub fn acquire_blocking_within(
        &self,
        permits: u64,
        timeout: Duration,
    ) -> Result<QueuedPermit, WaitError> {
        let permit = acquire_blocking(&*self.shared, permits, Some(timeout))?;
        Ok(self.wrap(permit))
    }
}

impl Host for PermitQueue {
    /// The permits taken; the caller wraps them in a guard.
    type Grant = u64;

    fn policy(&self) -> &WaitPolicy {
        &self.policy
    }

    #[inline]
    fn take(&self, permits: u64) -> Take<u64> {
        // Pairs with the fence in `QueuedPermit::drop` (see there).
        fence(Ordering::SeqCst);
        match self.limiter.take(permits) {
            Ok(()) => Take::Granted(permits),
            Err(AcquireError::Exhausted { .. }) => Take::Retry(None),
            Err(AcquireError::ExceedsCapacity { capacity, .. }) => Take::Never { capacity },
        }
    }

    fn capacity(&self) -> Option<u64> {
        Some(self.limiter.capacity())
    }

    #[inline]
    fn no_waiters(&self) -> bool {
        self.queue.no_waiters()
    }

    fn with_queue<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        self.queue.with(f)
    }
}
