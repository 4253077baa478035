//! Quota fetches: the first one of a new key, the periodic refresh, and applying an answer.

use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::book::{BookError, LimitRef};
use super::metrics::bump;
use super::shard::{Entry, meta};
use super::{FetchError, FetchResult, Inner, KeyedLimiter, QuotaSource};
use crate::{Algorithm, Clock};

/// A boxed background task, as handed to a [`Spawner`].
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs background quota fetches: `Arc::new(|task| { tokio::spawn(task); })`.
pub type Spawner = Arc<dyn Fn(Task) + Send + Sync>;

pub(crate) type ErrorHook<K> = Arc<dyn Fn(&K, &FetchError) + Send + Sync>;
pub(crate) type PendingFetch = Pin<Box<dyn Future<Output = FetchResult> + Send>>;

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    pub(crate) fn refresh(&self, key: K) {
        let Some(source) = &self.inner.source else { return };
        bump(&self.inner.counters.fetches);
        let mut fetch: PendingFetch = Box::pin(source.fetch(&key));
        match poll_once(&mut fetch) {
            Poll::Ready(result) => self.inner.apply(&key, result),
            Poll::Pending => self.spawn_fetch(key, fetch),
        }
    }

    pub(crate) fn spawn_fetch(&self, key: K, fetch: PendingFetch) {
        let Some(spawn) = &self.inner.spawner else {
            let error =
                FetchError::new("the quota source did not answer at once and no spawner is configured");
            self.inner.apply(&key, Err(error));
            return;
        };
        let inner: Weak<Inner<K, A, S, C>> = Arc::downgrade(&self.inner);
        let task = Box::pin(async move {
            let result = fetch.await;
            if let Some(inner) = inner.upgrade() {
                inner.apply(&key, result);
            }
        });
        spawn(task);
    }
}

// The two small executors below are std only: `futures`' `now_or_never` would do for the
// first but brings a dependency for three lines, and neither `futures` nor tokio can block a
// thread on a future with a deadline outside a runtime (tokio's `block_on` panics inside one,
// which is where a keyed limiter's caller usually is).

fn poll_once<T>(future: &mut Pin<Box<dyn Future<Output = T> + Send>>) -> Poll<T> {
    future.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

/// Drives `future` on this thread, parked between polls, until it is ready or `timeout`
/// (real time) has passed.
fn block_on_for<T>(future: &mut Pin<Box<dyn Future<Output = T> + Send>>, timeout: Duration) -> Option<T> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let deadline = std::time::Instant::now().checked_add(timeout);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut context) {
            return Some(value);
        }
        match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
            None => std::thread::park(),
        }
    }
}

impl<K, A, S, C> Inner<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Whether this check should start a refresh, claiming it (so only one thread does).
    #[inline]
    pub(super) fn claim_refresh(&self, entry: &Entry<K, A>, seen: u64, now: u64) -> bool {
        if self.source.is_none() || seen & meta::FETCHING != 0 {
            return false;
        }
        let age = meta::tick(now).wrapping_sub(meta::fetched_at(seen)) & 0xFFFF_FFFF;
        age >= self.refresh_ticks
            && entry
                .meta
                .compare_exchange(seen, seen | meta::FETCHING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// The quota a new key starts with, its bookkeeping bits, and the fetch still running.
    pub(super) fn first_fetch(
        &self,
        source: &S,
        key: &K,
        now: u64,
    ) -> (LimitRef<A>, u64, Option<PendingFetch>) {
        bump(&self.counters.fetches);
        let mut fetch: PendingFetch = Box::pin(source.fetch(key));
        let answer = match poll_once(&mut fetch) {
            Poll::Ready(result) => Some(result),
            Poll::Pending => self
                .first_fetch_wait
                .and_then(|timeout| block_on_for(&mut fetch, timeout)),
        };
        match answer {
            Some(result) => match self.resolve(result) {
                Ok(limit) => (limit, meta::with_fetched_at(meta::KNOWN, now), None),
                Err(error) => {
                    self.apply_error(key, &error);
                    (self.failsafe, meta::with_fetched_at(0, now), None)
                }
            },
            None => (
                self.failsafe,
                meta::with_fetched_at(meta::FETCHING, now),
                Some(fetch),
            ),
        }
    }

    fn resolve(&self, result: FetchResult) -> Result<LimitRef<A>, FetchError> {
        match result? {
            None => Ok(self.unknown),
            Some(quota) => self.book.book(&self.algorithm, quota).map_err(|error| match error {
                BookError::Quota(error) => error.into(),
                BookError::Full { held } => FetchError::new(format!(
                    "quota {quota} not applied: the limiter already holds {held} distinct quotas, its most"
                )),
            }),
        }
    }

    /// Applies a finished fetch to the key, if it is still held.
    fn apply(&self, key: &K, result: FetchResult) {
        let now = self.clock.now();
        let resolved = self.resolve(result);
        if let Err(error) = &resolved {
            self.apply_error(key, error);
        }
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash).write();
        let Some(i) = guard.find(hash, key) else { return };
        let entry = &mut guard.entries[i];
        let mut known = 0;
        if let Ok(limit) = resolved {
            known = meta::KNOWN;
            if !limit.same(&entry.limit) {
                entry.replace_limit(&self.algorithm, limit, now);
            }
        }
        // Read after the replacement, which counts itself in the bookkeeping.
        let seen = entry.meta.load(Ordering::Relaxed);
        let bits = meta::with_fetched_at(seen & !meta::FETCHING, now) | known;
        entry.meta.store(bits, Ordering::Relaxed);
    }

    fn apply_error(&self, key: &K, error: &FetchError) {
        bump(&self.counters.fetch_errors);
        if let Some(hook) = &self.on_fetch_error {
            hook(key, error);
        }
    }
}
