//! From counts to results: one row per profile and trial (results.tsv), a verdict against the
//! expected rate, and the summary printed at the end.
//!
//! The start of every trial is kept apart as its **cold start**: the first `--settle` of it, and
//! on to the profile's first denial after that (its burst may take a while to use up). What
//! was allowed then (the burst, admissions under the failsafe quota while the account's quota
//! was being fetched) is reported in its own column. The **steady** window runs from there to
//! the profile's last denial (see `SteadyWindow`); its allow rate is what is compared with the
//! expected rate. What was allowed after the last denial is the **tail**.

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use hdrhistogram::Histogram;

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

/// How a profile's steady allow rate compares with the rate it should get.
///
/// # Example
/// ```
/// assert_eq!(sluice_loadtest::Verdict::NotSaturated.to_string(), "NOT SATURATED");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Within 1% or 1 request of the expected count.
    Pass,
    /// An unlimited profile (control, bypass) that was never denied.
    Unlimited,
    /// Nothing was denied after the cold start, so the limit was never reached (the offered
    /// load was below the quota, or a burst was not used up yet) and the rate was not tested.
    NotSaturated,
    /// Off by more than 1% and 1 request, or an unlimited profile that was denied.
    Fail,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Unlimited => "UNLIMITED",
            Verdict::NotSaturated => "NOT SATURATED",
            Verdict::Fail => "FAIL",
        })
    }
}

/// One profile in one trial: a line of results.tsv (see [`TSV_COLUMNS`]).
///
/// The allowed requests split into `cold_start_allowed + steady_allowed + tail_allowed`.
///
/// ```
/// fn check(row: &sluice_loadtest::TrialRow) {
///     assert_eq!(row.cold_start_allowed + row.steady_allowed + row.tail_allowed, row.allowed);
///     assert_eq!(row.tsv_line().split('\t').count(), sluice_loadtest::TSV_COLUMNS.len());
/// }
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
    pub verdict: Verdict,
}

/// The column names of results.tsv: seed 000's, then the expected rate, the error, and the
/// cold-start split.
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
        let window = SteadyWindow::of(counts, settle);
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

/// The part of a trial whose allowed count measures the limit's rate.
///
/// When the profile was denied after the settling time, the window runs from the bucket after
/// its first such denial to the bucket of its last denial: at both ends the profile's allowance
/// was used up, so what was allowed in between is what the quota granted in that time, whatever
/// burst or failsafe quota came before, and however unevenly the load arrived meanwhile. With
/// no denial after the settling time, the limit was not reached: the window runs from the
/// settling time to the trial's end and only shows the load. Both ends are bucket boundaries,
/// so the counts are exact.
struct SteadyWindow {
    buckets: std::ops::Range<usize>,
    start: Duration,
    end: Duration,
    saturated: bool,
}

impl SteadyWindow {
    fn of(counts: &ProfileTrial, settle: Duration) -> Self {
        let at =
            |bucket: usize| (counts.bucket * u32::try_from(bucket).unwrap_or(u32::MAX)).min(counts.length);
        let settle_bucket =
            usize::try_from(settle.as_nanos().div_ceil(counts.bucket.as_nanos())).unwrap_or(usize::MAX);
        let denied_after_settle =
            |(i, denied): (usize, &u64)| (i >= settle_bucket && *denied > 0).then_some(i);
        let first = counts
            .denied_by_bucket
            .iter()
            .enumerate()
            .find_map(denied_after_settle);
        let last = counts
            .denied_by_bucket
            .iter()
            .enumerate()
            .rev()
            .find_map(denied_after_settle);
        match (first, last) {
            (Some(first), Some(last)) => {
                let buckets = first + 1..last.max(first + 1);
                SteadyWindow {
                    start: at(buckets.start),
                    end: at(buckets.end),
                    buckets,
                    saturated: true,
                }
            }
            _ => SteadyWindow {
                buckets: settle_bucket..counts.allowed_by_bucket.len(),
                start: at(settle_bucket),
                end: counts.length,
                saturated: false,
            },
        }
    }
}

