//! The seam for limits decided elsewhere (a remote store such as Redis).

use std::future::Future;

use crate::{Algorithm, CheckError, Clock, Decision, RateLimiter};

/// Anything that decides checks, possibly asynchronously and possibly remotely, with the same
/// [`Decision`] as the in-process limiters. A remote backend adds its own failures (timeouts,
/// connection loss) through `Error`.
///
/// # Example
/// ```
/// use sluice::{AsyncLimiter, Quota, RateLimiter, TokenBucket};
/// async fn admit<L: AsyncLimiter>(limiter: &L) -> bool {
///     matches!(limiter.check_n(1).await, Ok(d) if d.is_allowed())
/// }
/// let limiter = RateLimiter::new(TokenBucket, "1/s".parse::<Quota>()?)?;
/// let _future = admit(&limiter); // run it on any executor
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncLimiter: Send + Sync {
    /// Why a check could not be decided.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Checks `cost` units, as [`RateLimiter::check_n`] does.
    fn check_n(&self, cost: u64) -> impl Future<Output = Result<Decision, Self::Error>> + Send;
}

impl<A: Algorithm, C: Clock> AsyncLimiter for RateLimiter<A, C> {
    type Error = CheckError;

    fn check_n(&self, cost: u64) -> impl Future<Output = Result<Decision, CheckError>> + Send {
        std::future::ready(RateLimiter::check_n(self, cost))
    }
}
