//! Where each key's quota comes from.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::future::{Future, Ready, ready};
use std::hash::Hash;

use crate::Quota;

/// A failed quota fetch. The keyed limiter keeps the last known quota and reports this to its
/// error hook; it never fails a check because of it.
///
/// # Example
/// ```
/// let e = sluice::FetchError::new("accounts service timed out");
/// assert_eq!(e.to_string(), "accounts service timed out");
/// ```
#[derive(Debug)]
pub struct FetchError(Box<dyn std::error::Error + Send + Sync>);

impl FetchError {
    /// Wraps any error (or message).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self(error.into())
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for FetchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// What a fetch yields: the key's quota, `None` for a key the source does not know (it gets
/// the unknown-key quota), or an error (the key keeps its last known quota).
pub type FetchResult = Result<Option<Quota>, FetchError>;

/// A source of per-key quotas, asked in the background.
///
/// The future is polled once where the key is first seen; if it is ready then (an in-memory
/// map) the quota applies at once, otherwise it runs on the limiter's spawner while the key
/// is governed by the failsafe quota.
///
/// # Example
/// ```
/// use sluice::{FetchResult, Quota, QuotaSource};
/// struct Everyone;
/// impl QuotaSource<String> for Everyone {
///     fn fetch(&self, _key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
///         std::future::ready(Ok(Some(Quota::per_second(std::num::NonZeroU64::MIN))))
///     }
/// }
/// ```
pub trait QuotaSource<K>: Send + Sync + 'static {
    /// Fetches the quota of `key`.
    fn fetch(&self, key: &K) -> impl Future<Output = FetchResult> + Send + 'static;
}

/// A fixed map from key to quota.
///
/// # Example
/// ```
/// use sluice::StaticQuotas;
/// let quotas = StaticQuotas::from_iter([("alice".to_string(), "1/s".parse()?)]);
/// assert_eq!(quotas.get("alice").map(|q| q.count()), Some(1));
/// # Ok::<(), sluice::QuotaError>(())
/// ```
#[derive(Debug, Clone)]
pub struct StaticQuotas<K> {
    quotas: HashMap<K, Quota>,
}

impl<K: Hash + Eq> StaticQuotas<K> {
    /// The quota of `key`, if listed.
    pub fn get<Q>(&self, key: &Q) -> Option<Quota>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.quotas.get(key).copied()
    }
}

impl<K: Hash + Eq> FromIterator<(K, Quota)> for StaticQuotas<K> {
    fn from_iter<I: IntoIterator<Item = (K, Quota)>>(iter: I) -> Self {
        Self {
            quotas: iter.into_iter().collect(),
        }
    }
}

#[allow(refining_impl_trait)]
impl<K: Hash + Eq + Send + Sync + 'static> QuotaSource<K> for StaticQuotas<K> {
    fn fetch(&self, key: &K) -> Ready<FetchResult> {
        ready(Ok(self.get(key)))
    }
}

/// A source made of a closure returning a future: `FnSource(|key| async move { ... })`.
///
/// # Example
/// ```
/// use sluice::{FetchResult, FnSource, KeyedLimiter, Quota, TokenBucket};
/// let source = FnSource(|key: &String| {
///     let vip = key.starts_with("vip-");
///     async move { FetchResult::Ok(Some(if vip { "100/s".parse::<Quota>()? } else { "1/s".parse()? })) }
/// });
/// let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse()?).source(source).build()?;
/// assert_eq!(limiter.check_n("vip-7", 100)?.remaining(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FnSource<F>(pub F);

#[allow(refining_impl_trait)]
impl<K, F, Fut> QuotaSource<K> for FnSource<F>
where
    F: Fn(&K) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = FetchResult> + Send + 'static,
{
    fn fetch(&self, key: &K) -> Fut {
        (self.0)(key)
    }
}

impl From<crate::QuotaError> for FetchError {
    fn from(e: crate::QuotaError) -> Self {
        Self::new(e)
    }
}
