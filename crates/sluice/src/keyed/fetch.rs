//! Quota fetches: the first one of a new key, the periodic refresh, and applying an answer.
//!
//! A source is user code and may misbehave: every fetch is `Guarded`, so a panic in it is
//! caught and a fetch that does not answer within the fetch timeout ends (woken by an alarm,
//! `timer.rs`); both count as failed fetches, after which the key is fetched again at its next
//! refresh. A fetch that is not ready at once takes one of the limiter's places for fetches in
//! flight (`FetchPlaces`) for as long as it runs; with none free no task is started.

use std::any::Any;
use std::future::Future;
use std::hash::{BuildHasher, Hash};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::book::{BookError, LimitRef};
use super::metrics::bump;
use super::shard::{Entry, meta};
use super::timer::Alarm;
use super::{FetchError, FetchResult, Inner, KeyedLimiter, QuotaSource};
use crate::{Algorithm, Clock};

/// A boxed background task, as handed to a [`Spawner`].
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Runs background quota fetches: `Arc::new(|task| { tokio::spawn(task); })`.
pub type Spawner = Arc<dyn Fn(Task) + Send + Sync>;

pub(crate) type ErrorHook<K> = Arc<dyn Fn(&K, &FetchError) + Send + Sync>;
type PendingFetch = Pin<Box<dyn Future<Output = FetchResult> + Send>>;

/// How a fetch ended.
pub(crate) enum Ended {
    /// The source answered.
    Answered(FetchResult),
    /// The source did not answer within the fetch timeout.
    TimedOut,
    /// The source panicked (the message, if it was text).
    Panicked(String),
    /// The task running the fetch was dropped before the fetch ended (by the spawner, or a
    /// runtime shutting down).
    Abandoned,
}

/// The places for fetches in flight: a fetch not ready at once holds one while it runs.
pub(crate) struct FetchPlaces {
    in_flight: AtomicU64,
    max: u64,
}

/// One place among the fetches in flight, given back when dropped.
pub(crate) struct FetchPlace(Arc<FetchPlaces>);

