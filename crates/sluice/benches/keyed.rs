//! The cost of one check on a keyed limiter, with governor's keyed limiter
//! (`governor::RateLimiter::keyed`, a `DashMap` of GCRA states) as the reference.
//!
//! Run with `cargo bench -p sluice --bench keyed` (add a filter such as `hot_1k` to run one
//! group). Benchmark ids are `group/implementation` (`two_threads/implementation/threads`).
//!
//! Both sides use a token bucket (GCRA) of `1e9/s`, burst 1 000 000, so no check is ever
//! denied: every check is an admitted check that writes its key's state. Every group runs
//! twice: on each side's default real clock (ids `sluice` and `governor`; sluice:
//! `MonotonicClock`, governor: quanta, both reading the TSC here; `direct`'s `clock/*` group
//! compares them), and on each side's manual clock (ids `sluice_manual_clock` and
//! `governor_fake_clock`), which leaves the store's own cost, whatever the clock costs on the
//! machine. In `new_key` the manual clocks advance by 1 µs per check (inside the measurement
//! on both sides), so used buckets are full again as they are on a real clock. Keys are
//! `u64`. Each side keeps its default hasher (sluice: foldhash; governor: std's SipHash
//! `RandomState`); that is part of what is compared.
//!
//! Groups:
//! - `hot_1k`: 1000 keys, cycled in order; all present after the first round.
//! - `random_1m`: 1 000 000 keys, all inserted before measuring, then chosen uniformly at
//!   random by an inline xorshift (the same sequence on both sides). sluice's capacity is
//!   2 000 000: with exactly 1 000 000 the uneven fill of its shards would evict some keys.
//! - `new_key`: a key never seen before on every check. sluice has capacity 100 000, so once
//!   full every check also evicts (here always an idle entry: at `1e9/s` a used bucket is full
//!   again within a microsecond). governor's map grows without bound, so it calls
//!   `retain_recent` every 100 000 checks (dropping every key whose state is back to fresh,
//!   here all of them); the sweep's cost is inside the measurement, spread over those checks,
//!   and keeps its map between 0 and 100 000 keys (sluice's stays at 100 000).
//! - `two_threads`: throughput of 1 thread and of 2 threads, each thread cycling its own 1000
//!   keys (disjoint between threads, all present). Timed with `iter_custom` around a
//!   `std::thread::scope` (spawn and join included, the same on both sides); the time reported
//!   is wall time divided by the total number of checks, so perfect scaling halves it from
//!   `/1` to `/2`. `independent_work` is the machine's own ceiling: each thread runs a loop of
//!   arithmetic on its own registers (about as long as a check), sharing nothing; a VM whose
//!   two vCPUs share a physical core cannot do better for any store.
//! - `two_threads_interleaved`: the same on manual clocks, but every key of thread 1 is
//!   inserted right after the matching key of thread 0, so the two threads' entries sit side by
//!   side in memory and are written in lockstep: the worst case for a dense store, where
//!   writes to neighbouring entries contend for the same cache lines.
//!
//! Before measuring, every case is run 1000 times and asserted to admit.

use std::num::NonZeroU32;
use std::thread;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use governor::clock::{DefaultClock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use sluice::{KeyedLimiter, ManualClock, MonotonicClock, Quota, StaticQuotas, TokenBucket};

/// The limit of every key: never exhausted by a benchmark loop.
const RATE: u32 = 1_000_000_000;
const BURST: u32 = 1_000_000;
const SLUICE_QUOTA: &str = "1000000000/s burst 1000000";

const HOT_KEYS: u64 = 1000;
const RANDOM_KEYS: u64 = 1_000_000;
const NEW_KEY_CAPACITY: usize = 100_000;
/// governor sweeps its map (`retain_recent`) once per this many new keys.
const GOVERNOR_RETAIN_EVERY: u64 = 100_000;
/// Where thread `t`'s keys start in `two_threads`: `t * THREAD_KEY_STRIDE`.
const THREAD_KEY_STRIDE: u64 = 1 << 32;

type Group<'a> = BenchmarkGroup<'a, WallTime>;
/// The manual clocks' step per check in `new_key`.
const NEW_KEY_STEP: Duration = Duration::from_micros(1);

type Sluice<C = MonotonicClock> = KeyedLimiter<u64, TokenBucket, StaticQuotas<u64>, C>;
type Governor<C = DefaultClock> = governor::RateLimiter<
    u64,
    DashMapStateStore<u64>,
    C,
    NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

fn sluice_on<C: sluice::Clock + 'static>(capacity: usize, clock: C) -> Sluice<C> {
    let quota: Quota = SLUICE_QUOTA.parse().expect("valid quota");
    KeyedLimiter::builder(TokenBucket, quota)
        .capacity(capacity)
        .unknown_key_quota(quota)
        .clock(clock)
        .build()
        .expect("valid quota")
}

