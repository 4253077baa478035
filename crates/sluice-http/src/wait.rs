//! Waiting in the layer: a request over its quota may wait for capacity in its key's queue
//! instead of being refused ([`WaitRoom`], set through
//! [`RateLimitBuilder::on_excess`](crate::RateLimitBuilder::on_excess)).
//!
//! Why one file over 600 lines: the room, a key's queue, the estimate and the waiter's future
//! all work under the same shard lock on the same queue fields; apart, those fields would be
//! open to every module. The core's `wait::Queue` cannot stand in: it asks a local limiter
//! under its lock, while this room's backend may answer later (Redis).
//!
//! A key's queue exists only while the key has waiters, and nothing runs for it but the
//! waiters' own futures: the head sleeps inside its future until the retry-after the limit gave
//! it, then asks again; the others sleep until the head leaves. A waiter holds no capacity,
//! only its place; dropping its future (a client that disconnects) leaves the queue at once.
//!
//! A newcomer is told at once when it cannot be served within its `max_wait`: its wait is
//! estimated when it joins as the head's next try plus the cost queued between the head and
//! it, paid at the quota's rate. Under a token bucket (GCRA) with nobody else spending the
//! key's capacity the estimate is the schedule itself; under a window algorithm it errs long
//! (a window's burst serves faster than the rate); with a backend that does not say the key's
//! quota, only the head's wait is counted. A waiter whose estimate went wrong (the quota
//! changed, another server spent the key's capacity) is refused at its deadline.

use std::collections::{HashMap, VecDeque};
use std::future::{Future, poll_fn};
use std::hash::BuildHasher;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sluice::{CheckError, Decision, QueueOrder, Quota, WaitPolicy};
use tokio::time::{Instant, sleep_until};

use crate::{CheckFuture, LimitBackend};

/// Waiting requests a [`WaitRoom`] holds at most unless told otherwise.
///
/// # Example
/// ```
/// assert_eq!(sluice_http::DEFAULT_MAX_WAITERS, 10_000);
/// ```
pub const DEFAULT_MAX_WAITERS: usize = 10_000;

/// Shards of the queue map: waiting is the slow path, a few locks spread it enough.
const SHARDS: usize = 64;

type Answer = Result<Decision, CheckError>;

/// The queues of the requests waiting for capacity, one per key with waiters, within a bound
/// on the waiters of all keys together. Layers built with the same room share that bound and
/// the queues: a server that rebuilds its layer on a reload keeps its waiters' order.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sluice::{KeyedLimiter, TokenBucket, WaitPolicy};
/// use sluice_http::{RateLimitLayer, WaitRoom};
/// let room = Arc::new(WaitRoom::new(5_000));
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?).build()?;
/// let layer = RateLimitLayer::builder(limiter)
///     .on_excess(WaitPolicy::wait_up_to(Duration::from_secs(2)).with_queue_limit(20))
///     .wait_room(Arc::clone(&room))
///     .build()?;
/// assert_eq!(room.waiters(), 0);
/// # let _ = layer;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct WaitRoom {
    shards: Box<[Mutex<Queues>]>,
    hasher: foldhash::fast::RandomState,
    waiters: AtomicUsize,
    max_waiters: usize,
    counts: [AtomicU64; 5],
}

/// What became of the requests that went to a [`WaitRoom`], since it was made.
///
/// # Example
/// ```
/// let counts = sluice_http::WaitRoom::new(10).counts();
/// assert_eq!((counts.served, counts.refused(), counts.late), (0, 0, 0));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WaitCounts {
    /// Waited and were served.
    pub served: u64,
    /// Refused at once: they could not be served within their `max_wait`.
    pub refused_max_wait: u64,
    /// Refused at once: their key's queue was at its limit.
    pub refused_queue_limit: u64,
    /// Refused at once: the room held as many waiters as it may.
    pub refused_max_waiters: u64,
    /// Waited and were refused after all: their deadline came first (the estimate was wrong:
    /// the quota changed, capacity was spent elsewhere), or newer waiters pushed them past it
    /// (newest-first), or an error.
    pub late: u64,
}

