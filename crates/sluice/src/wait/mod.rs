//! Waiting for capacity: reject, wait, or wait up to a timeout, in a bounded queue.
//!
//! A limiter wrapped for waiting ([`WaitingLimiter`], [`WaitingKeyed`] per key,
//! [`WaitingConcurrency`]) answers an acquire of some cost at once when capacity is there and
//! nobody is queued; otherwise the request joins the limit's queue, within a queue limit
//! counted in permits (units of cost). The [`WaitPolicy`] says how long a request may wait
//! (not at all, for ever, or up to a timeout) and in which order the queue is served:
//!
//! - [`QueueOrder::OldestFirst`]: first come, first served; nobody overtakes, so a large
//!   request at the head is not starved by small ones behind it. A newcomer that does not fit
//!   the queue limit is rejected.
//! - [`QueueOrder::NewestFirst`]: the newest request is served first; when the queue is full,
//!   the oldest waiters are rejected ([`WaitError::Evicted`]) to make room.
//!
//! Only the head of a queue asks the limit; it sleeps, inside its own future (or thread),
//! until the retry-after the limit computed, and the others sleep until the head leaves. No
//! thread or timer task runs for an idle limit, and a key's queue exists only while the key
//! has waiters. A waiter that is dropped (cancelled) or times out leaves the queue and takes
//! nothing with it: a waiter holds no capacity, only its place.
//!
//! Arrival order is the order in which requests find the queue: one that finds nobody waiting
//! asks the limit directly (no lock), one that finds waiters joins behind them. A head whose
//! retry-after lies beyond its deadline is answered at once ([`WaitError::TimedOut`] with the
//! retry-after) rather than left to sleep in vain. A quota that denies everything answers
//! [`WaitError::CostExceedsCapacity`] with a capacity of 0.
//!
//! The async methods need the `wait` feature (on by default; it pulls `tokio` with only its
//! `time` feature) and must run inside a tokio runtime with time enabled. The blocking methods
//! need no runtime.

mod concurrency;
mod direct;
mod keyed;
mod queue;

#[cfg(feature = "wait")]
mod clock;
#[cfg(feature = "wait")]
mod future;

use std::thread;
use std::time::{Duration, Instant};

#[cfg(feature = "wait")]
pub use clock::TokioClock;
pub use concurrency::{QueuedPermit, WaitingConcurrency};
pub use direct::WaitingLimiter;
pub use keyed::WaitingKeyed;
use queue::{Queue, Step, Take, Wake};

/// The order in which a queue is served.
///
/// # Example
/// ```
/// use sluice::{QueueOrder, WaitPolicy};
/// let policy = WaitPolicy::wait().with_queue_order(QueueOrder::NewestFirst);
/// assert_eq!(policy.queue_order(), QueueOrder::NewestFirst);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum QueueOrder {
    /// First come, first served; a newcomer that does not fit the queue is rejected.
    #[default]
    OldestFirst,
    /// The newest is served first; the oldest are rejected to make room.
    NewestFirst,
}

/// How a request that finds no capacity is treated: rejected, or queued (for ever or up to a
/// timeout) within a queue limit, served in a [`QueueOrder`].
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::WaitPolicy;
/// let policy = WaitPolicy::wait_up_to(Duration::from_secs(2)).with_queue_limit(100);
/// assert_eq!(policy.timeout(), Some(Duration::from_secs(2)));
/// assert_eq!(policy.queue_limit(), 100);
/// assert_eq!(WaitPolicy::reject().timeout(), Some(Duration::ZERO));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaitPolicy {
    timeout: Option<Duration>,
    queue_limit: u64,
    order: QueueOrder,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self::wait()
    }
}

impl WaitPolicy {
    /// The queue limit of [`Self::wait`] and [`Self::wait_up_to`], in permits.
    pub const DEFAULT_QUEUE_LIMIT: u64 = 1024;

    /// Never wait: a request without capacity is rejected at once.
    ///
    /// # Example
    /// ```
    /// use sluice::WaitPolicy;
    /// assert_eq!(WaitPolicy::reject().queue_limit(), 0);
    /// ```
    pub const fn reject() -> Self {
        Self {
            timeout: Some(Duration::ZERO),
            queue_limit: 0,
            order: QueueOrder::OldestFirst,
        }
    }

    /// Wait as long as it takes (within the queue limit), oldest first.
    ///
    /// # Example
    /// ```
    /// use sluice::WaitPolicy;
    /// assert_eq!(WaitPolicy::wait().timeout(), None);
    /// ```
    pub const fn wait() -> Self {
        Self {
            timeout: None,
            queue_limit: Self::DEFAULT_QUEUE_LIMIT,
            order: QueueOrder::OldestFirst,
        }
    }

