//! What the engine counts about its own decisions, for an exporter to read: per rule, the
//! requests allowed, denied and denied in shadow mode, and the hits they asked; per front
//! end, a latency histogram; per rule, the keys denied most over about the last minute, in
//! constant memory however many keys there are.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use sluice::{Clock, MonotonicClock};

/// A rule's decisions so far.
///
/// # Example
/// ```
/// let counts = sluice_service::RuleCounts::default();
/// assert_eq!(counts.allowed + counts.denied, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleCounts {
    /// Requests the rule admitted.
    pub allowed: u64,
    /// Requests the rule denied.
    pub denied: u64,
    /// Requests the rule would have denied, were it not in shadow mode (admitted).
    pub shadow_denied: u64,
    /// Hits asked of the rule, whatever the answer.
    pub hits: u64,
    /// Requests the rule admitted that left less than a fifth of its capacity
    /// ([`Standing::Near`]): the ones about to be limited.
    pub near_limit: u64,
}

impl std::ops::AddAssign for RuleCounts {
    /// Adds `other`'s counts (saturating).
    fn add_assign(&mut self, other: Self) {
        self.allowed = self.allowed.saturating_add(other.allowed);
        self.denied = self.denied.saturating_add(other.denied);
        self.shadow_denied = self.shadow_denied.saturating_add(other.shadow_denied);
        self.hits = self.hits.saturating_add(other.hits);
        self.near_limit = self.near_limit.saturating_add(other.near_limit);
    }
}

/// Where a decision left its limit, from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Standing {
    /// Admitted, a fifth of the capacity or more left.
    Within,
    /// Admitted, less than a fifth of the capacity left.
    Near,
    /// Over the limit (denied, or counted as denied in shadow mode).
    Over,
}

impl Standing {
    /// The standing of a decision under a limit of `capacity`.
    pub(crate) fn of(decision: &sluice::Decision, capacity: u64) -> Self {
        if !decision.is_allowed() {
            Self::Over
        } else if u128::from(decision.remaining()) * 5 < u128::from(capacity) {
            Self::Near
        } else {
            Self::Within
        }
    }
}

/// The most per-value series one rule keeps (`detailed_metric`, `value_to_metric`): values
/// past them are counted in the rule's own series only.
pub const MAX_LABELS: usize = 256;

/// How many keys a rule's heavy-hitters table holds per window.
pub const TOP_KEYS: usize = 32;

/// How long one window of the heavy-hitters table lasts, in nanoseconds of
/// [`MonotonicClock`]; a report covers the last two.
const TOP_WINDOW: u64 = 30_000_000_000;

/// One rule's counters, kept across reloads while the rule keeps its place.
#[derive(Default)]
pub(crate) struct RuleStats {
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
    hits: AtomicU64,
    near_limit: AtomicU64,
    top: Mutex<TopWindows>,
    /// Per metric label ([`sluice_descriptors::metric_label`]), at most [`MAX_LABELS`].
    labels: Mutex<Vec<(String, RuleCounts)>>,
}

impl RuleStats {
    /// Counts one decision of `hits` at `now` ([`MonotonicClock`] nanoseconds, read here if
    /// `None`); a denial's key, written by `key`, goes into the heavy hitters.
    pub(crate) fn record(
        &self,
        hits: u64,
        standing: Standing,
        shadow: bool,
        now: Option<u64>,
        key: impl FnOnce(&mut String),
    ) {
        self.hits.fetch_add(hits, Relaxed);
        let over = standing == Standing::Over;
        let counter = match (over, shadow) {
            (false, _) => &self.allowed,
            (true, true) => &self.shadow_denied,
            (true, false) => &self.denied,
        };
        counter.fetch_add(1, Relaxed);
        if standing == Standing::Near {
            self.near_limit.fetch_add(1, Relaxed);
        }
        if over {
            let mut top = self.top.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            // Written into the table's own buffer: a key already held allocates nothing.
            let mut text = std::mem::take(&mut top.scratch);
            text.clear();
            key(&mut text);
            top.count(&text, now.unwrap_or_else(|| MonotonicClock.now()));
            top.scratch = text;
        }
    }

    /// Counts one decision of `hits` under the per-value series `label`, if it has one or
    /// there is room for it.
    pub(crate) fn record_label(&self, label: String, hits: u64, over: bool, shadow: bool) {
        let mut labels = self
            .labels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = match labels.iter().position(|(l, _)| *l == label) {
            Some(at) => at,
            None if labels.len() < MAX_LABELS => {
                labels.push((label, RuleCounts::default()));
                labels.len() - 1
            }
            None => return,
        };
        let counts = &mut labels[at].1;
        counts.hits = counts.hits.saturating_add(hits);
        let counter = match (over, shadow) {
            (false, _) => &mut counts.allowed,
            (true, true) => &mut counts.shadow_denied,
            (true, false) => &mut counts.denied,
        };
        *counter = counter.saturating_add(1);
    }