impl WaitCounts {
    /// Refused at once, for any reason.
    pub fn refused(&self) -> u64 {
        self.refused_max_wait + self.refused_queue_limit + self.refused_max_waiters
    }
}

const SERVED: usize = 0;
const LATE: usize = 1;
const TOO_LONG: usize = 2;
const QUEUE_FULL: usize = 3;
const ROOM_FULL: usize = 4;

impl std::fmt::Debug for WaitRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitRoom")
            .field("waiters", &self.waiters())
            .field("max_waiters", &self.max_waiters)
            .finish_non_exhaustive()
    }
}

impl Default for WaitRoom {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_WAITERS)
    }
}

/// The queues of one shard's keys.
type Queues = HashMap<Box<str>, KeyQueue, foldhash::fast::FixedState>;

/// One key's waiters, in arrival order.
struct KeyQueue {
    waiters: VecDeque<Waiter>,
    /// Summed costs of the waiters.
    queued: u64,
    next_id: u64,
    /// When the head asks the limit again.
    head_due: Instant,
}

struct Waiter {
    id: u64,
    cost: u64,
    deadline: Option<Instant>,
    wake: Option<Waker>,
}

/// Why a request was refused a place; each says when it could have been served, as the
/// queue estimates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its wait is beyond its `max_wait`.
    TooLong(Duration),
    /// Its key's queue has no room for its cost.
    QueueFull(Duration),
    /// The room holds as many waiters as it may.
    RoomFull(Duration),
}

impl Refusal {
    /// The estimated wait.
    pub(crate) fn wait(self) -> Duration {
        match self {
            Self::TooLong(wait) | Self::QueueFull(wait) | Self::RoomFull(wait) => wait,
        }
    }
}

/// What a waiter may do now.
enum Turn {
    /// It is the head and its time has come: ask the limit.
    Now,
    /// Sleep until woken, or until this instant.
    Sleep(Option<Instant>),
    /// Out of the queue: evicted by newer waiters (newest-first).
    Gone,
}