impl FetchPlaces {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicU64::new(0),
            max: u64::try_from(max).unwrap_or(u64::MAX),
        })
    }

    /// A place, if one is free.
    pub(crate) fn claim(self: &Arc<Self>) -> Option<FetchPlace> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| FetchPlace(Arc::clone(self)))
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl Drop for FetchPlace {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A source's fetch, guarded: a panic in the source ends it as [`Ended::Panicked`], and it
/// ends as [`Ended::TimedOut`] once `timeout` has passed since its first poll.
pub(crate) struct Guarded {
    stage: Stage,
    timeout: Duration,
    /// Set at the first poll that finds the fetch pending (`None` inside: no deadline).
    deadline: Option<Option<Instant>>,
    alarm: Option<Alarm>,
}

enum Stage {
    Running(PendingFetch),
    Panicked(String),
    Ended,
}

impl Guarded {
    /// Asks `source` for `key`'s quota.
    fn start<K, S: QuotaSource<K>>(source: &S, key: &K, timeout: Duration) -> Self {
        let stage = match catch_unwind(AssertUnwindSafe(|| -> PendingFetch {
            Box::pin(source.fetch(key))
        })) {
            Ok(fetch) => Stage::Running(fetch),
            Err(payload) => Stage::Panicked(panic_message(&*payload)),
        };
        Self {
            stage,
            timeout,
            deadline: None,
            alarm: None,
        }
    }
}

impl Future for Guarded {
    type Output = Ended;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended> {
        let this = &mut *self;
        let fetch = match &mut this.stage {
            Stage::Running(fetch) => fetch,
            Stage::Panicked(message) => {
                let message = std::mem::take(message);
                this.stage = Stage::Ended;
                return Poll::Ready(Ended::Panicked(message));
            }
            // Polled after it ended: a caller's mistake; answer nothing more.
            Stage::Ended => return Poll::Pending,
        };
        let ended = match catch_unwind(AssertUnwindSafe(|| fetch.as_mut().poll(cx))) {
            Ok(Poll::Ready(result)) => Ended::Answered(result),
            Err(payload) => Ended::Panicked(panic_message(&*payload)),
            Ok(Poll::Pending) => {
                let now = Instant::now();
                let timeout = this.timeout;
                match *this.deadline.get_or_insert_with(|| now.checked_add(timeout)) {
                    Some(deadline) if now >= deadline => Ended::TimedOut,
                    Some(deadline) => {
                        // The first poll, where the fetch starts, has no one to wake.
                        if !cx.waker().will_wake(Waker::noop()) {
                            this.alarm
                                .get_or_insert_with(|| Alarm::new(deadline))
                                .set(cx.waker());
                        }
                        return Poll::Pending;
                    }
                    None => return Poll::Pending,
                }
            }
        };
        // A source that panicked may panic again when dropped: that one is swallowed too.
        let stage = std::mem::replace(&mut this.stage, Stage::Ended);
        let _ = catch_unwind(AssertUnwindSafe(move || drop(stage)));
        this.alarm = None;
        Poll::Ready(ended)
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// A spawned fetch's way back to its key: applies how the fetch ended, or, if the task is
/// dropped first, that it was abandoned, so the key never stays marked as being fetched.
struct Landing {
    apply: Option<Box<dyn FnOnce(Ended) + Send>>,
    slot: Option<FetchPlace>,
}

impl Landing {
    fn land(&mut self, ended: Ended) {
        // The place is free before the key can ask for another fetch.
        self.slot = None;
        if let Some(apply) = self.apply.take() {
            apply(ended);
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        self.land(Ended::Abandoned);
    }
}

impl<K, A, S, C> KeyedLimiter<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Fetches `key`'s quota again, in the place claimed for it.
    pub(crate) fn refresh(&self, key: K, slot: FetchPlace) {
        let inner = &*self.inner;
        let Some(source) = &inner.source else { return };
        bump(&inner.counters.fetches);
        let mut fetch = Guarded::start(source, &key, inner.fetch_timeout);
        match poll_once(&mut fetch) {
            Poll::Ready(ended) => {
                drop(slot);
                inner.apply(&key, ended);
            }
            Poll::Pending => self.spawn_fetch(Pending { key, fetch, slot }),
        }
    }

    pub(crate) fn spawn_fetch(&self, pending: Pending<K>) {
        let Pending { key, fetch, slot } = pending;
        let Some(spawn) = &self.inner.spawner else {
            drop(slot);
            let error =
                FetchError::new("the quota source did not answer at once and no spawner is configured");
            self.inner.apply(&key, Ended::Answered(Err(error)));
            return;
        };
        let inner: Weak<Inner<K, A, S, C>> = Arc::downgrade(&self.inner);
        let mut landing = Landing {
            apply: Some(Box::new(move |ended| {
                if let Some(inner) = inner.upgrade() {
                    inner.apply(&key, ended);
                }
            })),
            slot: Some(slot),
        };
        spawn(Box::pin(async move {
            let ended = fetch.await;
            landing.land(ended);
        }));
    }
}

// The two small executors below are std only: `futures`' `now_or_never` would do for the
// first but brings a dependency for three lines, and neither `futures` nor tokio can block a
// thread on a future with a deadline outside a runtime (tokio's `block_on` panics inside one,
// which is where a keyed limiter's caller usually is).

fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
}

/// Drives `future` on this thread, parked between polls, until it is ready or `timeout`
/// (real time) has passed.
fn block_on_for<F: Future + Unpin>(future: &mut F, timeout: Duration) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let deadline = Instant::now().checked_add(timeout);
    loop {
        if let Poll::Ready(value) = Pin::new(&mut *future).poll(&mut context) {
            return Some(value);
        }
        match deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
            None => std::thread::park(),
        }
    }
}

/// A fetch still running: whose, and the place it holds. Boxed where it is carried through
/// the slow path, so that keys without one (most) move a null pointer, not the fetch.
pub(crate) struct Pending<K> {
    key: K,
    fetch: Guarded,
    slot: FetchPlace,
}

