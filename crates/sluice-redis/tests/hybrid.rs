//! Hybrid mode: three hosts admitting locally and syncing through a real `redis-server` stay
//! within the documented over-admission bound.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice::{FixedWindow, Quota, TokenBucket};
use sluice_redis::{HybridLimiter, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore};
use support::RedisServer;

const HOSTS: u64 = 3;

struct Run {
    admitted: u64,
    elapsed: Duration,
    syncs_per_host: u64,
}

async fn hammer<A: RedisAlgorithm>(
    algorithm: A,
    url: &str,
    quota: Quota,
    interval: Duration,
    run_for: Duration,
) -> Run {
    let mut hosts = Vec::new();
    for _ in 0..HOSTS {
        let store = RedisStore::connect(url, RedisOptions::default())
            .await
            .expect("connect");
        let strict = RedisLimiter::builder(algorithm.clone(), quota)
            .unknown_key_quota(quota)
            .hosts(HOSTS)
            .build(store)
            .expect("limiter");
        hosts.push(HybridLimiter::new(strict, interval));
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..24 {
        let limiter = hosts[caller % HOSTS as usize].clone();
        let admitted = Arc::clone(&admitted);
        tasks.spawn(async move {
            while started.elapsed() < run_for {
                if limiter.check_n("shared", 1).await.expect("check").is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                // Callers with a little work between requests, as servers have.
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("caller panicked");
    }
    let elapsed = started.elapsed();
    let syncs: u64 = hosts.iter().map(|h| h.metrics().syncs).sum();
    for h in &hosts {
        assert!(h.metrics().local_allowed > 0, "{:?}", h.metrics());
    }
    Run {
        admitted: admitted.load(Ordering::Relaxed),
        elapsed,
        syncs_per_host: syncs / HOSTS,
    }
}

/// Checks a run against what the design promises, with the configured sync interval:
/// - over: at most `periods × hosts × ceil(rate × interval)` above what the strict limit admits
///   over the run (`periods` is 1 for a bucket, whose excess is a debt, and the number of windows
///   touched for a fixed window, each of which forgets its debt);
/// - under: with every host asking all the time, at most `hosts × ceil(rate × interval)` below
///   it (`floor`: room that appeared after each host's last sync, unseen when the run ends).
///
/// Both hold only if the syncs kept pace: every host must have synced at least three times in
/// four intervals (a stalled sync would otherwise pass for a tight bound).
fn within_bound(run: &Run, quota: Quota, interval: Duration, strict: f64, floor: f64, periods: f64) {
    let expected_syncs = run.elapsed.as_secs_f64() / interval.as_secs_f64();
    assert!(
        run.syncs_per_host as f64 >= 0.75 * expected_syncs,
        "{} syncs per host in {:?} at an interval of {interval:?}",
        run.syncs_per_host,
        run.elapsed
    );
    let rate = quota.count() as f64 / quota.period().as_secs_f64();
    let per_interval = HOSTS as f64 * (rate * interval.as_secs_f64()).ceil();
    let bound = periods * per_interval;
    let over = run.admitted as f64 - strict;
    println!(
        "admitted {} in {:?} with {} syncs per host: strict at most {strict:.0}, at least {floor:.0}, over-admission {over:.0}, bound {bound:.0}",
        run.admitted, run.elapsed, run.syncs_per_host
    );
    assert!(
        over <= bound,
        "over-admission {over:.0} above the bound {bound:.0}"
    );
    assert!(
        run.admitted as f64 >= floor - per_interval,
        "admitted {} below the strict floor {floor:.0} less one interval per host ({per_interval:.0})",
        run.admitted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hybrid_token_bucket_stays_within_its_bound() {
    let server = RedisServer::start();
    let quota: Quota = "400/s burst 40".parse().expect("quota");
    let run = hammer(
        TokenBucket,
        &server.url(),
        quota,
        Duration::from_millis(50),
        Duration::from_millis(1500),
    )
    .await;
    let strict = quota.capacity() as f64 + 400.0 * run.elapsed.as_secs_f64();
    // The callers stop asking at 1.5 s; the elapsed time also counts their joining.
    let floor = quota.capacity() as f64 + 400.0 * 1.5;
    within_bound(&run, quota, Duration::from_millis(50), strict, floor, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hybrid_fixed_window_stays_within_its_bound() {
    let server = RedisServer::start();
    // Windows of 100 ms: the strict limit admits 40 per window started during the run.
    let quota: Quota = "40/100ms".parse().expect("quota");
    let run = hammer(
        FixedWindow,
        &server.url(),
        quota,
        Duration::from_millis(20),
        Duration::from_millis(1500),
    )
    .await;
    let windows = (run.elapsed.as_secs_f64() / 0.1).ceil() + 1.0;
    // The first and last windows may be cut short by the run; every other one fills.
    let whole = (1.5f64 / 0.1).floor() - 1.0;
    let capacity = quota.capacity() as f64;
    within_bound(
        &run,
        quota,
        Duration::from_millis(20),
        windows * capacity,
        whole * capacity,
        windows,
    );
}