    /// The per-value series so far.
    pub(crate) fn labels(&self) -> Vec<(String, RuleCounts)> {
        self.labels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(crate) fn counts(&self) -> RuleCounts {
        RuleCounts {
            allowed: self.allowed.load(Relaxed),
            denied: self.denied.load(Relaxed),
            shadow_denied: self.shadow_denied.load(Relaxed),
            hits: self.hits.load(Relaxed),
            near_limit: self.near_limit.load(Relaxed),
        }
    }

    /// The keys denied most over the last one or two windows, most first (counts may be over
    /// by up to the smallest count the table held: space-saving's bound).
    pub(crate) fn top(&self, n: usize) -> Vec<(String, u64)> {
        let mut top = self.top.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        top.rotate(MonotonicClock.now());
        let mut merged: Vec<(String, u64)> = top.previous.entries.clone();
        for (key, count) in &top.current.entries {
            match merged.iter_mut().find(|(k, _)| k == key) {
                Some((_, total)) => *total += count,
                None => merged.push((key.clone(), *count)),
            }
        }
        merged.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        merged.truncate(n);
        merged
    }
}

/// The current window and the one before it.
#[derive(Default)]
struct TopWindows {
    started: Option<u64>,
    current: SpaceSaving,
    previous: SpaceSaving,
    /// Where a denial's key is written before it is looked up.
    scratch: String,
}

impl TopWindows {
    #[inline]
    fn rotate(&mut self, now: u64) {
        let started = *self.started.get_or_insert(now);
        let age = now.saturating_sub(started);
        if age >= TOP_WINDOW * 2 {
            // Nothing for two windows: both are old.
            self.previous = SpaceSaving::default();
            self.current = SpaceSaving::default();
            self.started = Some(now);
        } else if age >= TOP_WINDOW {
            self.previous = std::mem::take(&mut self.current);
            self.started = Some(started + TOP_WINDOW);
        }
    }

    fn count(&mut self, key: &str, now: u64) {
        self.rotate(now);
        self.current.count(key);
    }
}

/// Space-saving (Metwally et al.): at most [`TOP_KEYS`] keys; a newcomer takes the place of
/// the least counted one and its count plus one, so every key counted more than
/// total / [`TOP_KEYS`] times is held.
#[derive(Default, Clone)]
struct SpaceSaving {
    entries: Vec<(String, u64)>,
}

impl SpaceSaving {
    fn count(&mut self, key: &str) {
        if let Some((_, count)) = self.entries.iter_mut().find(|(k, _)| k == key) {
            *count += 1;
            return;
        }
        if self.entries.len() < TOP_KEYS {
            self.entries.push((key.to_owned(), 1));
            return;
        }
        if let Some((least, count)) = self.entries.iter_mut().min_by_key(|(_, count)| *count) {
            // The place's own allocation, reused.
            least.clear();
            least.push_str(key);
            *count += 1;
        }
    }
}

/// Where a decision was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrontEnd {
    /// The HTTP layer (`sluice serve`'s own requests).
    Http,
    /// Envoy's RLS v3 over gRPC.
    Rls,
    /// The HTTP check API.
    CheckApi,
}

impl FrontEnd {
    /// Every front end.
    pub const ALL: [FrontEnd; 3] = [FrontEnd::Http, FrontEnd::Rls, FrontEnd::CheckApi];

    /// Its name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            FrontEnd::Http => "http",
            FrontEnd::Rls => "rls",
            FrontEnd::CheckApi => "check_api",
        }
    }
}

/// The upper bounds of the latency buckets, in seconds (the last bucket is unbounded).
pub const LATENCY_BUCKETS: [f64; 14] = [
    5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0,
];