    /// Wait at most `timeout` (within the queue limit), oldest first.
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::WaitPolicy;
    /// assert_eq!(WaitPolicy::wait_up_to(Duration::from_millis(250)).timeout(), Some(Duration::from_millis(250)));
    /// ```
    pub const fn wait_up_to(timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            queue_limit: Self::DEFAULT_QUEUE_LIMIT,
            order: QueueOrder::OldestFirst,
        }
    }

    /// The most permits (summed costs) that may wait in one queue.
    ///
    /// # Example
    /// ```
    /// use sluice::WaitPolicy;
    /// assert_eq!(WaitPolicy::wait().with_queue_limit(10).queue_limit(), 10);
    /// ```
    pub const fn with_queue_limit(mut self, permits: u64) -> Self {
        self.queue_limit = permits;
        self
    }

    /// The order the queue is served in.
    ///
    /// # Example
    /// ```
    /// use sluice::{QueueOrder, WaitPolicy};
    /// assert_eq!(WaitPolicy::wait().with_queue_order(QueueOrder::NewestFirst).queue_order(), QueueOrder::NewestFirst);
    /// ```
    pub const fn with_queue_order(mut self, order: QueueOrder) -> Self {
        self.order = order;
        self
    }

    /// How long a request may wait (`None`: for ever).
    pub const fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The queue limit in permits.
    pub const fn queue_limit(&self) -> u64 {
        self.queue_limit
    }

    /// The order the queue is served in.
    pub const fn queue_order(&self) -> QueueOrder {
        self.order
    }
}

/// Why an acquire was not granted.
///
/// # Example
/// ```
/// use sluice::{ManualClock, RateLimiter, TokenBucket, WaitError, WaitPolicy, WaitingLimiter};
/// let limiter = RateLimiter::with_clock(TokenBucket, "1/s".parse()?, ManualClock::new(0))?;
/// let waiting = WaitingLimiter::new(limiter, WaitPolicy::reject());
/// assert!(waiting.acquire_blocking(1).is_ok());
/// match waiting.acquire_blocking(1) {
///     Err(WaitError::TimedOut { retry_after, .. }) => assert_eq!(retry_after.unwrap().as_secs(), 1),
///     other => panic!("expected a rejection, got {other:?}"),
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The queue has no room for this cost (oldest-first order): retry later or raise the
    /// queue limit.
    #[error("the wait queue is full: {queued} of {limit} permits are waiting and {cost} more were asked")]
    QueueFull {
        /// The cost asked for.
        cost: u64,
        /// Permits already waiting.
        queued: u64,
        /// The queue limit.
        limit: u64,
    },
    /// No capacity within the timeout: it ran out, or the limit's retry-after lies beyond it
    /// (then `retry_after` says when the cost could be admitted, if nothing else consumes).
    #[error("cost {cost} could not be admitted within {timeout:?}")]
    TimedOut {
        /// The cost asked for.
        cost: u64,
        /// The longest wait allowed.
        timeout: Duration,
        /// When the limit could admit the cost, when known.
        retry_after: Option<Duration>,
    },
    /// Rejected from a full newest-first queue to make room for a newer request.
    #[error("evicted from the wait queue to make room for a newer request")]
    Evicted,
    /// The cost can never be admitted: it exceeds the capacity.
    #[error("cost {cost} exceeds the capacity {capacity}; it can never be admitted")]
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The capacity of the limit.
        capacity: u64,
    },
}

/// A limit and its queue (or, for a keyed limiter, one key's limit and queue).
pub(crate) trait Host: Sync {
    /// What a granted acquire hands back.
    type Grant;

    fn policy(&self) -> &WaitPolicy;

    /// Asks the limit for `cost` now.
    fn take(&self, cost: u64) -> Take<Self::Grant>;

    /// The capacity of the limit now, if known: a cost above it never waits.
    fn capacity(&self) -> Option<u64>;

    /// Whether nobody waits, read without the lock (a hint: an arrival that sees an empty
    /// queue asks the limit directly).
    fn no_waiters(&self) -> bool;

    /// Runs `f` on the queue under its lock.
    fn with_queue<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R;
}

/// The first move of an acquire: granted at once, or a place in the queue.
pub(crate) enum Arrival<G> {
    Granted(G),
    Queued(u64),
}

fn timed_out(cost: u64, timeout: Duration, retry_after_ns: Option<u64>) -> WaitError {
    WaitError::TimedOut {
        cost,
        timeout,
        retry_after: retry_after_ns.map(Duration::from_nanos),
    }
}

fn never(cost: u64, capacity: u64) -> WaitError {
    WaitError::CostExceedsCapacity { cost, capacity }
}

