//! The cost of waiting: an acquire that finds capacity against a plain check, and how many
//! grants per second a queue of 10 000 waiters hands out.
//!
//! Run with `cargo bench -p sluice --bench waiting`.
//!
//! Groups:
//! - `with_capacity`: the limit always has room (a token bucket of `1e9/s` burst 1 000 000 on
//!   the default clock; a concurrency limiter whose permit is dropped at once). `check` is the
//!   plain limiter call; `acquire_blocking` and `acquire_async` go through the waiting wrapper
//!   (the async one polled once with a no-op waker: on this path it completes on its first poll
//!   and needs no runtime).
//! - `drain_10k`: 10 000 waiters of cost 1 are queued (oldest-first), then capacity appears and
//!   the time until the last is granted is measured (the queue being filled is not). `rate`: a
//!   token bucket of `10000/s burst 10000` on tokio's paused clock, emptied, then the clock
//!   advanced by 1 s so every waiter can pass: each grant is the previous head waking the next.
//!   `concurrency`: one permit, each waiter drops it as soon as granted, which wakes the next.
//!   Both run on a current-thread tokio runtime; throughput is reported in grants per second.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, black_box, criterion_group, criterion_main};
use sluice::{
    ConcurrencyLimiter, Quota, RateLimiter, TokenBucket, TokioClock, WaitPolicy, WaitingConcurrency,
    WaitingLimiter,
};

const ROOMY: &str = "1000000000/s burst 1000000";
const WAITERS: u64 = 10_000;

fn poll_once<F: Future>(future: F) -> Poll<F::Output> {
    pin!(future).poll(&mut Context::from_waker(Waker::noop()))
}

fn with_capacity(c: &mut Criterion) {
    let quota: Quota = ROOMY.parse().expect("valid quota");
    let mut group = c.benchmark_group("with_capacity");
    let plain = RateLimiter::new(TokenBucket, quota).expect("valid quota");
    group.bench_function("rate/check", |b| {
        b.iter(|| black_box(&plain).check().is_allowed())
    });
    let waiting = WaitingLimiter::new(
        RateLimiter::new(TokenBucket, quota).expect("valid quota"),
        WaitPolicy::wait(),
    );
    assert!(waiting.acquire_blocking(1).is_ok());
    group.bench_function("rate/acquire_blocking", |b| {
        b.iter(|| black_box(&waiting).acquire_blocking(1).is_ok())
    });
    assert!(matches!(poll_once(waiting.acquire(1)), Poll::Ready(Ok(_))));
    group.bench_function("rate/acquire_async", |b| {
        b.iter(|| matches!(poll_once(black_box(&waiting).acquire(1)), Poll::Ready(Ok(_))))
    });

    let plain = ConcurrencyLimiter::new(1);
    group.bench_function("concurrency/try_acquire", |b| {
        b.iter(|| black_box(&plain).try_acquire(1).is_ok())
    });
    let waiting = WaitingConcurrency::new(1, WaitPolicy::wait());
    group.bench_function("concurrency/acquire_blocking", |b| {
        b.iter(|| black_box(&waiting).acquire_blocking(1).is_ok())
    });
    group.bench_function("concurrency/acquire_async", |b| {
        b.iter(|| matches!(poll_once(black_box(&waiting).acquire(1)), Poll::Ready(Ok(_))))
    });
    group.finish();
}

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// Queues `WAITERS` waiters on a fresh emptied bucket, then times their drain.
async fn drain_rate() -> Duration {
    let limiter = RateLimiter::with_clock(TokenBucket, "10000/s".parse().expect("valid"), TokioClock::new())
        .expect("valid quota");
    let waiting = Arc::new(WaitingLimiter::new(
        limiter,
        WaitPolicy::wait().with_queue_limit(WAITERS),
    ));
    assert!(waiting.acquire(10_000).await.is_ok());
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let waiting = Arc::clone(&waiting);
            tokio::spawn(async move { waiting.acquire(1).await.is_ok() })
        })
        .collect();
    while (waiting.waiters() as u64) < WAITERS {
        tokio::task::yield_now().await;
    }
    let start = Instant::now();
    tokio::time::advance(Duration::from_secs(1)).await;
    for task in tasks {
        assert!(task.await.expect("task ran"));
    }
    start.elapsed()
}

/// Queues `WAITERS` waiters behind one held permit, then times their drain.
async fn drain_concurrency() -> Duration {
    let limiter = WaitingConcurrency::new(1, WaitPolicy::wait().with_queue_limit(WAITERS));
    let held = limiter.acquire(1).await.expect("a free permit");
    let tasks: Vec<_> = (0..WAITERS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(1).await.is_ok() })
        })
        .collect();
    while (limiter.waiters() as u64) < WAITERS {
        tokio::task::yield_now().await;
    }
    let start = Instant::now();
    drop(held);
    for task in tasks {
        assert!(task.await.expect("task ran"));
    }
    start.elapsed()
}

fn drain_10k(c: &mut Criterion) {
    let mut group = c.benchmark_group("drain_10k");
    group.sample_size(10).throughput(Throughput::Elements(WAITERS));
    group.bench_function("rate", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| paused_runtime().block_on(drain_rate())).sum())
    });
    group.bench_function("concurrency", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| paused_runtime().block_on(drain_concurrency()))
                .sum()
        })
    });
    group.finish();
}

criterion_group!(benches, with_capacity, drain_10k);
criterion_main!(benches);
