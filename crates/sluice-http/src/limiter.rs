//! The seam between the middleware and a keyed limit store.

use sluice::{Algorithm, CheckError, Clock, Decision, KeyedLimiter, Quota, QuotaSource};

/// A store of limits by key, as the middleware uses it. Implemented for sluice's
/// [`KeyedLimiter`] with `String` keys; implement it to put another store behind the layer.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
/// use sluice_http::KeyLimiter;
/// let quotas = StaticQuotas::from_iter([("alice".to_string(), "1/s".parse()?)]);
/// let limiter = KeyedLimiter::builder(TokenBucket, "10/s".parse()?).source(quotas).build()?;
/// assert!(KeyLimiter::check(&limiter, "alice", 1)?.is_allowed());
/// assert_eq!(KeyLimiter::quota(&limiter, "alice"), Some("1/s".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait KeyLimiter: Send + Sync + 'static {
    /// Checks `cost` units for `key`, consuming them if allowed.
    ///
    /// # Errors
    /// [`CheckError`] when the cost can never be admitted under the key's quota.
    fn check(&self, key: &str, cost: u64) -> Result<Decision, CheckError>;

    /// The quota `key` is governed by now, if known (used for the `RateLimit-Policy` field).
    fn quota(&self, key: &str) -> Option<Quota>;
}

impl<A, S, C> KeyLimiter for KeyedLimiter<String, A, S, C>
where
    A: Algorithm,
    S: QuotaSource<String>,
    C: Clock + 'static,
{
    #[inline]
    fn check(&self, key: &str, cost: u64) -> Result<Decision, CheckError> {
        self.check_n(key, cost)
    }

    fn quota(&self, key: &str) -> Option<Quota> {
        self.quota_of(key)
    }
}
