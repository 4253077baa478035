//! Adapters over the core's quota sources: one source shared by the quota book and the local
//! fallback, and the per-host share of a quota.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sluice::{FetchResult, Quota, QuotaError, QuotaSource};

/// One quota source used by several keyed limiters.
pub(crate) struct SharedSource<S>(pub(crate) Arc<S>);

impl<S: QuotaSource<String>> QuotaSource<String> for SharedSource<S> {
    fn fetch(&self, key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        self.0.fetch(key)
    }
}

/// The source's quotas divided among `hosts`: each host's share of the limit.
pub(crate) struct Share<S> {
    pub(crate) source: Arc<S>,
    pub(crate) hosts: u64,
}

impl<S: QuotaSource<String>> QuotaSource<String> for Share<S> {
    fn fetch(&self, key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        let fetch = self.source.fetch(key);
        let hosts = self.hosts;
        async move {
            match fetch.await? {
                Some(quota) => Ok(Some(share(quota, hosts)?)),
                None => Ok(None),
            }
        }
    }
}

/// `quota / hosts`: the same period, the rate divided exactly (count per period × hosts) and
/// the capacity divided, rounded down but at least 1.
///
/// # Errors
/// If the divided quota cannot be held exactly (a period beyond 584 years).
pub(crate) fn share(quota: Quota, hosts: u64) -> Result<Quota, QuotaError> {
    let hosts = hosts.max(1);
    if quota.is_deny_all() || hosts == 1 {
        return Ok(quota);
    }
    let period = u32::try_from(hosts)
        .ok()
        .and_then(|h| quota.period().checked_mul(h))
        .unwrap_or(Duration::MAX);
    Quota::new(quota.count(), period)?.with_capacity((quota.capacity() / hosts).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn share_divides_rate_and_burst() {
        let q: Quota = "90/s burst 30".parse().unwrap();
        let s = share(q, 3).unwrap();
        assert_eq!(s.capacity(), 10);
        assert_eq!(s.reduced_rate(), (3, 100_000_000)); // 30/s
        assert_eq!(share(q, 1).unwrap(), q);
        assert!(share(Quota::deny_all(), 3).unwrap().is_deny_all());
        assert_eq!(share("1/s".parse().unwrap(), 4).unwrap().capacity(), 1);
    }
}
