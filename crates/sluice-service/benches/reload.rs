//! The cost of applying a changed rule set on a host holding many counters: `Engine::reload`
//! moves every held counter into the next generation under its rule's new quota (nothing is
//! reset), so its cost grows with the keys held.
//!
//! Run with `cargo bench -p sluice-service --bench reload`. The engine holds one key-only
//! rule on `user` and 1 000 000 counters (one per value, each taken once); each iteration
//! applies the other of two rule sets that differ in that rule's quota (1000/s, 999/s), so
//! every counter is requoted. Before measuring, a thread checks while the engine reloads five
//! times and the longest check is printed: how long a reload can make a check wait.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_descriptors::RuleSet;
use sluice_service::{CheckRequest, Code, CounterSettings, DescriptorRequest, Engine, EngineSettings};

const KEYS: u64 = 1_000_000;

fn rules(per_second: u32) -> RuleSet {
    RuleSet::from_yaml(&format!(
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {per_second}}}\n"
    ))
    .expect("the bench's rules")
}

/// A check of one `user` value (set before each check).
fn user_request() -> CheckRequest {
    CheckRequest {
        domain: "bench".into(),
        descriptors: vec![DescriptorRequest {
            entries: vec![("user".into(), String::new())],
            ..Default::default()
        }],
        hits: None,
    }
}

/// The answer of a future that completes at its first poll (an in-memory check).
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => panic!("an in-memory check waited"),
    }
}

fn reload(c: &mut Criterion) {
    let settings = EngineSettings {
        counters: CounterSettings {
            capacity: 2 * KEYS as usize,
            ..CounterSettings::default()
        },
        ..EngineSettings::default()
    };
    let engine = Engine::new(rules(1000), settings).expect("the bench's engine");
    let mut request = user_request();
    for value in 0..KEYS {
        request.descriptors[0].entries[0].1 = value.to_string();
        let verdict = now(engine.check(&request, false)).expect("a valid request");
        assert_eq!(verdict.overall, Code::Ok);
    }
    let sets = [rules(999), rules(1000)];
    longest_check_during_reloads(&engine, &sets);
    let mut group = c.benchmark_group("reload");
    group.sample_size(10);
    let mut turn = 0;
    group.bench_function("1m_keys", |b| {
        b.iter(|| {
            turn ^= 1;
            let kept = engine.reload(sets[turn].clone()).expect("the rules build");
            assert_eq!(kept.moved, KEYS);
            black_box(kept)
        });
    });
    group.finish();
}

/// Checks from another thread while the engine reloads five times: the longest one says how
/// long a check can wait for a reload (one shard's requote, not the whole store's).
fn longest_check_during_reloads(engine: &Engine, sets: &[RuleSet; 2]) {
    let done = std::sync::atomic::AtomicBool::new(false);
    let (longest, checks) = std::thread::scope(|scope| {
        let checker = scope.spawn(|| {
            let mut request = user_request();
            let (mut longest, mut checks, mut value) = (std::time::Duration::ZERO, 0u64, 0u64);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                value = (value + 7919) % KEYS;
                request.descriptors[0].entries[0].1 = value.to_string();
                let started = std::time::Instant::now();
                black_box(now(engine.check(&request, false)).expect("a valid request"));
                longest = longest.max(started.elapsed());
                checks += 1;
            }
            (longest, checks)
        });
        for turn in 0..5 {
            engine.reload(sets[turn % 2].clone()).expect("the rules build");
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        checker.join().expect("the checker")
    });
    println!("reload/1m_keys: the longest of {checks} checks during 5 reloads took {longest:?}");
}

criterion_group!(benches, reload);
criterion_main!(benches);