/// The error in percent and the verdict of a steady window.
///
/// The count allowed must be within 1% of `rate × seconds`, or within 1 request of the whole
/// counts next to it (`floor − 1 ..= ceil + 1`): a window's ends cut the quota's admissions at
/// arbitrary instants, so a token bucket may grant one more or one fewer than the count its
/// rate gives the window.
fn judge(
    expected: Expected,
    allowed: u64,
    saturated: bool,
    secs: f64,
    denied: u64,
) -> (Option<f64>, Verdict) {
    let Expected::Rate(rate) = expected else {
        return (
            None,
            if denied == 0 {
                Verdict::Unlimited
            } else {
                Verdict::Fail
            },
        );
    };
    let expected_count = rate * secs;
    let diff = allowed as f64 - expected_count;
    let error = if rate > 0.0 && secs > 0.0 {
        Some((allowed as f64 / secs - rate) / rate * 100.0)
    } else if allowed == 0 {
        Some(0.0)
    } else {
        None
    };
    let verdict = if !saturated || secs <= 0.0 {
        Verdict::NotSaturated
    } else if diff.abs() <= expected_count * 0.01
        || (expected_count.floor() - 1.0..=expected_count.ceil() + 1.0).contains(&(allowed as f64))
    {
        Verdict::Pass
    } else {
        Verdict::Fail
    };
    (error, verdict)
}

/// A profile over all its trials: a line of the summary.
///
/// ```
/// fn failed(summary: &sluice_loadtest::ProfileSummary) -> bool {
///     summary.verdict == sluice_loadtest::Verdict::Fail || summary.errors > 0
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSummary {
    /// The profile's name.
    pub profile: String,
    /// The rate it should get.
    pub expected: Expected,
    /// Steady allowed per second, over all trials' steady windows.
    pub measured: f64,
    /// Error of `measured` in percent, where defined.
    pub error_percent: Option<f64>,
    /// Allowed in the steady windows, all trials.
    pub steady_allowed: u64,
    /// What the expected rate grants in the steady windows (`None` when unlimited).
    pub steady_expected: Option<f64>,
    /// Allowed during cold starts, all trials.
    pub cold_start_allowed: u64,
    /// Allowed, all trials.
    pub allowed: u64,
    /// Denied, all trials.
    pub denied: u64,
    /// Errors, all trials.
    pub errors: u64,
    /// The worst verdict of its trials.
    pub verdict: Verdict,
}

impl ProfileSummary {
    fn of(rows: &[&TrialRow]) -> Option<Self> {
        let first = rows.first()?;
        let secs: f64 = rows.iter().map(|r| r.steady_duration.as_secs_f64()).sum();
        let steady: u64 = rows.iter().map(|r| r.steady_allowed).sum();
        let measured = if secs > 0.0 { steady as f64 / secs } else { 0.0 };
        let error_percent = match first.expected {
            Expected::Rate(rate) if rate > 0.0 => Some((measured - rate) / rate * 100.0),
            Expected::Rate(_) if steady == 0 => Some(0.0),
            _ => None,
        };
        Some(ProfileSummary {
            profile: first.profile.clone(),
            expected: first.expected,
            measured,
            error_percent,
            steady_allowed: steady,
            steady_expected: match first.expected {
                Expected::Rate(rate) => Some(rate * secs),
                Expected::Unlimited => None,
            },
            cold_start_allowed: rows.iter().map(|r| r.cold_start_allowed).sum(),
            allowed: rows.iter().map(|r| r.allowed).sum(),
            denied: rows.iter().map(|r| r.denied).sum(),
            errors: rows.iter().map(|r| r.errors).sum(),
            verdict: rows.iter().map(|r| r.verdict).max().unwrap_or(Verdict::Fail),
        })
    }
}

