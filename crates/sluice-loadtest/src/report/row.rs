//! One profile in one trial: its counts, latencies and verdict, as a line of results.tsv.

use std::time::Duration;

use hdrhistogram::Histogram;

use super::steady::{Grade, SteadyWindow, judge};
use crate::generator::ProfileTrial;
use crate::profile::{Expected, Profile};

/// Latency percentiles of a trial, in microseconds.
///
/// # Example
/// ```
/// let l = sluice_loadtest::Latencies::default();
/// assert_eq!(l.as_array().len(), sluice_loadtest::Latencies::LABELS.len());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Latencies {
    /// Fastest.
    pub min: u64,
    /// 1st percentile.
    pub p1: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p99_9: u64,
    /// 99.99th percentile.
    pub p99_99: u64,
    /// 99.999th percentile.
    pub p99_999: u64,
    /// Slowest.
    pub max: u64,
}

impl Latencies {
    /// Names of the percentiles, in the order of [`Latencies::as_array`].
    pub const LABELS: [&'static str; 9] = [
        "min", "p1", "p50", "p90", "p99", "p99.9", "p99.99", "p99.999", "max",
    ];
    /// The percentiles of [`Latencies::as_array`] (0 for min, 100 for max).
    pub const PERCENTILES: [f64; 9] = [0.0, 1.0, 50.0, 90.0, 99.0, 99.9, 99.99, 99.999, 100.0];

    /// All values, in the order of [`Latencies::LABELS`].
    pub fn as_array(&self) -> [u64; 9] {
        [
            self.min,
            self.p1,
            self.p50,
            self.p90,
            self.p99,
            self.p99_9,
            self.p99_99,
            self.p99_999,
            self.max,
        ]
    }

    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let q = |p: f64| h.value_at_percentile(p);
        Latencies {
            min: h.min(),
            p1: q(1.0),
            p50: q(50.0),
            p90: q(90.0),
            p99: q(99.0),
            p99_9: q(99.9),
            p99_99: q(99.99),
            p99_999: q(99.999),
            max: h.max(),
        }
    }
}

/// One profile in one trial: a line of results.tsv (see [`TSV_COLUMNS`]).
///
/// The allowed requests split into `cold_start_allowed + steady_allowed + tail_allowed`
/// (`tests/loadtest.rs` checks it on real runs). [`TrialRow::tsv_line`] gives one field per
/// column of [`TSV_COLUMNS`]:
///
/// ```
/// use sluice_loadtest::TSV_COLUMNS;
/// assert_eq!(TSV_COLUMNS[..3], ["account ID", "trial", "test duration (us)"]);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRow {
    /// The profile's name (`account ID`).
    pub profile: String,
    /// 1-based.
    pub trial: u32,
    /// From the trial's start to its last response.
    pub duration: Duration,
    /// 200 responses.
    pub allowed: u64,
    /// 429 responses.
    pub denied: u64,
    /// `allowed` per second of `duration`.
    pub allow_rate: f64,
    /// `denied` per second of `duration`.
    pub deny_rate: f64,
    /// Latency percentiles (µs) of every response.
    pub latency_us: Latencies,
    /// The rate the profile should get.
    pub expected: Expected,
    /// `(steady_allow_rate − expected) / expected × 100`; `None` when undefined.
    pub error_percent: Option<f64>,
    /// Where the steady window starts, from the trial's start.
    pub steady_start: Duration,
    /// The steady window's length.
    pub steady_duration: Duration,
    /// Requests sent in the steady window and allowed.
    pub steady_allowed: u64,
    /// `steady_allowed` per second of `steady_duration`.
    pub steady_allow_rate: f64,
    /// Requests allowed before the steady window (burst, failsafe quota).
    pub cold_start_allowed: u64,
    /// Requests allowed after the steady window (after the last denial).
    pub tail_allowed: u64,
    /// Responses other than 200 or 429, and failed connections or requests.
    pub errors: u64,
    /// The first of those errors.
    pub first_error: Option<String>,
    /// How `steady_allowed` compares with the expected count.
    pub verdict: Grade,
}

/// The column names of results.tsv: the counts, rates and latency percentiles, then the
/// expected rate, the error, and the cold-start split.
///
/// ```
/// assert_eq!(sluice_loadtest::TSV_COLUMNS[0], "account ID");
/// assert_eq!(sluice_loadtest::TSV_COLUMNS[16], "expected rate");
/// ```
pub const TSV_COLUMNS: [&str; 26] = [
    "account ID",
    "trial",
    "test duration (us)",
    "requests allowed",
    "requests denied",
    "allow rate",
    "deny rate",
    "min latency (us)",
    "p1 latency (us)",
    "p50 latency (us)",
    "p90 latency (us)",
    "p99 latency (us)",
    "p99.9 latency (us)",
    "p99.99 latency (us)",
    "p99.999 latency (us)",
    "max latency (us)",
    "expected rate",
    "error (%)",
    "steady start (us)",
    "steady duration (us)",
    "steady requests allowed",
    "steady allow rate",
    "cold-start requests allowed",
    "tail requests allowed",
    "errors",
    "verdict",
];

