//! Shaping a burst: 100 requests arrive at once at a `10/s` limit and wait their turn.
//!
//! Run with `cargo run --release -p sluice --example waiting` (simulated time: tokio's clock
//! is paused and jumps to each next timer, so the 9 simulated seconds take milliseconds), or
//! add `-- --real-clock` to watch it happen in real time.
//!
//! The limit is a token bucket of `10/s` with its default burst of 10, wrapped in a
//! [`WaitingLimiter`] that queues oldest-first. The first 10 requests pass at once, then one
//! every 100 ms, in arrival order: the last is granted 9 s after the burst.

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use sluice::{RateLimiter, TokenBucket, TokioClock, WaitPolicy, WaitingLimiter};
use tokio::time::Instant;

const REQUESTS: usize = 100;

fn main() -> Result<(), Box<dyn Error>> {
    let real_clock = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--real-clock") => true,
        Some(other) => {
            return Err(format!("unknown argument {other:?}; the only option is --real-clock").into());
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(!real_clock)
        .build()?;
    let wall = std::time::Instant::now();
    let grants = runtime.block_on(shape())?;
    println!("request  granted at");
    for (i, at) in grants.iter().enumerate() {
        println!("{i:>7}  {:>8.3} s", at.as_secs_f64());
    }
    let last = grants.iter().max().copied().unwrap_or_default();
    let after_burst = grants.iter().filter(|at| **at > Duration::ZERO).count();
    println!(
        "{REQUESTS} requests: {} at once, {after_burst} shaped over {:.3} s ({:.2}/s); {} clock, ran in {:.1} ms",
        REQUESTS - after_burst,
        last.as_secs_f64(),
        after_burst as f64 / last.as_secs_f64().max(f64::MIN_POSITIVE),
        if real_clock { "real" } else { "simulated" },
        wall.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Sends the burst and returns, for each request in arrival order, when it was granted.
async fn shape() -> Result<Vec<Duration>, Box<dyn Error>> {
    let limiter = RateLimiter::with_clock(TokenBucket, "10/s".parse()?, TokioClock::new())?;
    let policy = WaitPolicy::wait().with_queue_limit(REQUESTS as u64);
    let waiting = Arc::new(WaitingLimiter::new(limiter, policy));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let waiting = Arc::clone(&waiting);
        tasks.push(tokio::spawn(async move {
            waiting.acquire(1).await.map(|_| start.elapsed())
        }));
        // Let it arrive (and queue) before the next one.
        tokio::task::yield_now().await;
    }
    let mut grants = Vec::with_capacity(REQUESTS);
    for task in tasks {
        grants.push(task.await??);
    }
    Ok(grants)
}
