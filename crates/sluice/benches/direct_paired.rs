//! The direct token bucket's cases of `direct` (`allowed` with a clock step, `denied`,
//! `admitted`), with sluice and governor taking turns in one process, as `keyed_paired` does
//! for the keyed cases: round after round each side makes the same number of checks, the
//! order alternating, and each round gives one ratio (sluice/governor). criterion measures one
//! side after the other, so on a VM whose speed drifts (and whose figures for the same code
//! move with the binary's layout) its separate runs cannot carry a ratio; the median of the
//! paired ratios holds still.
//!
//! Run with `cargo bench -p sluice --bench direct_paired` (`SLUICE_PAIRED_ROUNDS` sets the
//! rounds, default 31). Prints one row per case: each side's median ns per check, then the
//! ratio's median and quartiles. The cases are in `direct_cases/mod.rs`.

mod direct_cases;
mod paired;

use std::time::Instant;

use direct_cases::{
    INTERVAL, governor_admitted, governor_exhausted, governor_stepped, sluice_admitted, sluice_exhausted,
    sluice_stepped,
};
use sluice::TokenBucket;

const DEFAULT_ROUNDS: usize = 31;
/// Roughly 20–40 ms of checks per side and round.
const CHECKS_PER_ROUND: u32 = 3_000_000;

type Check = Box<dyn FnMut() -> bool>;

fn main() {
    let rounds = paired::rounds("SLUICE_PAIRED_ROUNDS", DEFAULT_ROUNDS);
    println!(
        "token bucket, {rounds} rounds: ns per check (medians); ratio sluice/governor: median [quartiles]"
    );
    let cases: [(&str, bool, Check, Check); 3] = [
        (
            "allowed",
            true,
            Box::new(sluice_stepped(TokenBucket, INTERVAL)),
            Box::new(governor_stepped(INTERVAL)),
        ),
        (
            "denied",
            false,
            Box::new(sluice_exhausted(TokenBucket)),
            Box::new(governor_exhausted()),
        ),
        (
            "admitted",
            true,
            Box::new(sluice_admitted()),
            Box::new(governor_admitted()),
        ),
    ];
    for (name, expected, mut sluice, mut governor) in cases {
        // A first round of each, unmeasured, warms caches and branch predictors.
        time(&mut sluice, expected);
        time(&mut governor, expected);
        let mut rows = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let (s, g) = if round % 2 == 0 {
                let s = time(&mut sluice, expected);
                (s, time(&mut governor, expected))
            } else {
                let g = time(&mut governor, expected);
                (time(&mut sluice, expected), g)
            };
            rows.push((s, g));
        }
        let quartiles = paired::quartiles;
        let (ratio, low, high) = quartiles(rows.iter().map(|(s, g)| s / g).collect());
        println!(
            "{name:<9} sluice {:>6.2}  governor {:>6.2}  ratio {ratio:.3} [{low:.3}, {high:.3}]",
            quartiles(rows.iter().map(|r| r.0).collect()).0,
            quartiles(rows.iter().map(|r| r.1).collect()).0,
        );
    }
}

/// Nanoseconds per check over one round, each check asserted to decide `expected`.
fn time(check: &mut Check, expected: bool) -> f64 {
    let start = Instant::now();
    let mut agreed = 0u32;
    for _ in 0..CHECKS_PER_ROUND {
        agreed += u32::from(check() == expected);
    }
    let elapsed = start.elapsed();
    assert_eq!(agreed, CHECKS_PER_ROUND, "every check decides as its case says");
    elapsed.as_nanos() as f64 / f64::from(CHECKS_PER_ROUND)
}
