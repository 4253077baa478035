//! What the benches that take turns in one process share (`keyed_paired`, `direct_paired`,
//! `clock_variants`): their round count from the environment, and medians with quartiles.

#![allow(dead_code)] // each bench target uses part of this module

/// The rounds to run: `var` from the environment if set (a positive integer, or the process
/// exits with a one-line error), else `default`.
pub fn rounds(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(value) => match value.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("error: {var} must be a positive integer, got {value:?}");
                std::process::exit(2);
            }
        },
        Err(_) => default,
    }
}

/// The median, first and third quartiles of `values` (at least one).
pub fn quartiles(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: usize| values[(values.len() - 1) * q / 4];
    (at(2), at(1), at(3))
}
