//! Errors of the Redis backend: [`SetupError`] when a store or limiter is built, [`Error`]
//! when a check cannot be decided at all.

use std::time::Duration;

use sluice::Quota;

/// A quota the Redis scripts cannot evaluate exactly with Redis' numbers (doubles, exact below
/// 2^53): refused when a limiter is built, or when a key's fetched quota is first checked.
///
/// ```
/// let quota: sluice::Quota = "100000/day".parse()?;
/// let refused = sluice_redis::check_quota(sluice::AlgorithmKind::FixedWindow, &quota).unwrap_err();
/// assert!(matches!(refused, sluice_redis::SetupError::QuotaTooLarge(_)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("quota {quota} is too large for the Redis backend: {reason}")]
pub struct QuotaTooLarge {
    /// The quota.
    pub quota: Quota,
    /// Which bound it exceeds.
    pub reason: &'static str,
}

/// Why a Redis store or limiter could not be built.
///
/// # Example
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err = sluice_redis::RedisStore::connect("not a url", Default::default()).await.unwrap_err();
/// assert!(matches!(err, sluice_redis::SetupError::BadUrl { .. }));
/// assert!(err.to_string().contains("invalid Redis URL"));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The URL cannot be parsed as a Redis URL.
    #[error("invalid Redis URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What the client library said.
        reason: String,
    },
    /// Redis did not answer at start-up.
    #[error("cannot reach Redis at {url}: {reason}")]
    Connect {
        /// The URL given.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The algorithm has no Redis script.
    #[error(transparent)]
    Unsupported(#[from] crate::UnsupportedAlgorithm),
    /// A quota derived for the local share is invalid.
    #[error("invalid quota: {0}")]
    Quota(#[from] sluice::QuotaError),
    /// The in-memory store of quotas (or the local share's) refused a setting.
    #[error(transparent)]
    Keyed(#[from] sluice::KeyedBuildError),
    /// A failsafe or unknown-key quota the scripts cannot hold.
    #[error(transparent)]
    QuotaTooLarge(#[from] QuotaTooLarge),
}

/// Why a check could not be decided at all.
///
/// An unreachable or failing Redis during checks is not an error: it is answered by the
/// limiter's [`crate::FailurePolicy`]. Errors are for what no policy can answer: a cost the
/// quota can never admit, a key's quota Redis' number type cannot hold exactly, and for
/// concurrency limits the permits that cannot be given.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cost can never be admitted under the key's quota.
    #[error(transparent)]
    Check(#[from] sluice::CheckError),
    /// The key's quota (as its source gave it) cannot be evaluated exactly on Redis.
    #[error(transparent)]
    QuotaTooLarge(#[from] QuotaTooLarge),
    /// Permits asked of a concurrency limit that it cannot give now (or ever).
    #[error(transparent)]
    Acquire(#[from] sluice::AcquireError),
    /// A charge ([`crate::RedisLimiter::charge_n`]) under an algorithm whose script takes
    /// none: on Redis only the token bucket takes debt.
    #[error("the {script} script takes no charge on Redis; token_bucket does")]
    ChargeUnsupported {
        /// The script's name.
        script: &'static str,
    },
    /// Redis did not take a charge (unreachable, slow or failing): nothing was counted, and no
    /// failure policy can count it.
    #[error("the charge was not counted: {0}")]
    NotCharged(String),
    /// Redis is unreachable and the failure policy is to fail closed (concurrency limits only;
    /// rate checks answer with a denial instead).
    #[error("Redis is unavailable (no answer within {0:?}) and the policy is to fail closed")]
    Unavailable(Duration),
}