/// How a new key starts: the quota it is governed by, its bookkeeping bits, and its fetch
/// still running.
pub(super) type FirstFetch<K, A> = (LimitRef<A>, u64, Option<Box<Pending<K>>>);

impl<K, A, S, C> Inner<K, A, S, C>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
{
    /// Whether this check should start a refresh: if so, the refresh is claimed (one CAS, so
    /// only one thread starts it) with a place among the fetches in flight. With no place free
    /// nothing is claimed and a later check tries again.
    #[inline]
    pub(super) fn claim_refresh(&self, entry: &Entry<K, A>, seen: u64, now: u64) -> Option<FetchPlace> {
        if self.source.is_none() || seen & meta::FETCHING != 0 {
            return None;
        }
        if meta::age(seen, now) < self.refresh_after {
            return None;
        }
        let slot = self.slots.claim()?;
        entry
            .meta
            .compare_exchange(seen, seen | meta::FETCHING, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(slot)
    }

    /// The quota a new key starts with, its bookkeeping bits, and the fetch still running.
    #[inline(never)]
    pub(super) fn first_fetch(&self, source: &S, key: &K, now: u64) -> FirstFetch<K, A> {
        bump(&self.counters.fetches);
        let mut fetch = Guarded::start(source, key, self.fetch_timeout);
        let ended = match poll_once(&mut fetch) {
            Poll::Ready(ended) => ended,
            Poll::Pending => {
                let Some(slot) = self.slots.claim() else {
                    // Every place is taken: no task. The key starts on the failsafe quota (and
                    // the pool), with its fetch due at its next check.
                    bump(&self.counters.fetches_skipped);
                    return (
                        self.failsafe,
                        meta::due(now, self.refresh_after.unsigned_abs()),
                        None,
                    );
                };
                match self
                    .first_fetch_wait
                    .and_then(|timeout| block_on_for(&mut fetch, timeout))
                {
                    Some(ended) => ended,
                    None => {
                        let bits = meta::with_fetched_at(meta::FETCHING, now);
                        let key = key.clone();
                        return (self.failsafe, bits, Some(Box::new(Pending { key, fetch, slot })));
                    }
                }
            }
        };
        match self.resolve(self.outcome(ended)) {
            Ok(limit) => (limit, meta::with_fetched_at(meta::KNOWN, now), None),
            Err(error) => {
                self.apply_error(key, &error);
                (self.failsafe, meta::with_fetched_at(0, now), None)
            }
        }
    }

    /// The answer of a fetch that ended, its fault counted if it has one.
    fn outcome(&self, ended: Ended) -> FetchResult {
        match ended {
            Ended::Answered(result) => result,
            Ended::TimedOut => {
                bump(&self.counters.fetch_timeouts);
                Err(FetchError::new(format!(
                    "the quota source did not answer within the fetch timeout ({:?})",
                    self.fetch_timeout
                )))
            }
            Ended::Panicked(message) => {
                bump(&self.counters.fetch_panics);
                Err(FetchError::new(format!("the quota source panicked: {message}")))
            }
            Ended::Abandoned => Err(FetchError::new("the fetch's task was dropped before it ended")),
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

    /// Applies a finished fetch to the key, if it is still held; its next refresh is due a
    /// refresh period from now, whether the fetch succeeded or not.
    fn apply(&self, key: &K, ended: Ended) {
        let now = self.clock.now();
        let resolved = self.resolve(self.outcome(ended));
        if let Err(error) = &resolved {
            self.apply_error(key, error);
        }
        let hash = self.hasher.hash_one(key);
        let mut guard = self.shard(hash).write();
        let Some(entry) = guard.get_mut(hash, key) else {
            return;
        };
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
            // The hook is user code too: a panic in it must not leave the key marked as being
            // fetched (the caller clears that after this).
            let _ = catch_unwind(AssertUnwindSafe(|| hook(key, error)));
        }
    }
}