fn sluice(capacity: usize) -> Sluice {
    sluice_on(capacity, MonotonicClock)
}

fn governor_on<C: governor::clock::Clock>(clock: C) -> Governor<C> {
    let quota = governor::Quota::per_second(nonzero(RATE)).allow_burst(nonzero(BURST));
    governor::RateLimiter::dashmap_with_clock(quota, clock)
}

fn governor() -> Governor {
    governor_on(DefaultClock::default())
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("rates are positive")
}

fn sluice_check<C: sluice::Clock + 'static>(limiter: &Sluice<C>, key: u64) -> bool {
    black_box(black_box(limiter).check(&black_box(key))).is_allowed()
}

fn governor_check<C: governor::clock::Clock>(limiter: &Governor<C>, key: u64) -> bool {
    black_box(black_box(limiter).check_key(&black_box(key))).is_ok()
}

/// Benchmarks `check` as `group/who`, after asserting that it admits.
fn bench_check(group: &mut Group, who: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..1000 {
        assert!(check(), "{who} denies");
    }
    group.bench_function(who, |b| b.iter(&mut check));
}

/// `0, 1, ..., n - 1, 0, 1, ...` without a division.
struct Cycle {
    next: u64,
    n: u64,
}

impl Cycle {
    fn new(n: u64) -> Self {
        Self { next: 0, n }
    }

    fn next(&mut self) -> u64 {
        let key = self.next;
        self.next += 1;
        if self.next == self.n {
            self.next = 0;
        }
        key
    }
}

/// Uniform keys in `0..n` from xorshift64 (fixed seed, so both sides see the same sequence).
struct Random {
    state: u64,
    n: u64,
}

impl Random {
    fn new(n: u64) -> Self {
        Self {
            state: 0x9E37_79B9_7F4A_7C15,
            n,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        // The top 32 bits scaled to 0..n (n < 2^32), without a division.
        ((x >> 32) * self.n) >> 32
    }
}

/// Advances a manual clock by [`NEW_KEY_STEP`] (the real clocks advance by themselves).
trait Step {
    fn step(&self) {}
}

impl Step for MonotonicClock {}
impl Step for DefaultClock {}

impl Step for ManualClock {
    fn step(&self) {
        self.advance(NEW_KEY_STEP);
    }
}

impl Step for FakeRelativeClock {
    fn step(&self) {
        self.advance(NEW_KEY_STEP);
    }
}

fn hot_1k(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_1k");
    hot_1k_sluice(&mut group, "sluice", MonotonicClock);
    hot_1k_governor(&mut group, "governor", DefaultClock::default());
    hot_1k_sluice(&mut group, "sluice_manual_clock", ManualClock::new(0));
    hot_1k_governor(&mut group, "governor_fake_clock", FakeRelativeClock::default());
    group.finish();
}

fn hot_1k_sluice<C: sluice::Clock + 'static>(group: &mut Group, who: &str, clock: C) {
    let limiter = sluice_on(NEW_KEY_CAPACITY, clock);
    let mut keys = Cycle::new(HOT_KEYS);
    bench_check(group, who, || sluice_check(&limiter, keys.next()));
}

fn hot_1k_governor<C: governor::clock::Clock>(group: &mut Group, who: &str, clock: C) {
    let reference = governor_on(clock);
    let mut keys = Cycle::new(HOT_KEYS);
    bench_check(group, who, || governor_check(&reference, keys.next()));
}

fn random_1m(c: &mut Criterion) {
    let mut group = c.benchmark_group("random_1m");
    random_1m_sluice(&mut group, "sluice", MonotonicClock);
    random_1m_governor(&mut group, "governor", DefaultClock::default());
    random_1m_sluice(&mut group, "sluice_manual_clock", ManualClock::new(0));
    random_1m_governor(&mut group, "governor_fake_clock", FakeRelativeClock::default());
    group.finish();
}

fn random_1m_sluice<C: sluice::Clock + 'static>(group: &mut Group, who: &str, clock: C) {
    let limiter = sluice_on(2 * RANDOM_KEYS as usize, clock);
    for key in 0..RANDOM_KEYS {
        assert!(limiter.check(&key).is_allowed());
    }
    assert_eq!(limiter.metrics().entries, RANDOM_KEYS, "sluice holds every key");
    let mut keys = Random::new(RANDOM_KEYS);
    bench_check(group, who, || sluice_check(&limiter, keys.next()));
}

fn random_1m_governor<C: governor::clock::Clock>(group: &mut Group, who: &str, clock: C) {
    let reference = governor_on(clock);
    for key in 0..RANDOM_KEYS {
        assert!(reference.check_key(&key).is_ok());
    }
    assert_eq!(reference.len(), RANDOM_KEYS as usize, "governor holds every key");
    let mut keys = Random::new(RANDOM_KEYS);
    bench_check(group, who, || governor_check(&reference, keys.next()));
}