/// Asks the limit directly if nobody is ahead (anybody, for newest-first), else joins the
/// queue; a request that may not wait is rejected instead of queued.
#[inline]
pub(crate) fn arrive<H: Host>(
    host: &H,
    cost: u64,
    timeout: Option<Duration>,
) -> Result<Arrival<H::Grant>, WaitError> {
    let mut asked = None;
    if host.policy().order == QueueOrder::NewestFirst || host.no_waiters() {
        match host.take(cost) {
            Take::Granted(grant) => return Ok(Arrival::Granted(grant)),
            Take::Never { capacity } => return Err(never(cost, capacity)),
            Take::Retry(retry) => asked = Some(retry),
        }
    }
    join(host, cost, timeout, asked)
}

/// The rest of an arrival: a place in the queue (or an answer at once if the queue turns out
/// empty). `asked` is the limit's answer if it was asked already.
#[inline(never)]
fn join<H: Host>(
    host: &H,
    cost: u64,
    timeout: Option<Duration>,
    mut asked: Option<Option<u64>>,
) -> Result<Arrival<H::Grant>, WaitError> {
    let policy = *host.policy();
    if let Some(capacity) = host.capacity().filter(|&capacity| cost > capacity) {
        return Err(never(cost, capacity));
    }
    host.with_queue(|queue| {
        if asked.is_none() && queue.is_empty() {
            match host.take(cost) {
                Take::Granted(grant) => return Ok(Arrival::Granted(grant)),
                Take::Never { capacity } => return Err(never(cost, capacity)),
                Take::Retry(retry) => asked = Some(retry),
            }
        }
        if timeout == Some(Duration::ZERO) {
            return Err(timed_out(cost, Duration::ZERO, asked.flatten()));
        }
        queue
            .join(cost, policy.order, policy.queue_limit)
            .map(Arrival::Queued)
    })
}

/// A place in a queue; leaving it (on drop) wakes the next head if this was the head.
pub(crate) struct Ticket<'a, H: Host> {
    host: &'a H,
    id: u64,
    cost: u64,
    done: bool,
}

impl<'a, H: Host> Ticket<'a, H> {
    pub(crate) fn new(host: &'a H, id: u64, cost: u64) -> Self {
        Self {
            host,
            id,
            cost,
            done: false,
        }
    }

    pub(crate) fn step(&mut self, wake: impl FnOnce() -> Wake) -> Step<H::Grant> {
        let (host, id, cost) = (self.host, self.id, self.cost);
        let order = host.policy().order;
        let step = host.with_queue(|queue| queue.step(id, cost, order, wake, |cost| host.take(cost)));
        // Granted, evicted or refused: already out of the queue.
        self.done = matches!(step, Step::Granted(_) | Step::Evicted | Step::Never { .. });
        step
    }
}

impl<H: Host> Drop for Ticket<'_, H> {
    fn drop(&mut self) {
        if !self.done {
            let order = self.host.policy().order;
            self.host.with_queue(|queue| queue.leave(self.id, order));
        }
    }
}

/// The blocking acquire: the thread parks while it waits (the head until its retry-after).
#[inline]
pub(crate) fn acquire_blocking<H: Host>(
    host: &H,
    cost: u64,
    timeout: Option<Duration>,
) -> Result<H::Grant, WaitError> {
    match arrive(host, cost, timeout)? {
        Arrival::Granted(grant) => Ok(grant),
        Arrival::Queued(id) => wait_blocking(Ticket::new(host, id, cost), timeout),
    }
}

/// Waits in the queue, parked, until granted, evicted or timed out.
#[inline(never)]
fn wait_blocking<H: Host>(
    mut ticket: Ticket<'_, H>,
    timeout: Option<Duration>,
) -> Result<H::Grant, WaitError> {
    let cost = ticket.cost;
    // A timeout too large to represent waits for ever.
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let waited = timeout.unwrap_or(Duration::MAX);
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(timed_out(cost, waited, None));
        }
        match ticket.step(|| Wake::Thread(thread::current())) {
            Step::Granted(grant) => return Ok(grant),
            Step::Evicted => return Err(WaitError::Evicted),
            Step::Never { capacity } => return Err(never(cost, capacity)),
            Step::Wait => match deadline {
                Some(d) => thread::park_timeout(d - now),
                None => thread::park(),
            },
            Step::Sleep(ns) => {
                let nap = Duration::from_nanos(ns);
                if deadline.is_some_and(|d| now.checked_add(nap).is_none_or(|wake| wake > d)) {
                    return Err(timed_out(cost, waited, Some(ns)));
                }
                thread::park_timeout(nap);
            }
        }
    }
}
