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
//! `u64`. governor runs on its default hasher (std's SipHash `RandomState`: what its users
//! get) and again on sluice's, foldhash (ids `governor_foldhash`, `governor_foldhash_fake_clock`):
//! the ratio to the latter compares the stores alone.
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
//! - `two_threads_apart`: the same on manual clocks, with 20 000 other keys inserted between
//!   thread 0's keys and thread 1's, so that no cache line holds entries of both threads. In
//!   `two_threads` each shard's entries of thread 0 end where thread 1's begin: a line or so
//!   per shard is shared, and each such line bounces between the cores.
//!
//! Before measuring, every case is run 1000 times and asserted to admit. The single-thread
//! cases are set up in `common/mod.rs`, shared with the `keyed_paired` bench, which runs the
//! two sides alternately in one process for ratios that hold still on a noisy machine.

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::{
    Case, Cycle, FoldHash, GovernorCase, HOT_KEYS, NEW_KEY_CAPACITY, Side, SipHash, SluiceCase,
    governor_check, governor_on, sluice_check, sluice_on,
};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, black_box, criterion_group, criterion_main};
use governor::clock::{DefaultClock, FakeRelativeClock};
use sluice::{ManualClock, MonotonicClock};

/// Where thread `t`'s keys start in `two_threads`: `t * THREAD_KEY_STRIDE`.
const THREAD_KEY_STRIDE: u64 = 1 << 32;

type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// Benchmarks `check` as `group/who`, after asserting that it admits.
fn bench_check(group: &mut Group, who: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..1000 {
        assert!(check(), "{who} denies");
    }
    group.bench_function(who, |b| b.iter(&mut check));
}

/// A single-thread case's group: each side on its real clock, then on its manual clock;
/// governor on its default hasher and on sluice's.
fn single(c: &mut Criterion, case: Case) {
    let mut group = c.benchmark_group(case.name());
    bench_side(&mut group, "sluice", SluiceCase::new(case, MonotonicClock));
    let real = DefaultClock::default;
    bench_side(
        &mut group,
        "governor",
        GovernorCase::<_, SipHash>::new(case, real()),
    );
    let foldhash = GovernorCase::<_, FoldHash>::new(case, real());
    bench_side(&mut group, "governor_foldhash", foldhash);
    let manual = SluiceCase::new(case, ManualClock::new(0));
    bench_side(&mut group, "sluice_manual_clock", manual);
    let fake = FakeRelativeClock::default;
    let sip = GovernorCase::<_, SipHash>::new(case, fake());
    bench_side(&mut group, "governor_fake_clock", sip);
    let foldhash = GovernorCase::<_, FoldHash>::new(case, fake());
    bench_side(&mut group, "governor_foldhash_fake_clock", foldhash);
    group.finish();
}

/// Benchmarks one side of a case as `group/who`, then checks what the case promises.
fn bench_side(group: &mut Group, who: &str, mut side: impl Side) {
    bench_check(group, who, || side.check());
    side.verify();
}

fn hot_1k(c: &mut Criterion) {
    single(c, Case::Hot1k);
}

fn random_1m(c: &mut Criterion) {
    single(c, Case::Random1m);
}

fn new_key(c: &mut Criterion) {
    single(c, Case::NewKey);
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
    let limiter = sluice_on(NEW_KEY_CAPACITY, MonotonicClock);
    let reference = governor_on::<_, SipHash>(DefaultClock::default());
    let foldhash = governor_on::<_, FoldHash>(DefaultClock::default());
    let manual = sluice_on(NEW_KEY_CAPACITY, ManualClock::new(0));
    let fake = governor_on::<_, SipHash>(FakeRelativeClock::default());
    let fake_foldhash = governor_on::<_, FoldHash>(FakeRelativeClock::default());
    for threads in [1, 2] {
        bench_threads(&mut group, "independent_work", threads, independent_work);
        bench_threads(&mut group, "sluice", threads, |key| sluice_check(&limiter, key));
        bench_threads(&mut group, "governor", threads, |key| {
            governor_check(&reference, key)
        });
        bench_threads(&mut group, "governor_foldhash", threads, |key| {
            governor_check(&foldhash, key)
        });
        bench_threads(&mut group, "sluice_manual_clock", threads, |key| {
            sluice_check(&manual, key)
        });
        bench_threads(&mut group, "governor_fake_clock", threads, |key| {
            governor_check(&fake, key)
        });
        bench_threads(&mut group, "governor_foldhash_fake_clock", threads, |key| {
            governor_check(&fake_foldhash, key)
        });
    }
    group.finish();
}

fn two_threads_interleaved(c: &mut Criterion) {
    two_threads_placed(c, "two_threads_interleaved", |insert| {
        for key in 0..HOT_KEYS {
            for t in 0..2 {
                insert(t * THREAD_KEY_STRIDE + key);
            }
        }
    });
}

fn two_threads_apart(c: &mut Criterion) {
    two_threads_placed(c, "two_threads_apart", |insert| {
        (0..HOT_KEYS).for_each(&mut *insert);
        (0..APART_KEYS).for_each(|key| insert(APART_BASE + key));
        (0..HOT_KEYS).for_each(|key| insert(THREAD_KEY_STRIDE + key));
    });
}

/// Keys between the two threads' in `two_threads_apart`, and where they start.
const APART_KEYS: u64 = 20_000;
const APART_BASE: u64 = 1 << 40;

/// `two_threads` on manual clocks, with the keys first inserted (on both sides) in the order
/// `place` gives them.
fn two_threads_placed(c: &mut Criterion, name: &str, place: impl Fn(&mut dyn FnMut(u64))) {
    let mut group = c.benchmark_group(name);
    let manual = sluice_on(NEW_KEY_CAPACITY, ManualClock::new(0));
    let fake = governor_on::<_, SipHash>(FakeRelativeClock::default());
    let fake_foldhash = governor_on::<_, FoldHash>(FakeRelativeClock::default());
    place(&mut |key| {
        assert!(sluice_check(&manual, key));
        assert!(governor_check(&fake, key));
        assert!(governor_check(&fake_foldhash, key));
    });
    for threads in [1, 2] {
        bench_threads(&mut group, "sluice_manual_clock", threads, |key| {
            sluice_check(&manual, key)
        });
        bench_threads(&mut group, "governor_fake_clock", threads, |key| {
            governor_check(&fake, key)
        });
        bench_threads(&mut group, "governor_foldhash_fake_clock", threads, |key| {
            governor_check(&fake_foldhash, key)
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
    targets = hot_1k, random_1m, new_key, two_threads, two_threads_interleaved, two_threads_apart
}
criterion_main!(benches);