fn new_key(c: &mut Criterion) {
    let mut group = c.benchmark_group("new_key");
    new_key_sluice(&mut group, "sluice", MonotonicClock);
    new_key_governor(&mut group, "governor", DefaultClock::default());
    new_key_sluice(&mut group, "sluice_manual_clock", ManualClock::new(0));
    new_key_governor(&mut group, "governor_fake_clock", FakeRelativeClock::default());
    group.finish();
}

fn new_key_sluice<C: sluice::Clock + Step + Clone + 'static>(group: &mut Group, who: &str, clock: C) {
    // Capacity 100 000: once full, every new key evicts one (an idle one, see the top).
    let limiter = sluice_on(NEW_KEY_CAPACITY, clock.clone());
    for key in 0..2 * NEW_KEY_CAPACITY as u64 {
        clock.step();
        assert!(limiter.check(&key).is_allowed());
    }
    let mut next = 2 * NEW_KEY_CAPACITY as u64;
    bench_check(group, who, || {
        next += 1;
        clock.step();
        sluice_check(&limiter, next)
    });
    let metrics = limiter.metrics();
    assert!(
        metrics.entries <= NEW_KEY_CAPACITY as u64 && metrics.evicted_idle > 0,
        "sluice stays bounded by evicting: {metrics:?}"
    );
}

fn new_key_governor<C: governor::clock::Clock + Step + Clone>(group: &mut Group, who: &str, clock: C) {
    // Unbounded map: swept every 100 000 new keys, the sweep inside the measurement.
    let reference = governor_on(clock.clone());
    let mut next = 0u64;
    bench_check(group, who, || {
        next += 1;
        clock.step();
        if next % GOVERNOR_RETAIN_EVERY == 0 {
            reference.retain_recent();
        }
        governor_check(&reference, next)
    });
    assert!(
        reference.len() <= GOVERNOR_RETAIN_EVERY as usize,
        "governor's sweep keeps it bounded"
    );
}

/// `two_threads/who/threads`: `threads` threads, each checking its own [`HOT_KEYS`] keys.
fn bench_threads(group: &mut Group, who: &str, threads: u64, check: impl Fn(u64) -> bool + Sync) {
    let check = &check;
    for t in 0..threads {
        for key in 0..HOT_KEYS {
            assert!(check(t * THREAD_KEY_STRIDE + key), "{who} denies");
        }
    }
    group.bench_function(BenchmarkId::new(who, threads), |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            thread::scope(|scope| {
                for t in 0..threads {
                    scope.spawn(move || {
                        let base = t * THREAD_KEY_STRIDE;
                        let mut keys = Cycle::new(HOT_KEYS);
                        for _ in 0..iters {
                            check(base + keys.next());
                        }
                    });
                }
            });
            // Per check: `threads * iters` checks were made in this wall time.
            start.elapsed() / threads as u32
        });
    });
}

/// Arithmetic on one value, about as long as a check, touching no memory.
fn independent_work(key: u64) -> bool {
    let mut x = black_box(key) | 1;
    for _ in 0..24 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    black_box(x) != 0
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    let limiter = sluice(NEW_KEY_CAPACITY);
    let reference = governor();
    let manual = sluice_on(NEW_KEY_CAPACITY, ManualClock::new(0));
    let fake = governor_on(FakeRelativeClock::default());
    for threads in [1, 2] {
        bench_threads(&mut group, "independent_work", threads, independent_work);
        bench_threads(&mut group, "sluice", threads, |key| sluice_check(&limiter, key));
        bench_threads(&mut group, "governor", threads, |key| {
            governor_check(&reference, key)
        });
        bench_threads(&mut group, "sluice_manual_clock", threads, |key| {
            sluice_check(&manual, key)
        });
        bench_threads(&mut group, "governor_fake_clock", threads, |key| {
            governor_check(&fake, key)
        });
    }
    group.finish();
}

fn two_threads_interleaved(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads_interleaved");
    let manual = sluice_on(NEW_KEY_CAPACITY, ManualClock::new(0));
    let fake = governor_on(FakeRelativeClock::default());
    for key in 0..HOT_KEYS {
        for t in 0..2 {
            assert!(sluice_check(&manual, t * THREAD_KEY_STRIDE + key));
            assert!(governor_check(&fake, t * THREAD_KEY_STRIDE + key));
        }
    }
    for threads in [1, 2] {
        bench_threads(&mut group, "sluice_manual_clock", threads, |key| {
            sluice_check(&manual, key)
        });
        bench_threads(&mut group, "governor_fake_clock", threads, |key| {
            governor_check(&fake, key)
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = hot_1k, random_1m, new_key, two_threads, two_threads_interleaved
}
criterion_main!(benches);
