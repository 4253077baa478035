//! Waiting for capacity: queue order, eviction, cancellation, timeouts, queue limits, on the
//! direct, keyed and concurrency limiters, async (tokio, mostly with paused time and
//! `TokioClock`, so waits are simulated and deterministic) and blocking (real threads).
#![cfg(feature = "wait")]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use sluice::{
    KeyedLimiter, Quota, RateLimiter, TokenBucket, TokioClock, WaitError, WaitPolicy, WaitingConcurrency,
    WaitingKeyed, WaitingLimiter,
};
use tokio::task::yield_now;
use tokio::time::Instant;

fn bucket(quota: &str) -> RateLimiter<TokenBucket, TokioClock> {
    RateLimiter::with_clock(TokenBucket, quota.parse().unwrap(), TokioClock::new()).unwrap()
}

/// Polls a future once, as an executor would on its first turn.
fn poll_once<F: Future + ?Sized>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

#[tokio::test(start_paused = true)]
async fn oldest_first_grants_in_arrival_order_and_a_large_request_is_not_starved() {
    let waiting = Arc::new(WaitingLimiter::new(bucket("10/s burst 5"), WaitPolicy::wait()));
    let _ = waiting.acquire(5).await.unwrap(); // empty
    let start = Instant::now();
    let costs = [1u64, 5, 1, 1, 4, 1, 2, 5, 1, 3];
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, &cost) in costs.iter().enumerate() {
        let (waiting, granted) = (Arc::clone(&waiting), Arc::clone(&granted));
        tasks.push(tokio::spawn(async move {
            let _ = waiting.acquire(cost).await.unwrap();
            granted.lock().unwrap().push((i, Instant::now()));
        }));
        yield_now().await; // it joins the queue before the next arrives
    }
    assert_eq!(waiting.waiters(), costs.len());
    assert_eq!(waiting.queued(), costs.iter().sum::<u64>());
    for task in tasks {
        task.await.unwrap();
    }
    let granted = granted.lock().unwrap();
    let order: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, (0..costs.len()).collect::<Vec<_>>());
    // Never before the bucket could pay for everything up to and including each request, and
    // (simulated time) with no idle gap beyond the timer's 1 ms resolution per grant.
    let mut paid = 0;
    for (&(i, at), n) in granted.iter().zip(1u64..) {
        paid += costs[i];
        let due = Duration::from_millis(100 * paid);
        assert!(
            at - start >= due,
            "request {i} granted at {:?}, before {due:?}",
            at - start
        );
        assert!(
            at - start <= due + Duration::from_millis(n),
            "request {i} idled: {:?}",
            at - start
        );
    }
    assert_eq!(waiting.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn newest_first_serves_the_newest_and_evicts_the_oldest_to_make_room() {
    let policy = WaitPolicy::wait()
        .with_queue_limit(2)
        .with_queue_order(sluice::QueueOrder::NewestFirst);
    let waiting = Arc::new(WaitingLimiter::new(bucket("1/s burst 1"), policy));
    let _ = waiting.acquire(1).await.unwrap(); // empty
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..3 {
        let (waiting, granted) = (Arc::clone(&waiting), Arc::clone(&granted));
        tasks.push(tokio::spawn(async move {
            let result = waiting.acquire(1).await;
            if result.is_ok() {
                granted.lock().unwrap().push(i);
            }
            result
        }));
        yield_now().await;
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    assert_eq!(results[0], Err(WaitError::Evicted));
    assert!(results[1].is_ok() && results[2].is_ok());
    assert_eq!(*granted.lock().unwrap(), [2, 1]);
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_cancelled_waiters_leave_a_direct_limit_exactly_as_before() {
    let waiting = WaitingLimiter::new(
        bucket("100/s burst 100"),
        WaitPolicy::wait().with_queue_limit(u64::MAX),
    );
    let _ = waiting.acquire(60).await.unwrap();
    let before = waiting.limiter().check_n(0).unwrap().remaining();
    assert_eq!(before, 40);
    {
        let mut futures: Vec<_> = (0..10_000u64)
            .map(|i| Box::pin(waiting.acquire(41 + i % 60)))
            .collect();
        for future in &mut futures {
            assert!(poll_once(future.as_mut()).is_pending());
        }
        assert_eq!(waiting.waiters(), 10_000);
        // Cancel the odd ones, then the rest (the head among them).
        let mut i = 0;
        futures.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        assert_eq!(waiting.waiters(), 5_000);
    }
    assert_eq!(waiting.waiters(), 0);
    assert_eq!(waiting.queued(), 0);
    assert_eq!(waiting.limiter().check_n(0).unwrap().remaining(), before);
    // The capacity is there for the next request, at once.
    assert!(waiting.acquire_blocking_within(40, Duration::ZERO).is_ok());
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_cancelled_waiters_leave_concurrency_permits_exactly_as_before() {
    let limiter = WaitingConcurrency::new(10, WaitPolicy::wait().with_queue_limit(u64::MAX));
    let _held = limiter.acquire(7).await.unwrap();
    {
        let mut futures: Vec<_> = (0..10_000u64)
            .map(|i| Box::pin(limiter.acquire(4 + i % 7)))
            .collect();
        for future in &mut futures {
            assert!(poll_once(future.as_mut()).is_pending());
        }
        assert_eq!(limiter.waiters(), 10_000);
    }
    assert_eq!(limiter.waiters(), 0);
    assert_eq!(limiter.available(), 3);
    assert_eq!(
        limiter
            .acquire_blocking_within(3, Duration::ZERO)
            .unwrap()
            .permits(),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn ten_thousand_cancelled_waiters_leave_no_keyed_queue_and_every_key_as_before() {
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, "10/s".parse().unwrap())
        .unknown_key_quota("10/s".parse().unwrap())
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let waiting = WaitingKeyed::new(limiter, WaitPolicy::wait().with_queue_limit(u64::MAX));
    for key in 0..100u64 {
        let _ = waiting.acquire(&key, 10 - key % 10).await.unwrap();
    }
    let remaining = |w: &WaitingKeyed<u64, TokenBucket, _, TokioClock>| -> Vec<u64> {
        (0..100u64)
            .map(|k| w.limiter().check_n(&k, 0).unwrap().remaining())
            .collect()
    };
    let before = remaining(&waiting);
    {
        let keys: Vec<u64> = (0..10_000u64).map(|i| i % 100).collect();
        let mut futures: Vec<_> = keys
            .iter()
            .map(|key| Box::pin(waiting.acquire_within(key, 10, Duration::from_secs(60))))
            .collect();
        for future in &mut futures {
            assert!(poll_once(future.as_mut()).is_pending());
        }
        assert_eq!(waiting.waiters(), 10_000);
        assert_eq!(waiting.queued_keys(), 100);
    }
    assert_eq!(waiting.waiters(), 0);
    assert_eq!(waiting.queued_keys(), 0);
    assert_eq!(remaining(&waiting), before);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_head_passes_its_turn_on() {
    let waiting = Arc::new(WaitingLimiter::new(bucket("1/s burst 1"), WaitPolicy::wait()));
    let _ = waiting.acquire(1).await.unwrap();
    let mut head = Box::pin(waiting.acquire(1));
    assert!(poll_once(head.as_mut()).is_pending());
    let next = {
        let waiting = Arc::clone(&waiting);
        tokio::spawn(async move { waiting.acquire(1).await })
    };
    yield_now().await;
    assert_eq!(waiting.waiters(), 2);
    drop(head);
    assert!(next.await.unwrap().is_ok());
    assert_eq!(waiting.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_would_exceed_the_timeout_is_rejected_at_once() {
    let waiting = WaitingLimiter::new(bucket("1/min"), WaitPolicy::wait());
    let _ = waiting.acquire(1).await.unwrap();
    let start = Instant::now();
    let result = waiting.acquire_within(1, Duration::from_millis(100)).await;
    match result {
        Err(WaitError::TimedOut {
            cost: 1,
            timeout,
            retry_after: Some(retry),
        }) => {
            assert_eq!(timeout, Duration::from_millis(100));
            assert_eq!(retry, Duration::from_secs(60));
        }
        other => panic!("expected a timeout with a retry-after, got {other:?}"),
    }
    assert_eq!(Instant::now(), start, "no simulated time should pass");
    assert_eq!(waiting.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_behind_the_head_times_out_on_its_own_deadline() {
    let waiting = Arc::new(WaitingLimiter::new(bucket("1/s burst 1"), WaitPolicy::wait()));
    let _ = waiting.acquire(1).await.unwrap();
    let head = {
        let waiting = Arc::clone(&waiting);
        tokio::spawn(async move { waiting.acquire(1).await })
    };
    yield_now().await;
    let start = Instant::now();
    let late = waiting.acquire_within(1, Duration::from_millis(300)).await;
    assert!(
        matches!(
            late,
            Err(WaitError::TimedOut {
                retry_after: None,
                ..
            })
        ),
        "{late:?}"
    );
    let waited = Instant::now() - start;
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
    assert_eq!(waiting.waiters(), 1);
    assert!(head.await.unwrap().is_ok());
    assert_eq!(waiting.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_queue_limit_counts_permits() {
    let policy = WaitPolicy::wait().with_queue_limit(3);
    let waiting = Arc::new(WaitingLimiter::new(bucket("1/s burst 2"), policy));
    let _ = waiting.acquire(2).await.unwrap();
    let first = {
        let waiting = Arc::clone(&waiting);
        tokio::spawn(async move { waiting.acquire(2).await })
    };
    yield_now().await;
    assert_eq!(
        waiting.acquire(2).await,
        Err(WaitError::QueueFull {
            cost: 2,
            queued: 2,
            limit: 3
        })
    );
    assert_eq!(
        waiting.acquire(3).await,
        Err(WaitError::CostExceedsCapacity { cost: 3, capacity: 2 })
    );
    let second = {
        let waiting = Arc::clone(&waiting);
        tokio::spawn(async move { waiting.acquire(1).await })
    };
    yield_now().await;
    assert_eq!(waiting.queued(), 3);
    assert!(first.await.unwrap().is_ok());
    assert!(second.await.unwrap().is_ok());
}

#[tokio::test(start_paused = true)]
async fn reject_policy_answers_at_once_with_the_retry_after() {
    let waiting = WaitingLimiter::new(bucket("1/s"), WaitPolicy::reject());
    assert!(waiting.acquire(1).await.is_ok());
    assert_eq!(
        waiting.acquire(1).await,
        Err(WaitError::TimedOut {
            cost: 1,
            timeout: Duration::ZERO,
            retry_after: Some(Duration::from_secs(1))
        })
    );
    let deny_all = WaitingLimiter::new(
        RateLimiter::with_clock(TokenBucket, Quota::deny_all(), TokioClock::new()).unwrap(),
        WaitPolicy::wait(),
    );
    assert_eq!(
        deny_all.acquire(1).await,
        Err(WaitError::CostExceedsCapacity { cost: 1, capacity: 0 })
    );
}

#[tokio::test(start_paused = true)]
async fn concurrency_waiters_are_served_oldest_first_without_barging() {
    let limiter = WaitingConcurrency::new(4, WaitPolicy::wait());
    let mut held: Vec<_> = Vec::new();
    for _ in 0..4 {
        held.push(limiter.acquire(1).await.unwrap());
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |name: &'static str, permits: u64| {
        let (limiter, order) = (limiter.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let permit = limiter.acquire(permits).await.unwrap();
            order.lock().unwrap().push(name);
            tokio::time::sleep(Duration::from_millis(10)).await;
            drop(permit);
        })
    };
    let big = spawn("big", 4);
    yield_now().await;
    let small = spawn("small", 1);
    yield_now().await;
    held.pop();
    for _ in 0..10 {
        yield_now().await;
    }
    // One permit is free, but the big request is ahead: the small one must not take it.
    assert!(order.lock().unwrap().is_empty());
    assert_eq!(limiter.available(), 1);
    held.clear();
    big.await.unwrap();
    small.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["big", "small"]);
    assert_eq!(limiter.available(), 4);
}

#[tokio::test(start_paused = true)]
async fn keyed_queues_are_per_key_and_vanish_when_empty() {
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse().unwrap())
        .unknown_key_quota("1/s".parse().unwrap())
        .clock(TokioClock::new())
        .build()
        .unwrap();
    let waiting = Arc::new(WaitingKeyed::new(limiter, WaitPolicy::wait()));
    let _ = waiting.acquire("a", 1).await.unwrap();
    let start = Instant::now();
    let queued = {
        let waiting = Arc::clone(&waiting);
        tokio::spawn(async move { waiting.acquire("a", 1).await })
    };
    yield_now().await;
    assert_eq!(waiting.queued_keys(), 1);
    // Another key is not held up by a's queue.
    let _ = waiting.acquire("b", 1).await.unwrap();
    assert_eq!(Instant::now(), start);
    assert!(queued.await.unwrap().is_ok());
    assert!(Instant::now() - start >= Duration::from_secs(1));
    assert_eq!(waiting.queued_keys(), 0);
    assert_eq!(waiting.waiters(), 0);
}

// Blocking waits: real threads, real clock, tolerant bounds only.

#[test]
fn blocking_waiters_are_granted_in_arrival_order() {
    let limiter = RateLimiter::new(TokenBucket, "50/s burst 1".parse().unwrap()).unwrap();
    let waiting = Arc::new(WaitingLimiter::new(limiter, WaitPolicy::wait()));
    let _ = waiting.acquire_blocking(1).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 0..5 {
        let (w, granted) = (Arc::clone(&waiting), Arc::clone(&order));
        threads.push(thread::spawn(move || {
            let _ = w.acquire_blocking(1).unwrap();
            granted.lock().unwrap().push(i);
        }));
        // The next arrives only once this one waits (or was already granted).
        while waiting.waiters() + order.lock().unwrap().len() < i + 1 {
            thread::yield_now();
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
}

#[test]
fn a_blocking_wait_is_granted_after_the_retry_after() {
    let limiter = RateLimiter::new(TokenBucket, "2/s burst 1".parse().unwrap()).unwrap();
    let waiting = WaitingLimiter::new(limiter, WaitPolicy::wait());
    let start = std::time::Instant::now();
    let _ = waiting.acquire_blocking(1).unwrap();
    let _ = waiting
        .acquire_blocking_within(1, Duration::from_secs(30))
        .unwrap();
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn blocking_timeouts_return() {
    let limiter = WaitingConcurrency::new(1, WaitPolicy::wait());
    let held = limiter.acquire_blocking(1).unwrap();
    let start = std::time::Instant::now();
    let result = limiter.acquire_blocking_within(1, Duration::from_millis(50));
    let waited = start.elapsed();
    assert!(matches!(result, Err(WaitError::TimedOut { .. })), "{result:?}");
    assert!(waited >= Duration::from_millis(50), "{waited:?}");
    assert!(waited < Duration::from_secs(30), "{waited:?}");
    assert_eq!(limiter.waiters(), 0);
    drop(held);
    assert_eq!(limiter.available(), 1);
}

#[test]
fn a_released_permit_wakes_a_blocked_thread() {
    let limiter = WaitingConcurrency::new(2, WaitPolicy::wait());
    let held = limiter.acquire_blocking(2).unwrap();
    let waiter = {
        let limiter = limiter.clone();
        thread::spawn(move || limiter.acquire_blocking(2).map(|p| p.permits()))
    };
    while limiter.waiters() == 0 {
        thread::yield_now();
    }
    drop(held);
    assert_eq!(waiter.join().unwrap(), Ok(2));
    assert_eq!(limiter.available(), 2);
}

// Many threads and tasks at once: no lost wake-up (every waiter is granted well within a
// generous timeout) and never more permits out than exist.

#[test]
fn eight_threads_share_concurrency_permits_without_lost_wakeups() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let limiter = WaitingConcurrency::new(4, WaitPolicy::wait().with_queue_limit(u64::MAX));
    let in_use = AtomicU64::new(0);
    let peak = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..8u64 {
            let (limiter, in_use, peak) = (&limiter, &in_use, &peak);
            s.spawn(move || {
                for i in 0..300u64 {
                    let permits = 1 + (t + i) % 3;
                    let permit = limiter
                        .acquire_blocking_within(permits, Duration::from_secs(60))
                        .unwrap();
                    let now = in_use.fetch_add(permits, Ordering::SeqCst) + permits;
                    peak.fetch_max(now, Ordering::SeqCst);
                    if i % 7 == 0 {
                        thread::yield_now();
                    }
                    in_use.fetch_sub(permits, Ordering::SeqCst);
                    drop(permit);
                }
            });
        }
    });
    assert!(peak.load(Ordering::SeqCst) <= 4);
    assert_eq!(limiter.available(), 4);
    assert_eq!(limiter.waiters(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_two_workers_are_all_granted_by_a_rate_limit() {
    let limiter = RateLimiter::new(TokenBucket, "5000/s burst 5".parse().unwrap()).unwrap();
    let waiting = Arc::new(WaitingLimiter::new(
        limiter,
        WaitPolicy::wait().with_queue_limit(u64::MAX),
    ));
    let tasks: Vec<_> = (0..500u64)
        .map(|i| {
            let waiting = Arc::clone(&waiting);
            tokio::spawn(async move { waiting.acquire_within(1 + i % 3, Duration::from_secs(60)).await })
        })
        .collect();
    for task in tasks {
        assert!(task.await.unwrap().is_ok());
    }
    assert_eq!(waiting.waiters(), 0);
    assert_eq!(waiting.queued(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tasks_on_two_workers_share_concurrency_permits() {
    let limiter = WaitingConcurrency::new(3, WaitPolicy::wait().with_queue_limit(u64::MAX));
    let tasks: Vec<_> = (0..400u64)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let permit = limiter.acquire_within(1 + i % 3, Duration::from_secs(60)).await?;
                yield_now().await;
                drop(permit);
                Ok::<_, WaitError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(limiter.available(), 3);
    assert_eq!(limiter.waiters(), 0);
}
