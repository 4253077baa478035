//! Errors of the Redis backend.

use std::time::Duration;

use sluice::Quota;

/// Why a Redis limiter could not be built, or a check could not be decided at all.
///
/// An unreachable or failing Redis during checks is not an error: it is answered by the
/// limiter's [`crate::FailurePolicy`]. Errors are for what no policy can answer: a bad URL at
/// start-up, a cost the quota can never admit, a quota Redis' number type cannot hold exactly.
///
/// # Example
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let err = sluice_redis::RedisStore::connect("not a url", Default::default()).await.unwrap_err();
/// assert!(err.to_string().contains("invalid Redis URL"));
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
    /// The cost can never be admitted under the key's quota.
    #[error(transparent)]
    Check(#[from] sluice::CheckError),
    /// The quota cannot be evaluated exactly with Redis' numbers (doubles, exact below 2^53).
    #[error("quota {quota} is too large for the Redis backend: {reason}")]
    QuotaTooLarge {
        /// The quota.
        quota: Quota,
        /// Which bound it exceeds.
        reason: &'static str,
    },
    /// Permits asked of a concurrency limit that it cannot give now (or ever).
    #[error(transparent)]
    Acquire(#[from] sluice::AcquireError),
    /// Redis is unreachable and the failure policy is to fail closed (concurrency limits only;
    /// rate checks answer with a denial instead).
    #[error("Redis is unavailable (no answer within {0:?}) and the policy is to fail closed")]
    Unavailable(Duration),
}
