//! What one dependent random read costs on this machine, by the size of the memory it falls
//! in: the floor under any lookup in a store too big for the caches (the keyed bench's
//! `random_1m`: a million keys are tens of megabytes whatever the layout).
//!
//! A pointer chase: one word per cache line, linked in a random cycle, followed for 5 million
//! steps; each step must wait for the last. Prints the best of three runs per size.
//! Run with `cargo bench -p sluice --bench memory_latency`; run otherwise (by `cargo test
//! --benches`, which passes no `--bench`), it does nothing: 256 MB unoptimised is no test.

use std::time::Instant;

const SIZES_MB: [usize; 6] = [1, 2, 8, 32, 64, 256];
const STEPS: usize = 5_000_000;
const WORDS_PER_LINE: usize = 8;

fn main() {
    if !std::env::args().any(|arg| arg == "--bench") {
        println!("memory_latency: run it with `cargo bench -p sluice --bench memory_latency`");
        return;
    }
    for mb in SIZES_MB {
        let lines = mb * 1024 * 1024 / 64;
        let next = random_cycle(lines);
        let mut best = f64::MAX;
        for _ in 0..3 {
            let mut at = 0;
            let start = Instant::now();
            for _ in 0..STEPS {
                at = next[at];
            }
            std::hint::black_box(at);
            best = best.min(start.elapsed().as_nanos() as f64 / STEPS as f64);
        }
        println!("{mb:>4} MB: {best:6.1} ns per dependent read (best of 3)");
    }
}

/// `lines` cache lines' first words linked in one random cycle (Fisher–Yates over xorshift).
fn random_cycle(lines: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..lines).collect();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for i in (1..lines).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let j = (state % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    let mut next = vec![0usize; lines * WORDS_PER_LINE];
    for (k, &line) in order.iter().enumerate() {
        next[line * WORDS_PER_LINE] = order[(k + 1) % lines] * WORDS_PER_LINE;
    }
    next
}
