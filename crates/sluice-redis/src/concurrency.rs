//! The concurrency limit shared through Redis: permits as leases that expire if their holder
//! dies, so a crashed process does not hold permits forever.

use std::sync::Arc;
use std::time::Duration;

use sluice::{AcquireError, ConcurrencyLimiter, OwnedPermit};

use crate::script::CONCURRENCY;
use crate::{Error, FailurePolicy, RedisStore};
use sluice::saturating_nanos;

/// At most `capacity` permits held at once across every process sharing the Redis and the
/// name. Each acquisition is a lease of `lease` length: released when the [`RedisPermit`] is
/// released or dropped, and expired by Redis if its holder dies without releasing (renew
/// long-held permits with [`RedisPermit::renew`]).
///
/// When Redis does not answer, the failure policy applies: fail open (a permit that holds
/// nothing), fail closed ([`Error::Unavailable`]), or the host's share of the capacity from a
/// core [`ConcurrencyLimiter`].
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use sluice_redis::{RedisConcurrencyLimiter, RedisStore};
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let store = RedisStore::connect("redis://127.0.0.1:6379", Default::default()).await?;
/// let exports = RedisConcurrencyLimiter::new(store, "exports", 4, Duration::from_secs(30));
/// let permit = exports.acquire(1).await?;
/// // ... run the export ...
/// permit.release().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisConcurrencyLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisConcurrencyLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConcurrencyLimiter")
            .field("keys", &self.inner.keys)
            .field("capacity", &self.inner.capacity)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

struct Inner {
    store: RedisStore,
    keys: [String; 2],
    capacity: u64,
    lease: Duration,
    policy: FailurePolicy,
    local: Arc<ConcurrencyLimiter>,
}

impl RedisConcurrencyLimiter {
    /// A limit of `capacity` permits named `name` (Redis keys `{sluice:name}:cz` and `:ch`),
    /// each held as a lease of `lease`; failure policy [`FailurePolicy::LocalShare`] with one host.
    pub fn new(store: RedisStore, name: &str, capacity: u64, lease: Duration) -> Self {
        let tag = format!("{{sluice:{name}}}");
        Self {
            inner: Arc::new(Inner {
                store,
                keys: [format!("{tag}:cz"), format!("{tag}:ch")],
                capacity,
                lease: lease.max(Duration::from_millis(1)),
                policy: FailurePolicy::LocalShare,
                local: Arc::new(ConcurrencyLimiter::new(capacity)),
            }),
        }
    }

    /// The same limit with another failure policy; `hosts` sets the local share
    /// (`capacity / hosts`, at least 1).
    ///
    /// # Example
    /// ```no_run
    /// # fn demo(limiter: sluice_redis::RedisConcurrencyLimiter) {
    /// let limiter = limiter.with_policy(sluice_redis::FailurePolicy::FailClosed, 3);
    /// # }
    /// ```
    pub fn with_policy(self, policy: FailurePolicy, hosts: u64) -> Self {
        let inner = &self.inner;
        let share = (inner.capacity / hosts.max(1)).max(1).min(inner.capacity);
        Self {
            inner: Arc::new(Inner {
                store: inner.store.clone(),
                keys: inner.keys.clone(),
                capacity: inner.capacity,
                lease: inner.lease,
                policy,
                local: Arc::new(ConcurrencyLimiter::new(share)),
            }),
        }
    }

