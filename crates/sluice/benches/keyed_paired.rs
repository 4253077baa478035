//! The single-thread cases of the `keyed` bench (`hot_1k`, `random_1m`, `new_key`, on real
//! and on manual clocks), with sluice and governor (on its default hasher, SipHash, and on
//! sluice's, foldhash) taking turns in one process: round after round, each side makes the
//! same number of checks, the order rotating every round, and each round gives two ratios
//! (sluice/governor, sluice/governor on foldhash). On a shared machine whose speed drifts by tens
//! of percent from one second to the next, two sides measured a second apart share the drift,
//! so the median of those ratios holds still where separate runs (criterion's) do not.
//!
//! Run with `cargo bench -p sluice --bench keyed_paired` (a filter such as `random_1m` runs
//! the cases whose name contains it; `SLUICE_PAIRED_ROUNDS` sets the rounds, default 31).
//! Prints one row per case and clock: each side's median ns per check, then each ratio's
//! median and quartiles. The setups, quotas and keys are `keyed`'s (see `common/mod.rs`).

mod common;
mod paired;

use std::time::Instant;

use common::{Case, FoldHash, GovernorCase, Side, SipHash, SluiceCase};
use governor::clock::{DefaultClock, FakeRelativeClock};
use sluice::{ManualClock, MonotonicClock};

const DEFAULT_ROUNDS: usize = 31;

/// Roughly 50–100 ms of checks per side and round.
fn checks_per_round(case: Case) -> u32 {
    match case {
        Case::Hot1k => 1_000_000,
        Case::Random1m | Case::NewKey => 250_000,
    }
}

fn main() {
    let filter = std::env::args().skip(1).find(|arg| !arg.starts_with("--"));
    let rounds = paired::rounds("SLUICE_PAIRED_ROUNDS", DEFAULT_ROUNDS);
    println!(
        "{rounds} rounds per case; ns per check (medians); ratios sluice/governor (SipHash) and sluice/governor (foldhash): median [quartiles]"
    );
    for case in Case::ALL {
        if filter.as_deref().is_some_and(|f| !case.name().contains(f)) {
            continue;
        }
        let real = DefaultClock::default;
        let sides = (
            SluiceCase::new(case, MonotonicClock),
            GovernorCase::<_, SipHash>::new(case, real()),
            GovernorCase::<_, FoldHash>::new(case, real()),
        );
        paired(case, "real clocks", sides, rounds);
        let fake = FakeRelativeClock::default;
        let sides = (
            SluiceCase::new(case, ManualClock::new(0)),
            GovernorCase::<_, SipHash>::new(case, fake()),
            GovernorCase::<_, FoldHash>::new(case, fake()),
        );
        paired(case, "manual clocks", sides, rounds);
    }
}

/// Sides in the order sluice, governor, governor on foldhash.
fn paired(case: Case, clocks: &str, sides: (impl Side, impl Side, impl Side), rounds: usize) {
    let (mut sluice, mut governor, mut foldhash) = sides;
    let n = checks_per_round(case);
    let mut run = |side: usize| match side {
        0 => time(n, || sluice.check()),
        1 => time(n, || governor.check()),
        _ => time(n, || foldhash.check()),
    };
    // A first round of each, unmeasured, warms caches and branch predictors.
    for side in 0..3 {
        run(side);
    }
    let mut rows = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let mut row = [0.0; 3];
        // Rotate which side goes first, so none always follows the same one.
        for i in 0..3 {
            let side = (round + i) % 3;
            row[side] = run(side);
        }
        rows.push(row);
    }
    sluice.verify();
    governor.verify();
    foldhash.verify();
    let quartiles = paired::quartiles;
    let median = |side: usize| quartiles(rows.iter().map(|r| r[side]).collect()).0;
    let ratio = |side: usize| {
        let (m, lo, hi) = quartiles(rows.iter().map(|r| r[0] / r[side]).collect());
        format!("{m:.3} [{lo:.3}, {hi:.3}]")
    };
    println!(
        "{:<10} {:<14} sluice {:>7.1}  governor {:>7.1}  governor_foldhash {:>7.1}  ratio {}  ratio_foldhash {}",
        case.name(),
        clocks,
        median(0),
        median(1),
        median(2),
        ratio(1),
        ratio(2),
    );
}

/// Nanoseconds per check over `n` checks, each asserted to admit.
fn time(n: u32, mut check: impl FnMut() -> bool) -> f64 {
    let start = Instant::now();
    let mut admitted = 0u32;
    for _ in 0..n {
        admitted += u32::from(check());
    }
    let elapsed = start.elapsed();
    assert_eq!(admitted, n, "every check admits");
    elapsed.as_nanos() as f64 / f64::from(n)
}