/// [`LATENCY_BUCKETS`] in whole nanoseconds: a decision is placed by integer compares.
const LATENCY_BUCKETS_NS: [u64; LATENCY_BUCKETS.len()] = {
    let mut ns = [0; LATENCY_BUCKETS.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = (LATENCY_BUCKETS[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    ns
};

/// A latency histogram of fixed buckets ([`LATENCY_BUCKETS`]), lock-free.
#[derive(Default)]
pub(crate) struct Latency {
    /// One count per bucket and one past the last.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

/// A histogram read at one time: each bucket's cumulative count, the count and the sum.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencySnapshot {
    /// `(upper bound in seconds, decisions at most that long)`, cumulative, per
    /// [`LATENCY_BUCKETS`].
    pub buckets: Vec<(f64, u64)>,
    /// Every decision timed.
    pub count: u64,
    /// Their total time, in seconds.
    pub sum_seconds: f64,
}

impl Latency {
    pub(crate) fn record(&self, took: Duration) {
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BUCKETS_NS
            .iter()
            .position(|bound| nanos <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(nanos, Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LatencySnapshot {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len());
        for (bound, count) in LATENCY_BUCKETS.iter().zip(&self.buckets) {
            total += count.load(Relaxed);
            buckets.push((*bound, total));
        }
        let count = total + self.buckets[LATENCY_BUCKETS.len()].load(Relaxed);
        LatencySnapshot {
            buckets,
            count,
            sum_seconds: self.sum_ns.load(Relaxed) as f64 / 1e9,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_saving_keeps_every_heavy_key_in_constant_memory() {
        let mut table = SpaceSaving::default();
        // 100 000 distinct keys once each, and three heavy keys 5 000 times each.
        for i in 0..100_000u32 {
            table.count(&format!("k{i}"));
            if i % 20 == 0 {
                for heavy in ["alice", "bob", "carol"] {
                    table.count(heavy);
                }
            }
        }
        assert_eq!(table.entries.len(), TOP_KEYS);
        let mut held: Vec<_> = table
            .entries
            .iter()
            .filter(|(_, c)| *c >= 5000)
            .map(|(k, _)| k.as_str())
            .collect();
        held.sort_unstable();
        assert_eq!(held, ["alice", "bob", "carol"]);
    }

    #[test]
    fn the_top_covers_two_windows_and_forgets_older_ones() {
        let stats = RuleStats::default();
        let start = MonotonicClock.now();
        let mut windows = TopWindows::default();
        windows.count("old", start);
        windows.count("mid", start + TOP_WINDOW);
        windows.count("mid", start + TOP_WINDOW);
        windows.count("new", start + TOP_WINDOW * 2);
        // "old" was two windows ago: gone; "mid" in the previous window; "new" now.
        let keys: Vec<&str> = windows
            .previous
            .entries
            .iter()
            .chain(&windows.current.entries)
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, ["mid", "new"]);
        windows.rotate(start + TOP_WINDOW * 5);
        assert!(windows.previous.entries.is_empty() && windows.current.entries.is_empty());
        // Through the rule's counters: denials only, merged and ordered.
        for key in ["a", "b", "b"] {
            stats.record(1, Standing::Over, false, None, |text| text.push_str(key));
        }
        stats.record(3, Standing::Near, false, None, |text| text.push('c'));
        stats.record(1, Standing::Over, true, None, |text| text.push('b'));
        assert_eq!(stats.top(10), [("b".to_owned(), 3), ("a".to_owned(), 1)]);
        assert_eq!(
            stats.counts(),
            RuleCounts {
                allowed: 1,
                denied: 3,
                shadow_denied: 1,
                hits: 7,
                near_limit: 1,
            }
        );
    }

    #[test]
    fn latency_buckets_are_cumulative() {
        let latency = Latency::default();
        latency.record(Duration::from_micros(3));
        latency.record(Duration::from_micros(30));
        latency.record(Duration::from_secs(3));
        let snapshot = latency.snapshot();
        assert_eq!(snapshot.count, 3);
        assert_eq!(snapshot.buckets[0], (5e-6, 1));
        assert_eq!(snapshot.buckets[3], (5e-5, 2));
        assert_eq!(snapshot.buckets.last(), Some(&(1.0, 2)));
        assert!((snapshot.sum_seconds - 3.000_033).abs() < 1e-9);
        // Each bound in nanoseconds is the bound in seconds, and holds its own value: a
        // decision as long as a bound is counted in that bound's bucket, a nanosecond more in
        // the next.
        for (i, (&seconds, &nanos)) in LATENCY_BUCKETS.iter().zip(&LATENCY_BUCKETS_NS).enumerate() {
            assert_eq!(Duration::from_nanos(nanos).as_secs_f64(), seconds);
            let at = Latency::default();
            at.record(Duration::from_nanos(nanos));
            at.record(Duration::from_nanos(nanos + 1));
            let buckets = at.snapshot().buckets;
            assert_eq!(buckets[i].1, 1, "bucket {i}");
            assert_eq!(
                i.checked_sub(1).map(|before| buckets[before].1),
                i.checked_sub(1).map(|_| 0)
            );
        }
    }
}
