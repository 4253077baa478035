//! The single-thread cases of the `keyed` bench (`hot_1k`, `random_1m`, `new_key`, on real
//! and on manual clocks), with sluice and governor alternating in one process: round after
//! round, each side makes the same number of checks, the order switching every round, and
//! each round gives a ratio (sluice/governor). On a shared machine whose speed drifts by tens
//! of percent from one second to the next, two sides measured a second apart share the drift,
//! so the median of those ratios holds still where separate runs (criterion's) do not.
//!
//! Run with `cargo bench -p sluice --bench keyed_paired` (a filter such as `random_1m` runs
//! the cases whose name contains it; `SLUICE_PAIRED_ROUNDS` sets the rounds, default 31).
//! Prints one row per case: each side's median ns per check, then the ratio's median and
//! quartiles. The setups, quotas and keys are `keyed`'s (see `common/mod.rs`).

mod common;

use std::time::Instant;

use common::{Case, GovernorCase, Side, SluiceCase};
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
    let rounds = match std::env::var("SLUICE_PAIRED_ROUNDS") {
        Ok(value) => match value.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("error: SLUICE_PAIRED_ROUNDS must be a positive integer, got {value:?}");
                std::process::exit(2);
            }
        },
        Err(_) => DEFAULT_ROUNDS,
    };
    println!("{rounds} rounds per case; ns per check (medians), ratio sluice/governor: median [quartiles]");
    for case in Case::ALL {
        if filter.as_deref().is_some_and(|f| !case.name().contains(f)) {
            continue;
        }
        let sluice = SluiceCase::new(case, MonotonicClock);
        paired(
            case,
            "real clocks",
            sluice,
            GovernorCase::new(case, DefaultClock::default()),
            rounds,
        );
        let sluice = SluiceCase::new(case, ManualClock::new(0));
        let governor = GovernorCase::new(case, FakeRelativeClock::default());
        paired(case, "manual clocks", sluice, governor, rounds);
    }
}

fn paired(case: Case, clocks: &str, mut sluice: impl Side, mut governor: impl Side, rounds: usize) {
    let n = checks_per_round(case);
    // A first round of each, unmeasured, warms caches and branch predictors.
    time(n, || sluice.check());
    time(n, || governor.check());
    let mut rows = Vec::with_capacity(rounds);
    for round in 0..rounds {
        let (s, g) = if round % 2 == 0 {
            let s = time(n, || sluice.check());
            (s, time(n, || governor.check()))
        } else {
            let g = time(n, || governor.check());
            (time(n, || sluice.check()), g)
        };
        rows.push((s, g));
    }
    sluice.verify();
    governor.verify();
    let median = |mut v: Vec<f64>, q: usize| {
        v.sort_by(f64::total_cmp);
        v[(v.len() - 1) * q / 4]
    };
    let ratios: Vec<f64> = rows.iter().map(|(s, g)| s / g).collect();
    println!(
        "{:<10} {:<14} sluice {:>7.1}  governor {:>7.1}  ratio {:.3} [{:.3}, {:.3}]",
        case.name(),
        clocks,
        median(rows.iter().map(|r| r.0).collect(), 2),
        median(rows.iter().map(|r| r.1).collect(), 2),
        median(ratios.clone(), 2),
        median(ratios.clone(), 1),
        median(ratios, 3),
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
