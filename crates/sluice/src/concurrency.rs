//! The concurrency limiter: permits held until released.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A counting semaphore without waiting: at most `capacity` permits are out at once, and a
/// permit comes back when its guard drops.
///
/// Unlike the rate algorithms it has no notion of time: it limits how many requests run at
/// once, not how many start per second.
///
/// # Example
/// ```
/// use sluice::ConcurrencyLimiter;
/// let limiter = ConcurrencyLimiter::new(2);
/// let a = limiter.try_acquire(2).expect("2 permits are free");
/// assert!(limiter.try_acquire(1).is_err());
/// drop(a);
/// assert_eq!(limiter.available(), 2);
/// ```
#[derive(Debug)]
pub struct ConcurrencyLimiter {
    capacity: u64,
    in_use: AtomicU64,
}

/// Why permits were not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// Fewer permits are free than asked for; try again after some are released.
    #[error("{requested} permits asked, {available} of {capacity} free")]
    Exhausted {
        /// Permits asked for.
        requested: u64,
        /// Permits free at the time.
        available: u64,
        /// All permits.
        capacity: u64,
    },
    /// More permits asked for than exist: can never be granted.
    #[error("{requested} permits asked, but the limiter has only {capacity}")]
    ExceedsCapacity {
        /// Permits asked for.
        requested: u64,
        /// All permits.
        capacity: u64,
    },
}

impl ConcurrencyLimiter {
    /// A limiter with `capacity` permits.
    pub const fn new(capacity: u64) -> Self {
        Self {
            capacity,
            in_use: AtomicU64::new(0),
        }
    }

    /// All permits.
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Permits not held right now.
    pub fn available(&self) -> u64 {
        self.capacity - self.in_use.load(Ordering::Acquire)
    }

    /// Takes `n` permits, all or none; they come back when the returned guard drops.
    /// Taking 0 always succeeds and holds nothing.
    ///
    /// # Errors
    /// [`AcquireError::Exhausted`] if fewer than `n` are free, [`AcquireError::ExceedsCapacity`]
    /// if `n` exceeds the capacity.
    pub fn try_acquire(&self, n: u64) -> Result<Permit<'_>, AcquireError> {
        self.take(n)?;
        Ok(Permit {
            limiter: self,
            permits: n,
        })
    }

    /// Like [`Self::try_acquire`], with a guard that owns a reference to the limiter, for
    /// holding permits across tasks or threads.
    ///
    /// # Example
    /// ```
    /// use std::sync::Arc;
    /// let limiter = Arc::new(sluice::ConcurrencyLimiter::new(1));
    /// let permit = limiter.try_acquire_owned(1)?;
    /// std::thread::spawn(move || drop(permit)).join().unwrap();
    /// assert_eq!(limiter.available(), 1);
    /// # Ok::<(), sluice::AcquireError>(())
    /// ```
    pub fn try_acquire_owned(self: &Arc<Self>, n: u64) -> Result<OwnedPermit, AcquireError> {
        self.take(n)?;
        Ok(OwnedPermit {
            limiter: Arc::clone(self),
            permits: n,
        })
    }

    pub(crate) fn take(&self, n: u64) -> Result<(), AcquireError> {
        if n > self.capacity {
            return Err(AcquireError::ExceedsCapacity {
                requested: n,
                capacity: self.capacity,
            });
        }
        self.in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + n <= self.capacity).then_some(used + n)
            })
            .map(drop)
            .map_err(|used| AcquireError::Exhausted {
                requested: n,
                available: self.capacity - used,
                capacity: self.capacity,
            })
    }

    pub(crate) fn release(&self, n: u64) {
        self.in_use.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Permits held from a [`ConcurrencyLimiter`]; released on drop.
#[derive(Debug)]
#[must_use = "the permits are released as soon as the guard is dropped"]
pub struct Permit<'a> {
    limiter: &'a ConcurrencyLimiter,
    permits: u64,
}

impl Permit<'_> {
    /// How many permits this guard holds.
    pub const fn permits(&self) -> u64 {
        self.permits
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limiter.release(self.permits);
    }
}

/// Permits held from a shared [`ConcurrencyLimiter`]; released on drop.
#[derive(Debug)]
#[must_use = "the permits are released as soon as the guard is dropped"]
pub struct OwnedPermit {
    limiter: Arc<ConcurrencyLimiter>,
    permits: u64,
}

impl OwnedPermit {
    /// How many permits this guard holds.
    pub const fn permits(&self) -> u64 {
        self.permits
    }
}

impl Drop for OwnedPermit {
    fn drop(&mut self) {
        self.limiter.release(self.permits);
    }
}