impl WaitRoom {
    /// A room for at most `max_waiters` waiting requests over all keys; more are refused at
    /// once, as over their queue limit.
    ///
    /// # Example
    /// ```
    /// let room = sluice_http::WaitRoom::new(100);
    /// assert_eq!(room.max_waiters(), 100);
    /// ```
    pub fn new(max_waiters: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            waiters: AtomicUsize::new(0),
            max_waiters,
            counts: Default::default(),
        }
    }

    /// Requests waiting now, over all keys.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_http::WaitRoom::new(10).waiters(), 0);
    /// ```
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Acquire)
    }

    /// The most requests that may wait at once.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_http::WaitRoom::default().max_waiters(), sluice_http::DEFAULT_MAX_WAITERS);
    /// ```
    pub fn max_waiters(&self) -> usize {
        self.max_waiters
    }

    /// What became of the requests that came here.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_http::WaitRoom::new(10).counts().served, 0);
    /// ```
    pub fn counts(&self) -> WaitCounts {
        let read = |i: usize| self.counts[i].load(Ordering::Relaxed);
        WaitCounts {
            served: read(SERVED),
            refused_max_wait: read(TOO_LONG),
            refused_queue_limit: read(QUEUE_FULL),
            refused_max_waiters: read(ROOM_FULL),
            late: read(LATE),
        }
    }

    fn count(&self, outcome: usize) {
        self.counts[outcome].fetch_add(1, Ordering::Relaxed);
    }

    /// `refusal`, counted.
    fn refuse(&self, refusal: Refusal) -> Refusal {
        self.count(match refusal {
            Refusal::TooLong(_) => TOO_LONG,
            Refusal::QueueFull(_) => QUEUE_FULL,
            Refusal::RoomFull(_) => ROOM_FULL,
        });
        refusal
    }

    /// Keys with waiters now.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_http::WaitRoom::new(10).queued_keys(), 0);
    /// ```
    pub fn queued_keys(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).len()).sum()
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Queues> {
        // The high bits: the map inside the shard uses the low ones.
        let index = (self.hasher.hash_one(key) >> 58) as usize % SHARDS;
        lock(&self.shards[index])
    }

    /// Whether `key` has waiters (read first without a lock: nobody waits anywhere, mostly).
    pub(crate) fn has_queue(&self, key: &str) -> bool {
        self.waiters() > 0 && self.shard(key).contains_key(key)
    }

    /// A place in `key`'s queue for `cost`, or why not. `retry_after` is the limit's answer
    /// if it was asked (the newcomer is then the head, or is behind others that came first);
    /// `interval` is the time the quota takes to refill one unit, when known.
    pub(crate) fn join(
        self: &Arc<Self>,
        key: &str,
        cost: u64,
        policy: &WaitPolicy,
        retry_after: Option<Duration>,
        interval: Option<Duration>,
    ) -> Result<Ticket, Refusal> {
        let now = Instant::now();
        let order = policy.queue_order();
        let mut shard = self.shard(key);
        let empty = KeyQueue {
            waiters: VecDeque::new(),
            queued: 0,
            next_id: 0,
            head_due: now,
        };
        let queue = shard.get(key).unwrap_or(&empty);
        // Newest-first: the newcomer is the head. Oldest-first: it is served after everyone
        // queued, each paid at the quota's rate after the head's next try.
        let wait = if queue.waiters.is_empty() || order == QueueOrder::NewestFirst {
            retry_after.unwrap_or_default()
        } else {
            let head = queue.waiters.front().map_or(0, |w| w.cost);
            let after_head = (queue.queued - head).saturating_add(cost);
            (queue.head_due.saturating_duration_since(now)).saturating_add(paid(after_head, interval))
        };
        if policy.timeout().is_some_and(|max| wait > max) {
            return Err(self.refuse(Refusal::TooLong(wait)));
        }
        let limit = policy.queue_limit();
        if cost > limit || (order == QueueOrder::OldestFirst && queue.queued + cost > limit) {
            return Err(self.refuse(Refusal::QueueFull(wait)));
        }
        if self.waiters.fetch_add(1, Ordering::AcqRel) >= self.max_waiters {
            self.waiters.fetch_sub(1, Ordering::AcqRel);
            return Err(self.refuse(Refusal::RoomFull(wait)));
        }
        let queue = match shard.get_mut(key) {
            Some(queue) => queue,
            None => shard.entry(key.into()).or_insert(empty),
        };
        let id = queue.next_id;
        queue.next_id += 1;
        let deadline = policy.timeout().and_then(|max| now.checked_add(max));
        queue.waiters.push_back(Waiter {
            id,
            cost,
            deadline,
            wake: None,
        });
        queue.queued += cost;
        if queue.waiters.len() == 1 || order == QueueOrder::NewestFirst {
            queue.head_due = later(now, wait);
        }
        if order == QueueOrder::NewestFirst {
            let evicted = queue.make_room(limit, interval, now);
            self.waiters.fetch_sub(evicted, Ordering::AcqRel);
        }
        Ok(Ticket {
            room: Arc::clone(self),
            key: key.into(),
            id,
            order,
            left: false,
        })
    }

    /// What `ticket`'s waiter may do now; `waker` wakes it when that changes.
    fn turn(&self, ticket: &Ticket, waker: &Waker, now: Instant) -> Turn {
        let mut shard = self.shard(&ticket.key);
        let Some(queue) = shard.get_mut(&*ticket.key) else {
            return Turn::Gone;
        };
        let head = queue.head(ticket.order).map(|w| w.id);
        let due = queue.head_due;
        let Some(waiter) = queue.find_mut(ticket.id) else {
            return Turn::Gone;
        };
        // Kept even by a sleeping head, so an eviction reaches it at once.
        if !waiter.wake.as_ref().is_some_and(|w| w.will_wake(waker)) {
            waiter.wake = Some(waker.clone());
        }
        match head {
            Some(id) if id == ticket.id && due <= now => Turn::Now,
            Some(id) if id == ticket.id => Turn::Sleep(Some(due)),
            _ => Turn::Sleep(None),
        }
    }

    /// The head asked and was denied: it asks again at `due`.
    fn reschedule(&self, ticket: &Ticket, due: Instant) {
        if let Some(queue) = self.shard(&ticket.key).get_mut(&*ticket.key)
            && queue.head(ticket.order).is_some_and(|w| w.id == ticket.id)
        {
            queue.head_due = due;
        }
    }

    /// Takes `ticket`'s waiter out of its queue; the next head, if this was the head, asks
    /// the limit at once.
    fn leave(&self, ticket: &Ticket) {
        let mut shard = self.shard(&ticket.key);
        let Some(queue) = shard.get_mut(&*ticket.key) else {
            return;
        };
        let was_head = queue.head(ticket.order).is_some_and(|w| w.id == ticket.id);
        let Some(index) = queue.index(ticket.id) else {
            return; // evicted: already counted out
        };
        if let Some(waiter) = queue.waiters.remove(index) {
            queue.queued -= waiter.cost;
        }
        self.waiters.fetch_sub(1, Ordering::AcqRel);
        if queue.waiters.is_empty() {
            shard.remove(&*ticket.key);
        } else if was_head {
            queue.head_due = Instant::now();
            if let Some(wake) = queue.head_mut(ticket.order).and_then(|w| w.wake.take()) {
                wake.wake();
            }
        }
    }
}

