//! How each algorithm answers rising load: a driver on a simulated clock.
//!
//! Run with `cargo run --release -p sluice --example algorithms`.
//!
//! Every algorithm gets one limiter of `10/s` (burst 10) on a [`ManualClock`], so the run is
//! exact, reproducible and takes no real time. Each limiter is offered 1, 2, 5, ... 100 requests
//! per second, evenly spaced, for 10 simulated seconds per rate, the phases back to back on the
//! same limiter. Below the limit everything passes; above it every algorithm holds the
//! processed rate near 10/s, and the rows show where they differ (bursts, window boundaries,
//! the sliding counter's estimate, the shaper's queue).

use std::error::Error;
use std::time::Duration;

use sluice::{
    Algorithm, FixedWindow, LeakyBucket, ManualClock, Quota, RateLimiter, SlidingWindowCounter,
    SlidingWindowLog, TokenBucket,
};

/// Offered rates, in requests per second.
const RATES: [u64; 8] = [1, 2, 5, 10, 20, 25, 50, 100];
/// Length of one phase (one offered rate), in simulated seconds.
const PHASE_SECS: u64 = 10;
const NANOS_PER_SEC: u64 = 1_000_000_000;
const PHASE_NS: u64 = PHASE_SECS * NANOS_PER_SEC;

/// What one phase of load did to a limiter.
struct Phase {
    rate: u64,
    offered: u64,
    admitted: u64,
    /// The longest delay given to an admitted request (only a shaper delays).
    max_delay: Duration,
}

/// Offers every rate in turn to one limiter and returns one [`Phase`] per rate.
fn drive<A: Algorithm>(algorithm: A, quota: Quota) -> Result<Vec<Phase>, Box<dyn Error>> {
    let clock = ManualClock::new(0);
    // The limiter reads its own clone of the clock; ours moves time forward.
    let limiter = RateLimiter::with_clock(algorithm, quota, clock.clone())?;
    let mut phases = Vec::with_capacity(RATES.len());
    for (n, rate) in (0u64..).zip(RATES) {
        let start = n * PHASE_NS;
        let interval = NANOS_PER_SEC / rate;
        let offered = PHASE_NS / interval;
        let mut phase = Phase {
            rate,
            offered,
            admitted: 0,
            max_delay: Duration::ZERO,
        };
        for i in 0..offered {
            clock.set(start + i * interval);
            let decision = limiter.check();
            if decision.is_allowed() {
                phase.admitted += 1;
                phase.max_delay = phase.max_delay.max(decision.delay());
            }
        }
        phases.push(phase);
    }
    Ok(phases)
}

fn main() -> Result<(), Box<dyn Error>> {
    let quota: Quota = "10/s burst 10".parse()?;
    let max_delay = Duration::from_secs(1);
    let runs = [
        ("token bucket", drive(TokenBucket, quota)?),
        ("leaky bucket meter", drive(LeakyBucket::meter(), quota)?),
        (
            "leaky bucket shaper",
            drive(LeakyBucket::shaper(max_delay), quota)?,
        ),
        ("fixed window", drive(FixedWindow, quota)?),
        ("sliding window log", drive(SlidingWindowLog, quota)?),
        ("sliding window counter", drive(SlidingWindowCounter, quota)?),
    ];

    println!(
        "Limit {quota} (burst {}); each rate offered for {} simulated s, evenly spaced.\n\
         processed/s = admitted / {} s. The shaper (max delay {max_delay:?}) counts a request \
         as processed when admitted,\nthough it proceeds only after its delay (the longest one given is \"max delay\").\n",
        quota.capacity(),
        PHASE_SECS,
        PHASE_SECS,
    );
    println!(
        "{:<22} {:>10} {:>8} {:>8} {:>12} {:>13}",
        "algorithm", "offered/s", "offered", "admitted", "processed/s", "max delay ms"
    );
    for (name, phases) in &runs {
        for p in phases {
            let processed = p.admitted as f64 / PHASE_SECS as f64;
            println!(
                "{name:<22} {:>10} {:>8} {:>8} {processed:>12.1} {:>13}",
                p.rate,
                p.offered,
                p.admitted,
                p.max_delay.as_millis()
            );
        }
    }
    Ok(())
}