/// Everything a load test measured, and where it was written.
///
/// Its `Display` is the summary the CLI prints: one line per profile with the expected and
/// measured rate, the error, the cold-start admissions and the verdict, then the files.
#[derive(Debug, Clone)]
pub struct Report {
    /// The URL loaded.
    pub url: String,
    /// Length of each trial.
    pub duration: Duration,
    /// The settling window.
    pub settle: Duration,
    /// One row per profile and trial, trial by trial.
    pub rows: Vec<TrialRow>,
    /// One per profile, in the set's order.
    pub profiles: Vec<ProfileSummary>,
    /// results.tsv, rates.png, latencies.png.
    pub files: Vec<PathBuf>,
}

impl Report {
    pub(crate) fn new(
        url: String,
        duration: Duration,
        settle: Duration,
        profiles: &[Profile],
        trials: &[Vec<ProfileTrial>],
    ) -> Self {
        let rows: Vec<TrialRow> = trials
            .iter()
            .enumerate()
            .flat_map(|(t, counts)| {
                profiles
                    .iter()
                    .zip(counts)
                    .map(move |(p, c)| TrialRow::new(p, u32::try_from(t + 1).unwrap_or(u32::MAX), c, settle))
            })
            .collect();
        let summaries = profiles
            .iter()
            .filter_map(|p| {
                ProfileSummary::of(&rows.iter().filter(|r| r.profile == p.name).collect::<Vec<_>>())
            })
            .collect();
        Report {
            url,
            duration,
            settle,
            rows,
            profiles: summaries,
            files: Vec::new(),
        }
    }

    /// No profile failed and no request had an error (`NOT SATURATED` does not fail a run:
    /// the limit was simply not reached).
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// let report = sluice_loadtest::Report {
    ///     url: "http://127.0.0.1:8080/".into(),
    ///     duration: Duration::from_secs(10),
    ///     settle: Duration::from_secs(1),
    ///     rows: vec![],
    ///     profiles: vec![],
    ///     files: vec![],
    /// };
    /// assert!(report.passed());
    /// ```
    pub fn passed(&self) -> bool {
        self.profiles
            .iter()
            .all(|p| p.verdict != Verdict::Fail && p.errors == 0)
    }

    /// results.tsv: the header and one line per row.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let report = sluice_loadtest::Report {
    ///     url: "http://127.0.0.1:8080/".into(),
    ///     duration: Duration::from_secs(10),
    ///     settle: Duration::from_secs(1),
    ///     rows: vec![],
    ///     profiles: vec![],
    ///     files: vec![],
    /// };
    /// assert!(report.tsv().starts_with("account ID\ttrial\ttest duration (us)\t"));
    /// ```
    pub fn tsv(&self) -> String {
        let mut out = TSV_COLUMNS.join("\t");
        out.push('\n');
        for row in &self.rows {
            out.push_str(&row.tsv_line());
            out.push('\n');
        }
        out
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let trials = self.rows.iter().map(|r| r.trial).max().unwrap_or(0);
        writeln!(
            f,
            "{} profiles, {trials} trial(s) of {:?} against {}",
            self.profiles.len(),
            self.duration,
            self.url
        )?;
        let width = self
            .profiles
            .iter()
            .map(|p| p.profile.len())
            .max()
            .unwrap_or(7)
            .max(7);
        writeln!(
            f,
            "{:<width$}  {:>10}  {:>12}  {:>9}  {:>17}  {:>10}  {:>10}  {:>10}  {:>6}  verdict",
            "profile",
            "expected/s",
            "measured/s",
            "error %",
            "window: got/quota",
            "cold start",
            "allowed",
            "denied",
            "errors"
        )?;
        for p in &self.profiles {
            let error = p.error_percent.map_or_else(|| "-".into(), |e| format!("{e:+.2}"));
            let quota = p
                .steady_expected
                .map_or_else(|| "-".into(), |e| format!("{e:.1}"));
            writeln!(
                f,
                "{:<width$}  {:>10}  {:>12.3}  {:>9}  {:>17}  {:>10}  {:>10}  {:>10}  {:>6}  {}",
                p.profile,
                p.expected.to_string(),
                p.measured,
                error,
                format!("{}/{quota}", p.steady_allowed),
                p.cold_start_allowed,
                p.allowed,
                p.denied,
                p.errors,
                p.verdict
            )?;
        }
        let mut notes = String::new();
        for row in self.rows.iter().filter(|r| r.errors > 0) {
            let _ = writeln!(
                notes,
                "{} trial {}: {} error(s), first: {}",
                row.profile,
                row.trial,
                row.errors,
                row.first_error.as_deref().unwrap_or("?")
            );
        }
        f.write_str(&notes)?;
        writeln!(
            f,
            "measured/s: allowed per second in the steady windows, from the first denial after the first \
             {:?} of a trial to its last denial (window: allowed there / what the quota grants there); \
             cold start: allowed before. PASS: every trial within 1% or 1 request.",
            self.settle
        )?;
        if !self.files.is_empty() {
            let files: Vec<String> = self.files.iter().map(|p| p.display().to_string()).collect();
            writeln!(f, "wrote {}", files.join(", "))?;
        }
        Ok(())
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
        assert_eq!(row.verdict, Verdict::Pass); // 2 where 1000/s grants 3
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
        assert_eq!(row.verdict, Verdict::NotSaturated);
    }