/// Far enough to mean "never" (tokio's own far future is about 30 years).
const FAR: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `wait` after `now`, or far away when that cannot be represented.
fn later(now: Instant, wait: Duration) -> Instant {
    now.checked_add(wait).unwrap_or_else(|| now + FAR)
}

/// The time `units` take to refill at one unit per `interval` (none known: nothing).
fn paid(units: u64, interval: Option<Duration>) -> Duration {
    interval.map_or(Duration::ZERO, |per| {
        let nanos = u128::from(units).saturating_mul(per.as_nanos());
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    })
}

/// The time `quota` takes to refill one unit, rounded up; none for a quota that never does.
fn unit_interval(quota: Option<Quota>) -> Option<Duration> {
    let quota = quota.filter(|q| !q.is_deny_all())?;
    Some(Duration::from_nanos(quota.period_nanos().div_ceil(quota.count())))
}

impl KeyQueue {
    fn head(&self, order: QueueOrder) -> Option<&Waiter> {
        match order {
            QueueOrder::OldestFirst => self.waiters.front(),
            QueueOrder::NewestFirst => self.waiters.back(),
        }
    }

    fn head_mut(&mut self, order: QueueOrder) -> Option<&mut Waiter> {
        match order {
            QueueOrder::OldestFirst => self.waiters.front_mut(),
            QueueOrder::NewestFirst => self.waiters.back_mut(),
        }
    }

    /// Ids increase from front to back.
    fn index(&self, id: u64) -> Option<usize> {
        self.waiters.binary_search_by_key(&id, |w| w.id).ok()
    }

    fn find_mut(&mut self, id: u64) -> Option<&mut Waiter> {
        let index = self.index(id)?;
        self.waiters.get_mut(index)
    }

