//! From counts to results: one row per profile and trial (results.tsv, `row`), a verdict
//! against the expected rate over each trial's steady window (`steady`), and the summary
//! printed at the end.

mod row;
mod steady;

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::time::Duration;

pub use row::{Latencies, TSV_COLUMNS, TrialRow};
pub use steady::Grade;

use crate::generator::ProfileTrial;
use crate::profile::{Expected, Profile};

/// A profile over all its trials: a line of the summary.
///
/// ```
/// fn failed(summary: &sluice_loadtest::ProfileSummary) -> bool {
///     summary.verdict == sluice_loadtest::Grade::Fail || summary.errors > 0
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
    pub verdict: Grade,
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
            verdict: rows.iter().map(|r| r.verdict).max().unwrap_or(Grade::Fail),
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
            .all(|p| p.verdict != Grade::Fail && p.errors == 0)
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
