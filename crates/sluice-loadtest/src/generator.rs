//! The load generator: every profile's connections run concurrently, each sending one request
//! at a time on a keep-alive connection until the trial's end, and counting what came back.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::http::{Connection, HttpError, Response};
use crate::profile::{Account, Profile, ProfileSet};
use crate::target::Target;

/// Time given to the connections to open before a trial's clock starts.
const CONNECT_LEAD: Duration = Duration::from_millis(100);
/// How long after a trial's end a response may still arrive before it counts as an error.
const GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed connect, so a dead server is not hammered.
const RECONNECT_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between a paced connection's requests (a rate too small to matter).
const MAX_PACE_SECS: f64 = 3600.0;
/// Latencies are recorded in microseconds up to this (longer ones are clamped).
const MAX_LATENCY_US: u64 = 60_000_000;
/// At most this many time buckets per trial (so long trials keep memory bounded).
const MAX_BUCKETS: u64 = 100_000;

/// How the trials run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub duration: Duration,
    pub trials: u32,
    /// Connections of each profile, in the set's order.
    pub connections: Vec<u32>,
}

/// What one profile did in one trial, with allowed and denied requests counted per time
/// bucket of their send time, so the steady window can start on any bucket boundary.
#[derive(Debug, Clone)]
pub(crate) struct ProfileTrial {
    /// The trial's planned length: requests are sent until then.
    pub length: Duration,
    /// From the trial's start to its last response.
    pub elapsed: Duration,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub latency_us: Histogram<u64>,
    pub bucket: Duration,
    pub allowed_by_bucket: Vec<u64>,
    pub denied_by_bucket: Vec<u64>,
}

impl ProfileTrial {
    pub(crate) fn new(duration: Duration) -> Self {
        let bucket = bucket_for(duration);
        let buckets = buckets_for(duration, bucket);
        ProfileTrial {
            length: duration,
            elapsed: Duration::ZERO,
            allowed: 0,
            denied: 0,
            errors: 0,
            first_error: None,
            latency_us: new_histogram(),
            bucket,
            allowed_by_bucket: vec![0; buckets],
            denied_by_bucket: vec![0; buckets],
        }
    }

    fn merge(&mut self, other: &ProfileTrial) {
        self.elapsed = self.elapsed.max(other.elapsed);
        self.allowed += other.allowed;
        self.denied += other.denied;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error.clone_from(&other.first_error);
        }
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        for (a, b) in self.allowed_by_bucket.iter_mut().zip(&other.allowed_by_bucket) {
            *a += b;
        }
        for (a, b) in self.denied_by_bucket.iter_mut().zip(&other.denied_by_bucket) {
            *a += b;
        }
    }

    fn error(&mut self, message: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }
}

fn bucket_for(duration: Duration) -> Duration {
    let nanos = sluice::saturating_nanos(duration);
    Duration::from_nanos((nanos / MAX_BUCKETS).max(1_000_000))
}

fn buckets_for(duration: Duration, bucket: Duration) -> usize {
    usize::try_from(duration.as_nanos().div_ceil(bucket.as_nanos())).unwrap_or(usize::MAX) + 1
}

fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).unwrap_or_else(|_| unreachable!())
}