    /// The most permits held at once.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Takes `permits` if that many are free, without waiting.
    ///
    /// # Errors
    /// [`Error::Acquire`] with [`AcquireError::Exhausted`] when too few are free, or
    /// [`AcquireError::ExceedsCapacity`] when more than the capacity is asked;
    /// [`Error::Unavailable`] when Redis does not answer and the policy is to fail closed.
    pub async fn acquire(&self, permits: u64) -> Result<RedisPermit, Error> {
        let inner = &self.inner;
        if permits > inner.capacity {
            return Err(AcquireError::ExceedsCapacity {
                requested: permits,
                capacity: inner.capacity,
            }
            .into());
        }
        let lease = i64::try_from(saturating_nanos(inner.lease) / 1000).unwrap_or(i64::MAX);
        let args = [
            "acquire".to_string(),
            "-1".to_string(),
            permits.to_string(),
            inner.capacity.to_string(),
            lease.to_string(),
        ];
        match self.call(&args).await {
            Ok([1, id, _]) => Ok(self.permit(permits, Held::Lease(id))),
            Ok([_, _, available]) => Err(AcquireError::Exhausted {
                requested: permits,
                available: u64::try_from(available).unwrap_or(0),
                capacity: inner.capacity,
            }
            .into()),
            Err(()) => match inner.policy {
                FailurePolicy::FailOpen => Ok(self.permit(permits, Held::Nothing)),
                FailurePolicy::FailClosed => Err(Error::Unavailable(inner.store.options().timeout)),
                FailurePolicy::LocalShare => {
                    let local = inner.local.try_acquire_owned(permits)?;
                    Ok(self.permit(permits, Held::Local { _permit: local }))
                }
            },
        }
    }

    fn permit(&self, permits: u64, held: Held) -> RedisPermit {
        RedisPermit {
            limiter: self.clone(),
            permits,
            held,
        }
    }

    async fn call(&self, args: &[String]) -> Result<[i64; 3], ()> {
        let reply = self.inner.store.eval(&CONCURRENCY, &self.inner.keys, args).await;
        match reply.as_deref() {
            Ok(&[a, b, c]) => Ok([a, b, c]),
            Ok(other) => {
                tracing::warn!(reply = ?other, "unexpected reply from the concurrency script");
                Err(())
            }
            Err(_) => Err(()),
        }
    }
}

enum Held {
    Lease(i64),
    /// Held by the local share; released when dropped.
    Local {
        _permit: OwnedPermit,
    },
    /// Admitted by fail-open: nothing to give back.
    Nothing,
    Released,
}

/// Permits held on a [`RedisConcurrencyLimiter`]. Dropping it releases them (in a task on the
/// current tokio runtime); [`RedisPermit::release`] releases them and waits for Redis.
///
/// # Example
/// ```no_run
/// # async fn demo(limiter: sluice_redis::RedisConcurrencyLimiter) -> Result<(), sluice_redis::Error> {
/// let permit = limiter.acquire(2).await?;
/// assert_eq!(permit.permits(), 2);
/// assert!(permit.renew().await); // still held, for another lease
/// drop(permit);
/// # Ok(()) }
/// ```
#[must_use = "the permits are released as soon as the permit is dropped"]
pub struct RedisPermit {
    limiter: RedisConcurrencyLimiter,
    permits: u64,
    held: Held,
}

impl std::fmt::Debug for RedisPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPermit")
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

impl RedisPermit {
    /// How many permits this holds.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// Whether the permits are held by Redis (not by the local share or fail-open).
    pub fn is_shared(&self) -> bool {
        matches!(self.held, Held::Lease(_))
    }

    /// Extends the lease by another full lease length; false if it had already expired (the
    /// permits may have been given to someone else) or Redis did not answer.
    pub async fn renew(&self) -> bool {
        let Held::Lease(id) = self.held else {
            return !matches!(self.held, Held::Released);
        };
        let inner = &self.limiter.inner;
        let lease = saturating_nanos(inner.lease) / 1000;
        let args = [
            "renew".to_string(),
            "-1".to_string(),
            id.to_string(),
            lease.to_string(),
        ];
        matches!(self.limiter.call(&args).await, Ok([1, _, _]))
    }

    /// Gives the permits back now. If Redis does not answer, the lease expires on its own.
    pub async fn release(mut self) {
        if let Held::Lease(id) = std::mem::replace(&mut self.held, Held::Released) {
            let _ = self.limiter.call(&release_args(id)).await;
        }
    }
}

fn release_args(id: i64) -> [String; 3] {
    ["release".to_string(), "-1".to_string(), id.to_string()]
}

impl Drop for RedisPermit {
    fn drop(&mut self) {
        if let Held::Lease(id) = std::mem::replace(&mut self.held, Held::Released) {
            // Without a runtime the lease simply expires.
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                let limiter = self.limiter.clone();
                handle.spawn(async move {
                    let _ = limiter.call(&release_args(id)).await;
                });
            }
        }
    }
}