    /// Newest-first, after a newcomer took the head: evicts the oldest waiters while the queue
    /// is over `limit`, and every waiter that can no longer be served by its deadline. Returns
    /// how many it evicted; each is woken to be refused.
    fn make_room(&mut self, limit: u64, interval: Option<Duration>, now: Instant) -> usize {
        let mut evicted = 0;
        while self.queued > limit
            && let Some(oldest) = self.waiters.pop_front()
        {
            self.queued -= oldest.cost;
            evicted += 1;
            wake(oldest.wake);
        }
        // Served after the head, newest to oldest, each paid at the quota's rate.
        let mut ahead = 0u64;
        let mut index = self.waiters.len().saturating_sub(1);
        while index > 0 {
            index -= 1;
            let waiter = &self.waiters[index];
            ahead = ahead.saturating_add(waiter.cost);
            let served = later(self.head_due.max(now), paid(ahead, interval));
            if waiter.deadline.is_some_and(|d| served > d)
                && let Some(late) = self.waiters.remove(index)
            {
                ahead -= late.cost;
                self.queued -= late.cost;
                evicted += 1;
                wake(late.wake);
            }
        }
        evicted
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves plain data behind: keep serving.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A place in a key's queue; dropping it leaves the queue.
pub(crate) struct Ticket {
    room: Arc<WaitRoom>,
    key: Box<str>,
    id: u64,
    order: QueueOrder,
    left: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.left {
            self.room.leave(self);
        }
    }
}

/// The answer a waiter ends with, how long it waited, and its key's other limits when the key
/// is held to several (from the check that answered).
pub(crate) type Settled = (Answer, Duration, Option<Box<crate::SeveralLimits>>);

/// Waits for `ticket`'s turn, then asks `backend` for `cost` until granted; refused (with the
/// limit's last denial, its retry-after as estimated) when its deadline cannot be met or it is
/// evicted. `denial` is the limit's answer that sent it to the queue, if it was asked;
/// `limit` the quota's capacity, for a refusal made up without one.
async fn wait_turn(
    mut ticket: Ticket,
    backend: Arc<dyn LimitBackend>,
    cost: u64,
    limit: u64,
    deadline: Option<Duration>,
    mut denial: Option<Decision>,
) -> Settled {
    let start = Instant::now();
    let deadline = deadline.and_then(|d| start.checked_add(d));
    let mut nap = pin!(sleep_until(deadline.unwrap_or(start)));
    loop {
        let turn = poll_fn(|cx: &mut Context<'_>| {
            let now = Instant::now();
            match ticket.room.turn(&ticket, cx.waker(), now) {
                Turn::Now => Poll::Ready(Ok(())),
                Turn::Gone => Poll::Ready(Err(None)),
                Turn::Sleep(until) => {
                    let until = match (until, deadline) {
                        (Some(due), Some(d)) if due > d => {
                            return Poll::Ready(Err(Some(due.saturating_duration_since(now))));
                        }
                        (Some(due), _) => due,
                        (None, Some(d)) if now >= d => return Poll::Ready(Err(None)),
                        (None, Some(d)) => d,
                        (None, None) => return Poll::Pending,
                    };
                    if nap.deadline() != until {
                        nap.as_mut().reset(until);
                    }
                    // Already due: ask again at once.
                    match nap.as_mut().poll(cx) {
                        Poll::Ready(()) => {
                            cx.waker().wake_by_ref();
                            Poll::Pending
                        }
                        Poll::Pending => Poll::Pending,
                    }
                }
            }
        })
        .await;
        if let Err(retry) = turn {
            // Evicted or out of time: when the limit could serve it, as far as it is known.
            let retry = retry.or(denial.map(|d| d.retry_after())).unwrap_or_default();
            ticket.room.count(LATE);
            return (Ok(refused(denial, limit, retry)), start.elapsed(), None);
        }
        let mut check = backend.check(&ticket.key, cost);
        let answer = (&mut check).await;
        match answer {
            Ok(decision) if decision.is_allowed() => {
                ticket.room.leave(&ticket);
                ticket.left = true;
                ticket.room.count(SERVED);
                return (Ok(decision), start.elapsed(), check.take_listed());
            }
            Ok(decision) => {
                let now = Instant::now();
                let due = later(now, decision.retry_after());
                denial = Some(decision);
                if deadline.is_some_and(|d| due > d) {
                    ticket.room.count(LATE);
                    return (Ok(decision), now - start, check.take_listed());
                }
                ticket.room.reschedule(&ticket, due);
            }
            Err(error) => {
                ticket.room.count(LATE);
                return (Err(error), start.elapsed(), None);
            }
        }
    }
}

