//! What the proxy counts for `/metrics`: the answers by status code (the upstream's, or the
//! 502 and 504 sluice gives for it), why upstreams failed, and how long response heads took.
//! Kept across reloads, like the other counts the server shows.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The upper bounds, in seconds, of the `sluice_upstream_seconds` buckets.
pub const UPSTREAM_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// Why an upstream gave no answer (or broke its body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No connection: refused, unreachable, not resolved, TLS refused (502).
    Connect,
    /// No connection within the connect timeout (504).
    ConnectTimeout,
    /// No response head within the head timeout (504).
    HeadTimeout,
    /// The connection broke or the upstream spoke garbage before the head (502).
    Broken,
}

impl Failure {
    /// Every failure, in the order of the metric's series.
    pub const ALL: [Failure; 4] = [
        Failure::Connect,
        Failure::ConnectTimeout,
        Failure::HeadTimeout,
        Failure::Broken,
    ];

    /// Its `reason` label.
    pub fn name(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::HeadTimeout => "head_timeout",
            Failure::Broken => "broken",
        }
    }
}

/// The proxy's counts.
#[derive(Debug)]
pub struct UpstreamStats {
    /// Answers by status code 100..=599 (index: code − 100).
    codes: [AtomicU64; 500],
    failures: [AtomicU64; 4],
    /// Heads by bucket, the last for those above every bound.
    buckets: [AtomicU64; UPSTREAM_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for UpstreamStats {
    fn default() -> Self {
        Self {
            codes: std::array::from_fn(|_| AtomicU64::new(0)),
            failures: Default::default(),
            buckets: Default::default(),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// One reading of [`UpstreamStats`].
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamSnapshot {
    /// `(code, answers)` for every code seen.
    pub codes: Vec<(u16, u64)>,
    /// `(reason, count)` for every failure kind.
    pub failures: Vec<(&'static str, u64)>,
    /// `(upper bound, heads in that bucket alone)`, then the count and sum of all.
    pub buckets: Vec<(f64, u64)>,
    /// Every head timed.
    pub count: u64,
    /// Their total time in seconds.
    pub sum_seconds: f64,
}

impl UpstreamStats {
    /// Counts an answer given with `code`.
    pub fn answered(&self, code: http::StatusCode) {
        if let Some(counter) = self.codes.get(usize::from(code.as_u16()).wrapping_sub(100)) {
            counter.fetch_add(1, Relaxed);
        }
    }

    /// Counts a failure (its answer is counted apart, by [`UpstreamStats::answered`]).
    pub fn failed(&self, failure: Failure) {
        let at = Failure::ALL.iter().position(|f| *f == failure).unwrap_or(0);
        self.failures[at].fetch_add(1, Relaxed);
    }

    /// Times a response head that came.
    pub fn timed(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = (UPSTREAM_BUCKETS.iter())
            .position(|bound| seconds <= *bound)
            .unwrap_or(UPSTREAM_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> UpstreamSnapshot {
        let codes = (self.codes.iter().enumerate())
            .filter_map(|(i, count)| {
                let count = count.load(Relaxed);
                let code = u16::try_from(i + 100).ok()?;
                (count > 0).then_some((code, count))
            })
            .collect();
        let failures = (Failure::ALL.iter().zip(&self.failures))
            .map(|(failure, count)| (failure.name(), count.load(Relaxed)))
            .collect();
        let own: Vec<u64> = self.buckets.iter().map(|count| count.load(Relaxed)).collect();
        let buckets = (UPSTREAM_BUCKETS.iter().chain([&f64::INFINITY]))
            .zip(&own)
            .map(|(bound, count)| (*bound, *count))
            .collect();
        UpstreamSnapshot {
            codes,
            failures,
            buckets,
            count: own.iter().sum(),
            sum_seconds: Duration::from_nanos(self.sum_ns.load(Relaxed)).as_secs_f64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_codes_failures_and_times() {
        let stats = UpstreamStats::default();
        stats.answered(http::StatusCode::OK);
        stats.answered(http::StatusCode::OK);
        stats.answered(http::StatusCode::BAD_GATEWAY);
        stats.failed(Failure::HeadTimeout);
        stats.timed(Duration::from_micros(700));
        stats.timed(Duration::from_secs(100));
        let read = stats.snapshot();
        assert_eq!(read.codes, [(200, 2), (502, 1)]);
        assert_eq!(read.failures[2], ("head_timeout", 1));
        assert_eq!(read.count, 2);
        assert_eq!(read.buckets[1], (0.001, 1));
        assert_eq!(read.buckets.last(), Some(&(f64::INFINITY, 1)));
        assert!((read.sum_seconds - 100.0007).abs() < 1e-9);
    }
}
