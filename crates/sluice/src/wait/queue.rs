//! The wait queue of one limit, and the step every waiter takes under its lock.
//!
//! Waiters are kept in arrival order (ids increase); the head is the oldest or the newest,
//! by the queue order. Only the head asks the limit; the others sleep until woken, which
//! happens when the head leaves (granted, cancelled, timed out). The head itself sleeps
//! until the retry-after the limit computed, inside its own future or thread: no timer task.

use std::collections::BTreeMap;
use std::task::Waker;
use std::thread::Thread;

use super::{QueueOrder, WaitError};

/// How to wake one waiter.
pub(crate) enum Wake {
    #[cfg_attr(not(feature = "wait"), allow(dead_code))]
    Task(Waker),
    Thread(Thread),
}

impl Wake {
    fn wake(self) {
        match self {
            Self::Task(waker) => waker.wake(),
            Self::Thread(thread) => thread.unpark(),
        }
    }
}

struct Waiter {
    cost: u64,
    wake: Option<Wake>,
}

/// The waiters of one limit.
#[derive(Default)]
pub(crate) struct Queue {
    waiters: BTreeMap<u64, Waiter>,
    /// Permits (units of cost) asked for by all waiters.
    queued: u64,
    next_id: u64,
}

/// What a limit answers when the head asks for its cost.
pub(crate) enum Take<G> {
    Granted(G),
    /// Denied: try again after this many ns (`None`: when woken, as permits come back).
    Retry(Option<u64>),
    /// The cost exceeds the capacity.
    Never {
        capacity: u64,
    },
}

/// What a waiter does next.
pub(crate) enum Step<G> {
    Granted(G),
    /// Not the head (or waiting for released permits): sleep until woken.
    Wait,
    /// The head, denied: sleep this many ns, then step again.
    Sleep(u64),
    Evicted,
    Never {
        capacity: u64,
    },
}

impl Queue {
    pub(crate) fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.waiters.len()
    }

    pub(crate) fn queued(&self) -> u64 {
        self.queued
    }

    fn head(&self, order: QueueOrder) -> Option<u64> {
        match order {
            QueueOrder::OldestFirst => self.waiters.first_key_value(),
            QueueOrder::NewestFirst => self.waiters.last_key_value(),
        }
        .map(|(&id, _)| id)
    }

    pub(crate) fn wake_head(&mut self, order: QueueOrder) {
        let head = self.head(order).and_then(|id| self.waiters.get_mut(&id));
        if let Some(wake) = head.and_then(|w| w.wake.take()) {
            wake.wake();
        }
    }

    /// Adds a waiter of `cost`, within `limit` queued permits. Oldest-first rejects a newcomer
    /// that does not fit; newest-first evicts the oldest waiters until it fits.
    pub(crate) fn join(&mut self, cost: u64, order: QueueOrder, limit: u64) -> Result<u64, WaitError> {
        let full = |q: &Self| WaitError::QueueFull {
            cost,
            queued: q.queued,
            limit,
        };
        if cost > limit {
            return Err(full(self));
        }
        while self.queued + cost > limit {
            if order == QueueOrder::OldestFirst {
                return Err(full(self));
            }
            let Some((_, oldest)) = self.waiters.pop_first() else {
                break;
            };
            self.queued -= oldest.cost;
            if let Some(wake) = oldest.wake {
                wake.wake();
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiters.insert(id, Waiter { cost, wake: None });
        self.queued += cost;
        Ok(id)
    }

    /// Removes a waiter (granted, cancelled, timed out); wakes the next head if it was the head.
    pub(crate) fn leave(&mut self, id: u64, order: QueueOrder) {
        let was_head = self.head(order) == Some(id);
        if let Some(waiter) = self.waiters.remove(&id) {
            self.queued -= waiter.cost;
            if was_head {
                self.wake_head(order);
            }
        }
    }

    /// One step of waiter `id`: if it is the head, ask the limit (`take`); otherwise leave
    /// `wake` to be woken by.
    pub(crate) fn step<G>(
        &mut self,
        id: u64,
        cost: u64,
        order: QueueOrder,
        wake: impl FnOnce() -> Wake,
        take: impl FnOnce(u64) -> Take<G>,
    ) -> Step<G> {
        let is_head = self.head(order) == Some(id);
        let Some(waiter) = self.waiters.get_mut(&id) else {
            return Step::Evicted;
        };
        // Kept even by a sleeping head, so an eviction reaches it at once.
        waiter.wake = Some(wake());
        if !is_head {
            return Step::Wait;
        }
        match take(cost) {
            Take::Granted(grant) => {
                self.leave(id, order);
                Step::Granted(grant)
            }
            Take::Retry(Some(ns)) => Step::Sleep(ns),
            Take::Retry(None) => Step::Wait,
            Take::Never { capacity } => {
                self.leave(id, order);
                Step::Never { capacity }
            }
        }
    }
}

/// A queue behind a mutex, with its length mirrored in an atomic so the fast path can see
/// "nobody waits" without taking the lock.
#[derive(Default)]
pub(crate) struct CountedQueue {
    queue: std::sync::Mutex<Queue>,
    waiters: std::sync::atomic::AtomicUsize,
}

impl CountedQueue {
    /// Waiters queued now.
    pub(crate) fn waiters(&self) -> usize {
        self.waiters.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[inline]
    pub(crate) fn no_waiters(&self) -> bool {
        self.waiters() == 0
    }

    /// Runs `f` on the queue under its lock, then publishes its length.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Queue) -> R) -> R {
        let mut queue = crate::sync::lock(&self.queue);
        let result = f(&mut queue);
        self.waiters
            .store(queue.len(), std::sync::atomic::Ordering::SeqCst);
        result
    }
}
