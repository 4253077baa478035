//! Hybrid mode: three hosts admitting locally and syncing through a real `redis-server` stay
//! within the documented over-admission bound.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice::{FixedWindow, Quota, TokenBucket};
use sluice_redis::{HybridLimiter, RedisAlgorithm, RedisLimiter, RedisOptions, RedisStore};
use support::RedisServer;

const HOSTS: u64 = 3;

struct Run {
    admitted: u64,
    elapsed: Duration,
    syncs_per_host: u64,
    /// Each admission's span: Unix time in µs (Redis' clock, `TIME`, on this machine) just
    /// before the check and just after it.
    spans: Vec<(u64, u64)>,
}

/// Unix time in microseconds, as Redis' `TIME` reads it on this machine.
fn unix_micros() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since.as_micros()).expect("µs fit")
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
    let spans = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..24 {
        let limiter = hosts[caller % HOSTS as usize].clone();
        let (admitted, spans) = (Arc::clone(&admitted), Arc::clone(&spans));
        tasks.spawn(async move {
            while started.elapsed() < run_for {
                let before = unix_micros();
                if limiter.check_n("shared", 1).await.expect("check").is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                    let span = (before, unix_micros());
                    spans.lock().unwrap().push(span);
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
        spans: std::mem::take(&mut *spans.lock().unwrap()),
    }
}

/// Every host must have synced at least three times in four intervals: the bounds hold only
/// if the syncs kept pace (a stalled sync would otherwise pass for a tight bound).
fn kept_pace(run: &Run, interval: Duration) {
    let expected_syncs = run.elapsed.as_secs_f64() / interval.as_secs_f64();
    assert!(
        run.syncs_per_host as f64 >= 0.75 * expected_syncs,
        "{} syncs per host in {:?} at an interval of {interval:?}",
        run.syncs_per_host,
        run.elapsed
    );
}

/// What one host may admit locally between two syncs: `ceil(rate × interval)`.
fn per_interval(quota: Quota, interval: Duration) -> u64 {
    let units = (interval.as_nanos() * u128::from(quota.count())).div_ceil(u128::from(quota.period_nanos()));
    u64::try_from(units).unwrap()
}

/// The floor: with every host asking all the time, at most `hosts × ceil(rate × interval)`
/// below what the strict limit admits (`floor`: room that appeared after each host's last
/// sync, unseen when the run ends).
fn above_floor(run: &Run, quota: Quota, interval: Duration, floor: u64) {
    let slack = HOSTS * per_interval(quota, interval);
    assert!(
        run.admitted + slack >= floor,
        "admitted {} below the strict floor {floor} less one interval per host ({slack})",
        run.admitted
    );
}

/// The bucket's promise (`hybrid.rs`): only local admissions are unknown to Redis, at most
/// `ceil(rate × interval)` per host between two syncs, and the excess is a debt in Redis, so
/// over the run the hosts admit at most `hosts × ceil(rate × interval)` more than the strict
/// limit (`strict`); and no more than that below `floor`.
fn within_bucket_bound(run: &Run, quota: Quota, interval: Duration, strict: f64, floor: u64) {
    kept_pace(run, interval);
    let bound = (HOSTS * per_interval(quota, interval)) as f64;
    let over = run.admitted as f64 - strict;
    println!(
        "admitted {} in {:?} with {} syncs per host: strict at most {strict:.0}, at least {floor}, over-admission {over:.0}, bound {bound:.0}",
        run.admitted, run.elapsed, run.syncs_per_host
    );
    assert!(
        over <= bound,
        "over-admission {over:.0} above the bound {bound:.0}"
    );
    above_floor(run, quota, interval, floor);
}

/// The fixed window's promise (`hybrid.rs`): only local admissions are unknown to Redis, at
/// most `ceil(rate × interval)` per host between two syncs, and a fixed window forgets its
/// count when it ends, so the bound holds per window: in each of Redis' windows the hosts
/// admit at most the capacity plus `hosts × ceil(rate × interval)`. Redis' windows are on
/// Unix time, which this machine's clock reads too, so each admission counts in the window
/// its span (from before its check to after it) lies in; one whose span crosses a window's end
/// belongs to one of the two, unknown which, and counts in neither (they must be few).
fn within_window_bound(run: &Run, quota: Quota, interval: Duration, floor: u64) {
    kept_pace(run, interval);
    let window = quota.fill_time_nanos() / 1000;
    let bound = quota.capacity() + HOSTS * per_interval(quota, interval);
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    let mut crossing = 0;
    for &(before, after) in &run.spans {
        if before / window == after / window {
            *per_window.entry(before / window).or_default() += 1;
        } else {
            crossing += 1;
        }
    }
    println!(
        "admitted {} in {:?} with {} syncs per host, by window {:?} ({crossing} across a window's end), bound {bound} a window",
        run.admitted,
        run.elapsed,
        run.syncs_per_host,
        per_window.values().collect::<Vec<_>>()
    );
    for (index, admitted) in &per_window {
        assert!(
            *admitted <= bound,
            "{admitted} admitted in the window starting at {} us, at most {bound}: {per_window:?}",
            index * window
        );
    }
    assert!(
        crossing <= run.admitted / 50,
        "{crossing} of {} admissions across a window's end",
        run.admitted
    );
    above_floor(run, quota, interval, floor);
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
    let floor = quota.capacity() + 400 * 3 / 2;
    within_bucket_bound(&run, quota, Duration::from_millis(50), strict, floor);
}

/// 40 in each 100 ms window, syncs every 20 ms: at most 40 + 3 × ceil(400/s × 20 ms) = 64 a
/// window, 1.6 times the capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hybrid_fixed_window_admits_at_most_a_capacity_and_an_interval_per_host_in_each_window() {
    let server = RedisServer::start();
    let quota: Quota = "40/100ms".parse().expect("quota");
    let run = hammer(
        FixedWindow,
        &server.url(),
        quota,
        Duration::from_millis(20),
        Duration::from_millis(1500),
    )
    .await;
    // The first and last windows may be cut short by the run; every other one fills.
    let whole = 1500 / 100 - 1;
    within_window_bound(&run, quota, Duration::from_millis(20), whole * quota.capacity());
}