/// Runs every trial; the result is indexed `[trial][profile]`.
pub(crate) async fn run(
    target: &Target,
    set: &ProfileSet,
    plan: &Plan,
    progress: &ProgressBar,
) -> Vec<Vec<ProfileTrial>> {
    let target = Arc::new(target.clone());
    let templates: Vec<Arc<Template>> = set
        .profiles
        .iter()
        .map(|p| Arc::new(Template::new(&target, &set.header_name, p)))
        .collect();
    let done = Arc::new(AtomicU64::new(0));
    let mut trials = Vec::with_capacity(plan.trials as usize);
    for trial in 0..plan.trials {
        progress.set_message(format!("trial {}/{}", trial + 1, plan.trials));
        let start = Instant::now() + CONNECT_LEAD;
        let mut tasks = JoinSet::new();
        for (index, template) in templates.iter().enumerate() {
            let connections = plan.connections[index];
            // Each connection's share of the profile's offered rate: one request per `every`.
            let every = set.profiles[index]
                .offered
                .map(|rate| Duration::from_secs_f64((f64::from(connections) / rate).min(MAX_PACE_SECS)));
            for n in 0..connections {
                let (target, template, done) = (Arc::clone(&target), Arc::clone(template), Arc::clone(&done));
                let duration = plan.duration;
                // Paced connections take turns evenly, not all at once.
                let first_turn = start + every.map_or(Duration::ZERO, |e| e * n / connections);
                tasks.spawn(async move {
                    let stats = drive(&target, &template, start, first_turn, duration, every, &done).await;
                    (index, stats)
                });
            }
        }
        let elapsed_before = u64::from(trial) * millis(plan.duration);
        let mut results: Vec<ProfileTrial> = templates
            .iter()
            .map(|_| ProfileTrial::new(plan.duration))
            .collect();
        let mut ticker = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                joined = tasks.join_next() => match joined {
                    Some(Ok((index, stats))) => results[index].merge(&stats),
                    Some(Err(e)) => tracing::error!("a connection task failed: {e}"),
                    None => break,
                },
                _ = ticker.tick() => {
                    let into_trial = Instant::now().saturating_duration_since(start).min(plan.duration);
                    progress.set_position(elapsed_before + millis(into_trial));
                    progress.set_message(format!(
                        "trial {}/{}, {} responses",
                        trial + 1,
                        plan.trials,
                        done.load(Ordering::Relaxed)
                    ));
                }
            }
        }
        progress.set_position(elapsed_before + millis(plan.duration));
        trials.push(results);
    }
    trials
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One connection's loop: send, read, count, until the deadline; with `every`, the next
/// request waits for its turn (one per `every` from the start) if its last came back sooner.
async fn drive(
    target: &Target,
    template: &Template,
    start: Instant,
    first_turn: Instant,
    duration: Duration,
    every: Option<Duration>,
    done: &AtomicU64,
) -> ProfileTrial {
    let mut turn = first_turn;
    let deadline = start + duration;
    let mut stats = ProfileTrial::new(duration);
    let hard_stop = deadline + GRACE;
    let mut request = Vec::with_capacity(template.len_hint());
    let mut numbers = UniqueNumbers::new();
    let mut connection = connect(target, &mut stats, deadline).await;
    tokio::time::sleep_until(start).await;
    loop {
        let Some(conn) = connection.as_mut() else {
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(RECONNECT_PAUSE).await;
            connection = connect(target, &mut stats, deadline).await;
            continue;
        };
        if let Some(every) = every {
            tokio::time::sleep_until(turn).await;
            turn = Instant::now().max(turn + every);
        }
        template.write(&mut request, &mut numbers);
        let sent = Instant::now();
        if sent >= deadline {
            break;
        }
        let outcome = tokio::time::timeout_at(hard_stop, conn.send(&request)).await;
        let received = Instant::now();
        done.fetch_add(1, Ordering::Relaxed);
        let offset = sent - start;
        let slot = usize::try_from(offset.as_nanos() / stats.bucket.as_nanos()).unwrap_or(usize::MAX);
        match outcome {
            Ok(Ok(Response { status, close })) => {
                let micros = u64::try_from((received - sent).as_micros()).unwrap_or(u64::MAX);
                stats
                    .latency_us
                    .saturating_record(micros.clamp(1, MAX_LATENCY_US));
                match status {
                    200 => {
                        stats.allowed += 1;
                        if let Some(n) = stats.allowed_by_bucket.get_mut(slot) {
                            *n += 1;
                        }
                    }
                    429 => {
                        stats.denied += 1;
                        if let Some(n) = stats.denied_by_bucket.get_mut(slot) {
                            *n += 1;
                        }
                    }
                    other => stats.error(|| format!("status {other} (expected 200 or 429)")),
                }
                if close {
                    connection = connect(target, &mut stats, deadline).await;
                }
            }
            Ok(Err(e)) => {
                stats.error(|| e.to_string());
                connection = None;
            }
            Err(_) => {
                stats.error(|| format!("no response within {GRACE:?} of the trial's end"));
                break;
            }
        }
        stats.elapsed = received - start;
    }
    stats
}

async fn connect(target: &Target, stats: &mut ProfileTrial, deadline: Instant) -> Option<Connection> {
    match tokio::time::timeout_at(deadline, Connection::connect(target.addr)).await {
        Ok(Ok(conn)) => Some(conn),
        Ok(Err(e)) => {
            stats.error(|| format!("connect to {}: {}", target.addr, HttpError::Io(e)));
            None
        }
        Err(_) => None,
    }
}

/// A profile's request, prebuilt; a unique account is written in per request.
enum Template {
    Fixed(Vec<u8>),
    Unique { before: Vec<u8>, after: Vec<u8> },
}

impl Template {
    fn new(target: &Target, header_name: &str, profile: &Profile) -> Self {
        let head = format!("GET {} HTTP/1.1\r\nHost: {}\r\n", target.path, target.host);
        match &profile.account {
            Account::None => Template::Fixed(format!("{head}\r\n").into_bytes()),
            Account::Fixed(value) => {
                Template::Fixed(format!("{head}{header_name}: {value}\r\n\r\n").into_bytes())
            }
            Account::Unique { prefix, suffix } => Template::Unique {
                before: format!("{head}{header_name}: {prefix}").into_bytes(),
                after: format!("{suffix}\r\n\r\n").into_bytes(),
            },
        }
    }

    fn len_hint(&self) -> usize {
        match self {
            Template::Fixed(bytes) => bytes.len(),
            Template::Unique { before, after } => before.len() + 20 + after.len(),
        }
    }

    fn write(&self, out: &mut Vec<u8>, numbers: &mut UniqueNumbers) {
        out.clear();
        match self {
            Template::Fixed(bytes) => out.extend_from_slice(bytes),
            Template::Unique { before, after } => {
                out.extend_from_slice(before);
                let mut digits = [0u8; 20];
                out.extend_from_slice(numbers.next_decimal(&mut digits));
                out.extend_from_slice(after);
            }
        }
    }
}

/// Random-looking numbers that never repeat on one connection (splitmix64 of a counter from a
/// random start: a bijection), so every request names a new account.
struct UniqueNumbers {
    state: u64,
}

impl UniqueNumbers {
    fn new() -> Self {
        UniqueNumbers {
            state: RandomState::new().hash_one(0u8),
        }
    }

    fn next_decimal<'a>(&mut self, digits: &'a mut [u8; 20]) -> &'a [u8] {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (z % 10) as u8;
            z /= 10;
            if z == 0 {
                break;
            }
        }
        &digits[i..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_numbers_do_not_repeat() {
        let mut numbers = UniqueNumbers::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let mut digits = [0u8; 20];
            assert!(seen.insert(numbers.next_decimal(&mut digits).to_vec()));
        }
    }

    #[test]
    fn buckets_cover_the_trial() {
        let d = Duration::from_secs(10);
        assert_eq!(bucket_for(d), Duration::from_millis(1));
        assert_eq!(buckets_for(d, bucket_for(d)), 10_001);
        let long = Duration::from_secs(1000);
        assert_eq!(bucket_for(long), Duration::from_millis(10));
    }
}
