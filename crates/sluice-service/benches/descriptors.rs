//! The cost of one decision of the descriptor engine, with Limitador's in-memory rate limiter
//! (`limitador::RateLimiter`, the library under Limitador's own RLS server) as the reference.
//!
//! Run with `cargo bench -p sluice-service --bench descriptors` (add `hot`, `distinct_1m` or
//! `stacked` to run one group). Ids are `group/implementation`.
//!
//! - `stacked`: `hot` on a rule of two quotas (`quota: [.., ..]`) beside one of one, and
//!   Limitador with two limits on the key beside one.
//!
//! Both sides hold one limit on a descriptor key `user`, one counter per value, far above what
//! a run reaches, so every check is an admission that writes its counter: sluice a key-only
//! rule in envoy's format with `quota: 1000000000/s burst 1000000` (a token bucket); Limitador
//! a `Limit` in namespace `bench` with the variable `user`, 1e9 per 1 s (its fixed window).
//! Each check is sluice's `Engine::check` (an async fn that never waits in memory: polled once
//! here) and Limitador's `check_rate_limited_and_update` with a delta of 1.
//!
//! - `hot`: one value, its request (sluice: a `CheckRequest`; Limitador: a `Context` made from
//!   the descriptor's map, as its RLS server makes one per request) built once, outside the
//!   timing.
//! - `distinct_1m`: 1 000 000 values, every counter made before measuring, then visited in a
//!   pseudo-random order (the same xorshift on both sides); each check builds its request from
//!   the value's text inside the timing, as a server does for each request it reads. Both
//!   stores hold 2 000 000 counters, so none is evicted.
//!
//! Before measuring, every case is checked to admit.

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use limitador::RateLimiter;
use limitador::limit::{Context as LimitadorContext, Limit};
use sluice_descriptors::RuleSet;
use sluice_service::{CheckRequest, Code, CounterSettings, DescriptorRequest, Engine, EngineSettings};

const VALUES: u64 = 1_000_000;
const CAPACITY: usize = 2_000_000;

/// The answer of a future that completes at its first poll (an in-memory check).
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => panic!("an in-memory check waited"),
    }
}

/// A quota no run reaches, and a second one for `stacked` (the same, per hour).
const QUOTA: &str = "\"1000000000/s burst 1000000\"";
const SECOND_QUOTA: &str = "\"1000000000/h burst 1000000\"";

fn engine() -> Engine {
    engine_on(QUOTA)
}

/// An engine whose `user` rule holds `quota` (a quota, or a list of them).
fn engine_on(quota: &str) -> Engine {
    let rules = RuleSet::from_yaml(&format!(
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {{quota: {quota}}}\n"
    ))
    .expect("the bench's rules");
    let settings = EngineSettings {
        counters: CounterSettings {
            capacity: CAPACITY,
            ..CounterSettings::default()
        },
        ..EngineSettings::default()
    };
    Engine::new(rules, settings).expect("the bench's engine")
}

fn request(value: String) -> CheckRequest {
    CheckRequest {
        domain: "bench".into(),
        descriptors: vec![DescriptorRequest {
            entries: vec![("user".into(), value)],
            ..Default::default()
        }],
        hits: None,
    }
}

fn sluice_admits(engine: &Engine, request: &CheckRequest) -> bool {
    now(engine.check(request, false)).is_ok_and(|verdict| verdict.overall == Code::Ok)
}

fn limitador() -> RateLimiter {
    limitador_of(&[1])
}

/// Limitador with one limit on `user` per window length of `seconds` (its way of holding
/// several limits on one key).
fn limitador_of(seconds: &[u64]) -> RateLimiter {
    let limiter = RateLimiter::new(CAPACITY as u64);
    for &seconds in seconds {
        let user = "user".try_into().expect("a CEL variable");
        limiter.add_limit(Limit::new("bench", 1_000_000_000, seconds, [], [user]));
    }
    limiter
}

fn context(value: String) -> LimitadorContext<'static> {
    HashMap::from([("user".to_string(), value)]).into()
}

fn limitador_admits(limiter: &RateLimiter, ctx: &LimitadorContext<'_>) -> bool {
    limiter
        .check_rate_limited_and_update(&"bench".into(), ctx, 1)
        .is_ok_and(|result| !result.limited && !result.counters.is_empty())
}

/// xorshift64: the visiting order of `distinct_1m`, the same on both sides.
struct Walk(u64);

impl Walk {
    fn next_value(&mut self) -> String {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        format!("user-{}", self.0 % VALUES)
    }
}

fn hot(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot");
    let engine = engine();
    let request = request("alice".into());
    let limiter = limitador();
    let ctx = context("alice".into());
    for _ in 0..1000 {
        assert!(sluice_admits(&engine, &request));
        assert!(limitador_admits(&limiter, &ctx));
    }
    group.bench_function("sluice", |b| {
        b.iter(|| sluice_admits(&engine, black_box(&request)))
    });
    group.bench_function("limitador", |b| {
        b.iter(|| limitador_admits(&limiter, black_box(&ctx)))
    });
    group.finish();
}

fn distinct_1m(c: &mut Criterion) {
    let mut group = c.benchmark_group("distinct_1m");
    // criterion's test mode (`cargo test --benches`) runs each bench once: fewer values.
    let values = if std::env::args().any(|arg| arg == "--bench") {
        VALUES
    } else {
        1000
    };
    let engine = engine();
    let limiter = limitador();
    for value in 0..values {
        assert!(sluice_admits(&engine, &request(format!("user-{value}"))));
        assert!(limitador_admits(&limiter, &context(format!("user-{value}"))));
    }
    let mut walk = Walk(0x9E37_79B9_7F4A_7C15);
    group.bench_function("sluice", |b| {
        b.iter(|| sluice_admits(&engine, &request(walk.next_value())));
    });
    let mut walk = Walk(0x9E37_79B9_7F4A_7C15);
    group.bench_function("limitador", |b| {
        b.iter(|| limitador_admits(&limiter, &context(walk.next_value())));
    });
    group.finish();
}

/// `hot` with two quotas on the rule (`quota: [.., ..]`, decided all or nothing) beside one;
/// Limitador with two limits on the key beside one.
fn stacked(c: &mut Criterion) {
    let mut group = c.benchmark_group("stacked");
    let one = engine();
    let two = engine_on(&format!("[{QUOTA}, {SECOND_QUOTA}]"));
    let request = request("alice".into());
    let (limitador_one, limitador_two) = (limitador(), limitador_of(&[1, 3600]));
    let ctx = context("alice".into());
    for _ in 0..1000 {
        assert!(sluice_admits(&one, &request) && sluice_admits(&two, &request));
        assert!(limitador_admits(&limitador_one, &ctx) && limitador_admits(&limitador_two, &ctx));
    }
    group.bench_function("sluice_one_quota", |b| {
        b.iter(|| sluice_admits(&one, black_box(&request)))
    });
    group.bench_function("sluice_two_quotas", |b| {
        b.iter(|| sluice_admits(&two, black_box(&request)))
    });
    group.bench_function("limitador_one_limit", |b| {
        b.iter(|| limitador_admits(&limitador_one, black_box(&ctx)))
    });
    group.bench_function("limitador_two_limits", |b| {
        b.iter(|| limitador_admits(&limitador_two, black_box(&ctx)))
    });
    group.finish();
}

criterion_group!(benches, hot, distinct_1m, stacked);
criterion_main!(benches);