    #[test]
    fn judges_within_one_percent_or_one_request() {
        // 1/s over 9 s: 8, 9, 10 pass; 11 fails; 5 without denials was never saturated.
        for allowed in [8, 9, 10] {
            assert_eq!(judge(Expected::Rate(1.0), allowed, true, 9.0, 5).1, Verdict::Pass);
        }
        assert_eq!(judge(Expected::Rate(1.0), 11, true, 9.0, 5).1, Verdict::Fail);
        assert_eq!(
            judge(Expected::Rate(1.0), 5, false, 9.0, 0).1,
            Verdict::NotSaturated
        );
        // Above the rate but never denied: a burst still being used, not a measured rate.
        assert_eq!(
            judge(Expected::Rate(1.0), 15, false, 9.0, 4).1,
            Verdict::NotSaturated
        );
        assert_eq!(judge(Expected::Rate(1.0), 5, true, 9.0, 3).1, Verdict::Fail);
        // 10/s over 1.499 s (14.99): 13 to 16 pass.
        assert_eq!(judge(Expected::Rate(10.0), 16, true, 1.499, 5).1, Verdict::Pass);
        assert_eq!(judge(Expected::Rate(10.0), 13, true, 1.499, 5).1, Verdict::Pass);
        assert_eq!(judge(Expected::Rate(10.0), 17, true, 1.499, 5).1, Verdict::Fail);
        assert_eq!(judge(Expected::Rate(10.0), 12, true, 1.499, 5).1, Verdict::Fail);
        // 1000/s over 10 s: ±100 passes.
        assert_eq!(
            judge(Expected::Rate(1000.0), 10_100, true, 10.0, 1).1,
            Verdict::Pass
        );
        assert_eq!(
            judge(Expected::Rate(1000.0), 10_101, true, 10.0, 1).1,
            Verdict::Fail
        );
        // Unlimited: never denied, or it failed.
        assert_eq!(
            judge(Expected::Unlimited, 100, false, 9.0, 0).1,
            Verdict::Unlimited
        );
        assert_eq!(judge(Expected::Unlimited, 100, true, 9.0, 1).1, Verdict::Fail);
        // Quota 0: the error is 0% when nothing was allowed.
        assert_eq!(
            judge(Expected::Rate(0.0), 0, true, 9.0, 9),
            (Some(0.0), Verdict::Pass)
        );
        assert_eq!(judge(Expected::Rate(0.0), 2, true, 9.0, 9), (None, Verdict::Fail));
    }
}
