//! Limits shared through Redis: a [`RedisLimiter`] behind the rate-limit layer.

use sluice::{Decision, Quota, QuotaSource};
use sluice_http::{CheckFuture, LimitBackend};
use sluice_redis::{Error, RedisAlgorithm, RedisLimiter};

/// How long a request denied for a check Redis could not decide is told to wait.
const UNDECIDED_RETRY_NS: u64 = 1_000_000_000;

/// A [`RedisLimiter`] as the layer's [`LimitBackend`]: every check is a round trip to Redis
/// (or the failure policy's answer when Redis does not answer in time).
pub struct RedisBackend<A: RedisAlgorithm, S>(pub RedisLimiter<A, S>);

impl<A, S> LimitBackend for RedisBackend<A, S>
where
    A: RedisAlgorithm,
    S: QuotaSource<String>,
{
    fn check(&self, key: &str, cost: u64) -> CheckFuture {
        let limiter = self.0.clone();
        let key = key.to_owned();
        CheckFuture::pending(async move {
            match limiter.check_n(&key, cost).await {
                Ok(decision) => Ok(decision),
                Err(Error::Check(e)) => Err(e),
                // Not an outage (the failure policy answers those) but a quota the backend
                // cannot evaluate exactly: deny, and say why in the log.
                Err(e) => {
                    tracing::error!(key, "cannot decide on Redis: {e}; denying");
                    Ok(Decision::denied(0, 0, 0, UNDECIDED_RETRY_NS))
                }
            }
        })
    }

    fn quota(&self, key: &str) -> Option<Quota> {
        Some(self.0.quota_of(key))
    }
}