/// The denial a refused request is answered with: the limit's last, with the queue's
/// estimate of when it could be served as its retry-after; made up (nothing left, full again
/// then) when the limit was not asked.
fn refused(denial: Option<Decision>, limit: u64, retry_after: Duration) -> Decision {
    let nanos = u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX).max(1);
    match denial {
        Some(d) => Decision::denied(d.limit(), d.remaining(), d.reset_after_nanos(), nanos),
        None => Decision::denied(limit, 0, nanos, nanos),
    }
}

/// The future of a waiting request: boxed, so a layer whose requests never wait carries none.
pub(crate) struct WaitFuture(Pin<Box<dyn Future<Output = Settled> + Send>>);

impl WaitFuture {
    pub(crate) fn new(future: impl Future<Output = Settled> + Send + 'static) -> Self {
        Self(Box::pin(future))
    }
}

impl Future for WaitFuture {
    type Output = Settled;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Settled> {
        self.0.as_mut().poll(cx)
    }
}

/// Waits for a remote backend's first answer, then, if denied, in the queue.
pub(crate) fn after_check(
    first: CheckFuture,
    room: Arc<WaitRoom>,
    backend: Arc<dyn LimitBackend>,
    key: Box<str>,
    cost: u64,
    policy: WaitPolicy,
) -> WaitFuture {
    WaitFuture::new(async move {
        let start = Instant::now();
        let mut first = first;
        let decision = match (&mut first).await {
            Ok(decision) if !decision.is_allowed() => decision,
            answer => return (answer, Duration::ZERO, first.take_listed()),
        };
        let listed = first.take_listed();
        let quota = listed
            .as_ref()
            .map_or_else(|| backend.quota(&key), |listed| listed.quota);
        match queue(&room, &backend, &key, cost, &policy, Some(decision), quota) {
            Ok(wait) => {
                let (answer, _, listed) = wait.await;
                (answer, start.elapsed(), listed)
            }
            Err(denial) => (Ok(denial), Duration::ZERO, listed),
        }
    })
}

/// A place in `key`'s queue for `cost` and the wait in it, or the denial of a request refused
/// at once: it cannot be served within its `max_wait` (its retry-after then says when it
/// could) or finds no room. `denial` is the limit's answer that sent it here, if it asked.
pub(crate) fn queue(
    room: &Arc<WaitRoom>,
    backend: &Arc<dyn LimitBackend>,
    key: &str,
    cost: u64,
    policy: &WaitPolicy,
    denial: Option<Decision>,
    quota: Option<Quota>,
) -> Result<impl Future<Output = Settled> + Send + 'static, Decision> {
    let retry_after = denial.map(|d| d.retry_after());
    let limit = quota.map_or(cost, |q| q.capacity());
    match room.join(key, cost, policy, retry_after, unit_interval(quota)) {
        Ok(ticket) => Ok(wait_turn(
            ticket,
            Arc::clone(backend),
            cost,
            limit,
            policy.timeout(),
            denial,
        )),
        Err(refusal) => Err(refused(denial, limit, refusal.wait())),
    }
}

/// Whether requests over their quota wait, by key: a default and exceptions.
pub(crate) struct ExcessPolicies {
    pub(crate) room: Arc<WaitRoom>,
    /// `None`: refused at once.
    pub(crate) default: Option<WaitPolicy>,
    pub(crate) by_key: HashMap<Box<str>, Option<WaitPolicy>, foldhash::fast::FixedState>,
}

impl ExcessPolicies {
    /// The policy of `key`'s requests, if they may wait.
    #[inline]
    pub(crate) fn of(&self, key: &str) -> Option<&WaitPolicy> {
        if self.by_key.is_empty() {
            return self.default.as_ref();
        }
        match self.by_key.get(key) {
            Some(policy) => policy.as_ref(),
            None => self.default.as_ref(),
        }
    }
}

/// `policy` if a request may wait under it at all (a queue limit above 0 and a timeout above
/// 0).
pub(crate) fn waits(policy: WaitPolicy) -> Option<WaitPolicy> {
    (policy.queue_limit() > 0 && policy.timeout() != Some(Duration::ZERO)).then_some(policy)
}