impl TrialRow {
    pub(crate) fn new(profile: &Profile, trial: u32, counts: &ProfileTrial, settle: Duration) -> Self {
        let secs = counts.elapsed.as_secs_f64();
        let per_second = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        let offered_over_quota = match profile.expected {
            Expected::Rate(rate) => profile.offered.is_some_and(|offered| offered > rate),
            Expected::Unlimited => false,
        };
        let window = SteadyWindow::of(counts, settle, offered_over_quota);
        let sum =
            |v: &[u64], range: std::ops::Range<usize>| v.get(range).map_or(0, |b| b.iter().sum::<u64>());
        let steady_allowed = sum(&counts.allowed_by_bucket, window.buckets.clone());
        let cold_start_allowed = sum(&counts.allowed_by_bucket, 0..window.buckets.start);
        let steady_start = window.start;
        let steady_duration = window.end.saturating_sub(window.start);
        let steady_secs = steady_duration.as_secs_f64();
        let steady_allow_rate = if steady_secs > 0.0 {
            steady_allowed as f64 / steady_secs
        } else {
            0.0
        };
        let (error_percent, verdict) = judge(
            profile.expected,
            steady_allowed,
            window.saturated,
            steady_secs,
            counts.denied,
        );
        TrialRow {
            profile: profile.name.clone(),
            trial,
            duration: counts.elapsed,
            allowed: counts.allowed,
            denied: counts.denied,
            allow_rate: per_second(counts.allowed),
            deny_rate: per_second(counts.denied),
            latency_us: Latencies::of(&counts.latency_us),
            expected: profile.expected,
            error_percent,
            steady_start,
            steady_duration,
            steady_allowed,
            steady_allow_rate,
            cold_start_allowed,
            tail_allowed: counts.allowed - steady_allowed - cold_start_allowed,
            errors: counts.errors,
            first_error: counts.first_error.clone(),
            verdict,
        }
    }

    /// The row as a line of results.tsv (without the line break).
    pub fn tsv_line(&self) -> String {
        let mut fields = vec![
            self.profile.clone(),
            self.trial.to_string(),
            self.duration.as_micros().to_string(),
            self.allowed.to_string(),
            self.denied.to_string(),
            format!("{:.3}", self.allow_rate),
            format!("{:.3}", self.deny_rate),
        ];
        fields.extend(self.latency_us.as_array().iter().map(u64::to_string));
        fields.extend([
            self.expected.to_string(),
            self.error_percent
                .map_or_else(|| "-".into(), |e| format!("{e:.3}")),
            self.steady_start.as_micros().to_string(),
            self.steady_duration.as_micros().to_string(),
            self.steady_allowed.to_string(),
            format!("{:.3}", self.steady_allow_rate),
            self.cold_start_allowed.to_string(),
            self.tail_allowed.to_string(),
            self.errors.to_string(),
            self.verdict.to_string(),
        ]);
        fields.join("\t")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(allowed: [u64; 11], denied: [u64; 11]) -> ProfileTrial {
        let mut counts = ProfileTrial::new(Duration::from_millis(10));
        assert_eq!(counts.bucket, Duration::from_millis(1));
        counts.allowed_by_bucket = allowed.to_vec();
        counts.denied_by_bucket = denied.to_vec();
        counts.allowed = allowed.iter().sum();
        counts.denied = denied.iter().sum();
        counts.elapsed = Duration::from_millis(10);
        counts
    }

    #[test]
    fn the_steady_window_runs_between_denials_after_settling() {
        let profile = Profile {
            name: "p".into(),
            account: crate::Account::None,
            expected: Expected::Rate(1000.0),
            connections: None,
            offered: None,
        };
        // A burst before 2 ms, denials from 3 ms to 7 ms, one more allowed at 8 ms.
        let c = counts(
            [5, 5, 1, 0, 1, 0, 1, 0, 1, 0, 0],
            [0, 3, 0, 2, 0, 2, 0, 2, 0, 0, 0],
        );
        let row = TrialRow::new(&profile, 1, &c, Duration::from_millis(2));
        assert_eq!(row.steady_start, Duration::from_millis(4));
        assert_eq!(row.steady_duration, Duration::from_millis(3));
        assert_eq!(
            (row.cold_start_allowed, row.steady_allowed, row.tail_allowed),
            (11, 2, 1)
        );
        assert_eq!(row.verdict, Grade::Pass); // 2 where 1000/s grants 3
        // Nothing denied after settling: the window runs to the end, and is not a measurement.
        let c = counts(
            [5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 0],
            [0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        );
        let row = TrialRow::new(&profile, 1, &c, Duration::from_millis(2));
        assert_eq!(
            (row.steady_start, row.steady_duration),
            (Duration::from_millis(2), Duration::from_millis(8))
        );
        assert_eq!(
            (row.cold_start_allowed, row.steady_allowed, row.tail_allowed),
            (10, 8, 0)
        );
        assert_eq!(row.verdict, Grade::NotSaturated);
    }
}
