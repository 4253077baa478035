//! One side of the `stacked` case of the `descriptors` bench, for counting instructions with
//! valgrind (`bench/stacked-icount.sh` runs it): the engine's decision on a rule of one quota,
//! or of two (`quota: [.., ..]`), one descriptor that every check admits. An instruction count
//! does not move between runs on a VM whose speed drifts, as criterion's times do here.
//!
//! Usage: `stacked_icount QUOTAS CHECKS` with QUOTAS `one` or `two`. Run by `cargo bench`
//! (which passes only `--bench`), it prints how to use it and does nothing else.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice_descriptors::RuleSet;
use sluice_service::{CheckRequest, Code, DescriptorRequest, Engine, EngineSettings};

/// The quotas of the `descriptors` bench's `stacked` case: none that a run reaches.
const ONE: &str = "\"1000000000/s burst 1000000\"";
const TWO: &str = "[\"1000000000/s burst 1000000\", \"1000000000/h burst 1000000\"]";

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let [quotas, checks] = args.as_slice() else {
        println!("stacked_icount: run by bench/stacked-icount.sh (usage: stacked_icount QUOTAS CHECKS)");
        return;
    };
    let quota = match quotas.as_str() {
        "one" => ONE,
        "two" => TWO,
        _ => fail(&format!("QUOTAS is one or two, not {quotas:?}")),
    };
    let Ok(checks) = checks.parse::<u64>() else {
        fail(&format!("CHECKS must be a whole number, not {checks:?}"));
    };
    let rules = RuleSet::from_yaml(&format!(
        "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {{quota: {quota}}}\n"
    ))
    .expect("the bench's rules");
    let engine = Engine::new(rules, EngineSettings::default()).expect("the bench's engine");
    let request = CheckRequest {
        domain: "bench".into(),
        descriptors: vec![DescriptorRequest {
            entries: vec![("user".into(), "alice".into())],
            ..Default::default()
        }],
        hits: None,
    };
    for _ in 0..checks {
        let verdict = now(engine.check(black_box(&request), false));
        assert!(
            verdict.is_ok_and(|verdict| verdict.overall == Code::Ok),
            "every check admits"
        );
    }
}

/// The answer of a future that completes at its first poll (an in-memory check).
fn now<T>(future: impl Future<Output = T>) -> T {
    let mut future = pin!(future);
    match future.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => answer,
        Poll::Pending => fail("an in-memory check waited"),
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2);
}
