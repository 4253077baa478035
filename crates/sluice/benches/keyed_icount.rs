//! One side of one single-thread `keyed` case on its manual clock, for counting instructions
//! with valgrind (`bench/keyed-icount.sh` runs it): on a VM whose speed drifts, an instruction
//! count does not move between runs, so it shows what a change to the keyed path costs.
//!
//! Usage: `keyed_icount SIDE CASE CHECKS` with SIDE `sluice`, `governor` (SipHash, its default)
//! or `governor_foldhash` (sluice's hasher) and CASE `hot_1k`,
//! `random_1m` or `new_key`: sets the case up as `keyed` does (see `common/mod.rs`), then
//! makes CHECKS checks, each asserted to admit. Run by `cargo bench` (which passes only
//! `--bench`), it prints how to use it and does nothing else.

mod common;

use common::{Case, FoldHash, GovernorCase, Side, SipHash, SluiceCase};
use governor::clock::FakeRelativeClock;
use sluice::ManualClock;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let [side, case, checks] = args.as_slice() else {
        println!("keyed_icount: run by bench/keyed-icount.sh (usage: keyed_icount SIDE CASE CHECKS)");
        return;
    };
    let Some(case) = Case::ALL.into_iter().find(|c| c.name() == case) else {
        fail(&format!("unknown case {case:?} (hot_1k, random_1m or new_key)"));
    };
    let Ok(checks) = checks.parse::<u64>() else {
        fail(&format!("CHECKS must be a whole number, not {checks:?}"));
    };
    match side.as_str() {
        "sluice" => run(SluiceCase::new(case, ManualClock::new(0)), checks),
        "governor" => run(
            GovernorCase::<_, SipHash>::new(case, FakeRelativeClock::default()),
            checks,
        ),
        "governor_foldhash" => run(
            GovernorCase::<_, FoldHash>::new(case, FakeRelativeClock::default()),
            checks,
        ),
        _ => fail(&format!(
            "unknown side {side:?} (sluice, governor or governor_foldhash)"
        )),
    }
}

fn run(mut side: impl Side, checks: u64) {
    for _ in 0..checks {
        assert!(side.check(), "every check admits");
    }
    side.verify();
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2);
}
