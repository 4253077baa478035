//! One side of one token-bucket case of the `direct` bench, for counting instructions with
//! valgrind (`bench/direct-icount.sh` runs it): an instruction count does not move between
//! runs on a VM whose speed drifts.
//!
//! Usage: `direct_icount SIDE CASE CHECKS` with SIDE `sluice` or `governor` and CASE `denied`
//! (an exhausted `10/s` limit on a frozen manual clock), `admitted` (a burst of 2^32 − 1 on a
//! frozen clock: every check admitted and written) or `allowed` (`10/s`, the manual clock
//! advanced by one interval before each check), set up as in `direct`, then CHECKS checks,
//! each asserted to decide as the case says. Run by `cargo bench` (which passes only
//! `--bench`), it prints how to use it and does nothing else.

use std::hint::black_box;
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use governor::clock::FakeRelativeClock;
use sluice::{ManualClock, Quota, RateLimiter, TokenBucket};

const RATE: u32 = 10;
const INTERVAL: Duration = Duration::from_millis(100);

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let [side, case, checks] = args.as_slice() else {
        println!("direct_icount: run by bench/direct-icount.sh (usage: direct_icount SIDE CASE CHECKS)");
        return;
    };
    let Ok(checks) = checks.parse::<u64>() else {
        fail(&format!("CHECKS must be a whole number, not {checks:?}"));
    };
    let burst = if case == "admitted" { u32::MAX } else { RATE };
    let expected = case != "denied";
    let check: Box<dyn FnMut() -> bool> = match side.as_str() {
        "sluice" => sluice(case, burst),
        "governor" => governor(case, burst),
        _ => fail(&format!("unknown side {side:?} (sluice or governor)")),
    };
    run(check, expected, checks);
}

fn sluice(case: &str, burst: u32) -> Box<dyn FnMut() -> bool> {
    let quota = Quota::per_second(NonZeroU64::from(nonzero(RATE)))
        .with_capacity(u64::from(burst))
        .expect("valid burst");
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(TokenBucket, quota, clock.clone()).expect("valid quota");
    match case {
        "denied" => {
            while limiter.check().is_allowed() {}
            Box::new(move || black_box(black_box(&limiter).check()).is_allowed())
        }
        "admitted" => Box::new(move || black_box(black_box(&limiter).check()).is_allowed()),
        "allowed" => Box::new(move || {
            clock.advance(black_box(INTERVAL));
            black_box(black_box(&limiter).check()).is_allowed()
        }),
        _ => unknown_case(case),
    }
}

fn governor(case: &str, burst: u32) -> Box<dyn FnMut() -> bool> {
    let quota = governor::Quota::per_second(nonzero(RATE)).allow_burst(nonzero(burst));
    let clock = FakeRelativeClock::default();
    let limiter = governor::RateLimiter::direct_with_clock(quota, clock.clone());
    match case {
        "denied" => {
            while limiter.check().is_ok() {}
            Box::new(move || black_box(black_box(&limiter).check()).is_ok())
        }
        "admitted" => Box::new(move || black_box(black_box(&limiter).check()).is_ok()),
        "allowed" => Box::new(move || {
            clock.advance(black_box(INTERVAL));
            black_box(black_box(&limiter).check()).is_ok()
        }),
        _ => unknown_case(case),
    }
}

/// The boxed call costs both sides the same few instructions; the difference method in the
/// script leaves the setup out, not the loop.
fn run(mut check: Box<dyn FnMut() -> bool>, expected: bool, checks: u64) {
    for _ in 0..checks {
        assert_eq!(check(), expected, "every check decides as the case says");
    }
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("rates are positive")
}

fn unknown_case(case: &str) -> ! {
    fail(&format!("unknown case {case:?} (denied, admitted or allowed)"))
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2);
}
