//! The buckets every RLQS stream shares, and one stream's reports read against them.
//!
//! A stream's first report gives its domain. Each bucket id is matched as a descriptor (its
//! entries as the descriptor's entries) against the engine's rules in that domain, by the
//! rules' own walk ([`sluice_descriptors::DomainRules::find`]); since a bucket id is a map and
//! its order means nothing, the entries are tried in key order first and then, for ids of up
//! to [`MAX_REORDERED`] entries, in every other order: the first order that reaches a rule
//! wins. What the rule says:
//!
//! - a quota: a token bucket per client, its rate that client's max-min fair share of the
//!   quota's rate ([`fair_shares`]) by the demand each client's reports show; stacked quotas
//!   beyond the first are not applied;
//! - `unlimited`, `shadow_mode`, or the engine in shadow mode: a blanket `ALLOW_ALL`;
//! - a quota of 0: a blanket `DENY_ALL`;
//! - no rule (or no such domain): `abandon_action`. The server has nothing to enforce, so the
//!   data plane forgets the bucket and falls back to its own `no_assignment_behavior`; it
//!   subscribes again on the bucket's next request, so a rule added by a later reload is
//!   found then. A bucket whose rule a reload removed is abandoned at its next report.
//!
//! Each assignment lives [`TTL_INTERVALS`] report intervals (at least [`MIN_TTL`]), the
//! interval read from the reports' `time_elapsed`. Shares are worked out again on every
//! report; a client whose share moves by more than [`SHARE_TOLERANCE`] is sent its new one at
//! once on its stream (a bounded queue: a push that finds it full is dropped, and the client
//! has its share at its next report). Inside the tolerance the assignment is sent unchanged,
//! so the data plane only extends it instead of starting a new token bucket. A client that
//! leaves, or stops reporting a bucket, keeps its share reserved until its last assignment
//! expires; then the others share it ([`Quotas::sweep`]).
//!
//! The buckets are sharded, each shard behind a mutex held while one bucket's shares are
//! worked out: RLQS reports arrive every few seconds per client, not per request, so this is
//! off the request path.
//!
//! (Over 600 lines: the shared buckets and a stream's reading of its reports against them
//! work on the same shard, bucket and client state; apart, each would open the other's
//! fields.)

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::BuildHasher;
#[cfg(feature = "grpc")]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use sluice_descriptors::{DomainRules, Entry, Limit, Rule};
use tokio::sync::mpsc;

use super::proto::{
    self, BlanketRule, BucketAction, BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
    RateLimitStrategy, Strategy, TokenBucket, UInt32Value,
};
use super::share::fair_shares;
use crate::Engine;

/// The largest message a stream reads: bounds what one message can make the server decode.
pub const MAX_QUOTA_MESSAGE_BYTES: usize = 1024 * 1024;
/// Bucket ids of up to this many entries are tried in every order against the rules.
pub const MAX_REORDERED: usize = 4;
/// An assignment lives this many report intervals...
pub const TTL_INTERVALS: u32 = 3;
/// ... and at least this long.
pub const MIN_TTL: Duration = Duration::from_secs(2);
/// The report interval assumed until a client's reports show one.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// A share that moves by at most this fraction keeps the assignment sent before.
pub const SHARE_TOLERANCE: f64 = 0.005;
/// A token bucket is filled about this often: a fill is its burst.
const FILL_TARGET: Duration = Duration::from_millis(50);
/// The longest fill interval sent, for a rate so low it would take longer.
const MAX_FILL: Duration = Duration::from_secs(86_400);
/// The shortest and longest report intervals believed.
const INTERVALS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(600));
/// How much of a new rate reading moves a client's demand (the rest is the readings before).
const SMOOTHING: f64 = 0.5;
/// The shards of the bucket map.
const SHARDS: usize = 16;

/// What RLQS streams may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaBounds {
    /// Streams open at once; one more is refused `RESOURCE_EXHAUSTED`.
    pub streams: usize,
    /// Shared buckets one stream holds; a report for one more is answered `abandon_action`.
    pub buckets_per_stream: usize,
    /// Shared buckets across every stream; a report for one more is answered
    /// `abandon_action`.
    pub buckets: usize,
    /// Bucket reports in one message; more is `INVALID_ARGUMENT`.
    pub reports_per_message: usize,
    /// Entries in one bucket id; more is `INVALID_ARGUMENT`.
    pub bucket_id_entries: usize,
    /// Bytes of one bucket id's keys and values together; more is `INVALID_ARGUMENT`.
    pub bucket_id_bytes: usize,
    /// Messages queued for a stream; a push that finds its queue full is dropped.
    pub queued: usize,
    /// The RLQS servers behind one address, each owning the Envoys that stream to it: each
    /// hands out `1 / servers` of a limit, as `local_share` does with `redis.hosts`.
    pub servers: u32,
}

impl Default for QuotaBounds {
    fn default() -> Self {
        Self {
            streams: 1024,
            buckets_per_stream: 1000,
            buckets: 100_000,
            reports_per_message: 1000,
            bucket_id_entries: sluice_descriptors::MAX_DEPTH,
            bucket_id_bytes: 4096,
            queued: 16,
            servers: 1,
        }
    }
}

/// Why a stream's message was refused; the stream ends with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    /// The stream's first message names no domain (`INVALID_ARGUMENT`).
    #[error("the first report of a stream names no domain")]
    NoDomain,
    /// A later message names another domain (`INVALID_ARGUMENT`).
    #[error("domain {given:?} on a stream of domain {domain:?}")]
    DomainChanged {
        /// The stream's domain.
        domain: String,
        /// The one the message gave.
        given: String,
    },
    /// More bucket reports in one message than [`QuotaBounds::reports_per_message`]
    /// (`INVALID_ARGUMENT`).
    #[error("{given} bucket reports in one message, at most {most}")]
    TooManyReports {
        /// How many the message had.
        given: usize,
        /// The bound.
        most: usize,
    },
    /// A bucket report that cannot be read, by its place (`INVALID_ARGUMENT`).
    #[error("bucket_quota_usages[{index}]: {why}")]
    Report {
        /// Its place in the message.
        index: usize,
        /// What is wrong with it.
        why: String,
    },
    /// As many streams open as [`QuotaBounds::streams`] (`RESOURCE_EXHAUSTED`).
    #[error("{0} streams are open, the most there may be")]
    TooManyStreams(usize),
}

impl QuotaError {
    /// Whether the gRPC status is `RESOURCE_EXHAUSTED` (otherwise `INVALID_ARGUMENT`).
    pub fn is_resource_exhausted(&self) -> bool {
        matches!(self, Self::TooManyStreams(_))
    }
}

/// The buckets every RLQS stream shares, on an engine's rules.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use sluice_descriptors::RuleSet;
/// use sluice_service::rlqs::proto::{self, Action, Strategy};
/// use sluice_service::rlqs::{QuotaBounds, Quotas};
/// use sluice_service::{Engine, EngineSettings};
/// let rules = RuleSet::from_yaml("domain: edge\ndescriptors:\n  - key: name\n    rate_limit: {unit: second, requests_per_unit: 100}\n")?;
/// let quotas = Arc::new(Quotas::new(Arc::new(Engine::new(rules, EngineSettings::default())?), QuotaBounds::default()));
/// let (mut stream, _pushes) = quotas.open()?;
/// let report = proto::RateLimitQuotaUsageReports {
///     domain: "edge".into(),
///     bucket_quota_usages: vec![proto::BucketQuotaUsage {
///         bucket_id: Some(proto::BucketId { bucket: [("name".to_owned(), "api".to_owned())].into() }),
///         time_elapsed: Some(proto::Duration { seconds: 1, nanos: 0 }),
///         num_requests_allowed: 40,
///         num_requests_denied: 0,
///     }],
/// };
/// let answer = stream.report(report, Duration::from_secs(1))?;
/// // The only client: all of 100/s, as a token bucket.
/// let Some(Action::QuotaAssignmentAction(assigned)) = answer.bucket_action[0].bucket_action else { panic!() };
/// let Some(Strategy::TokenBucket(bucket)) = assigned.rate_limit_strategy.and_then(|s| s.strategy) else { panic!() };
/// assert_eq!(bucket.tokens_per_fill.map(|t| t.value), Some(5));
/// assert_eq!(bucket.fill_interval, Some(proto::Duration { seconds: 0, nanos: 50_000_000 }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Quotas {
    engine: Arc<Engine>,
    bounds: QuotaBounds,
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
    /// Buckets held, across shards.
    buckets: AtomicUsize,
    /// Streams open.
    streams: AtomicUsize,
    next_stream: AtomicU64,
    epoch: Instant,
    /// Whether a task sweeps expired clients ([`Quotas::sweep`]) already.
    #[cfg(feature = "grpc")]
    pub(crate) swept: AtomicBool,
}

impl std::fmt::Debug for Quotas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quotas")
            .field("bounds", &self.bounds)
            .field("buckets", &self.buckets.load(Ordering::Relaxed))
            .field("streams", &self.streams.load(Ordering::Relaxed))
            .finish()
    }
}

/// One RLQS stream: its domain and the buckets it holds a share of. Dropping it leaves them:
/// each share stays reserved until the stream's last assignment of it expires.
#[derive(Debug)]
pub struct QuotaStream {
    quotas: Arc<Quotas>,
    id: u64,
    domain: Option<String>,
    buckets: HashSet<BucketKey>,
    pub(crate) outbox: mpsc::Sender<RateLimitQuotaResponse>,
}

/// A shared bucket: a domain and a bucket id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BucketKey {
    domain: String,
    id: BTreeMap<String, String>,
}

#[derive(Default)]
struct Shard {
    buckets: HashMap<BucketKey, Bucket>,
}

/// The clients of one shared bucket.
struct Bucket {
    /// The rate shared, per second (the rule's, at the last report).
    limit: f64,
    /// At most one per stream, so at most [`QuotaBounds::streams`].
    clients: Vec<Client>,
}

struct Client {
    stream: u64,
    outbox: mpsc::Sender<RateLimitQuotaResponse>,
    /// Requests per second, smoothed; `None` until a report shows a rate.
    demand: Option<f64>,
    /// The report interval believed.
    interval: Duration,
    last_report: Option<Duration>,
    /// When its last assignment expires.
    expires: Duration,
    /// Its stream ended: its share stays reserved until `expires`.
    gone: bool,
    assigned: Option<Assigned>,
}

#[derive(Clone, Copy)]
struct Assigned {
    rate: f64,
    strategy: RateLimitStrategy,
}

/// What a bucket's rule says.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Policy {
    Abandon,
    Allow,
    Deny,
    /// Requests per second, shared.
    Share(f64),
}

/// Messages for other streams, gathered while a message is read and sent after.
type Pushes = HashMap<u64, (mpsc::Sender<RateLimitQuotaResponse>, Vec<BucketAction>)>;

impl Quotas {
    /// The buckets of streams on `engine`'s rules (and those of any engine that replaces it,
    /// [`Engine::replaced_by`]).
    pub fn new(engine: Arc<Engine>, bounds: QuotaBounds) -> Self {
        Self {
            engine,
            bounds,
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            buckets: AtomicUsize::new(0),
            streams: AtomicUsize::new(0),
            next_stream: AtomicU64::new(0),
            epoch: Instant::now(),
            #[cfg(feature = "grpc")]
            swept: AtomicBool::new(false),
        }
    }

    /// The bounds.
    pub fn bounds(&self) -> QuotaBounds {
        self.bounds
    }

    /// The time on the clock the server reads, since these buckets were made.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Streams open.
    pub fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Buckets held (each with at least one client whose assignment has not expired, or not
    /// swept yet).
    pub fn buckets(&self) -> usize {
        self.buckets.load(Ordering::Relaxed)
    }

    /// Opens a stream: the stream, and the receiving end of its queue, where the assignments
    /// other streams' reports change for it arrive.
    ///
    /// # Errors
    /// [`QuotaError::TooManyStreams`].
    pub fn open(
        self: &Arc<Self>,
    ) -> Result<(QuotaStream, mpsc::Receiver<RateLimitQuotaResponse>), QuotaError> {
        let most = self.bounds.streams;
        let counted = self
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < most).then_some(open + 1)
            });
        if counted.is_err() {
            return Err(QuotaError::TooManyStreams(most));
        }
        let (outbox, pushes) = mpsc::channel(self.bounds.queued.max(1));
        let stream = QuotaStream {
            quotas: Arc::clone(self),
            id: self.next_stream.fetch_add(1, Ordering::Relaxed),
            domain: None,
            buckets: HashSet::new(),
            outbox,
        };
        Ok((stream, pushes))
    }

    /// At `now`, drops every client whose last assignment has expired (its stream ended, or it
    /// stopped reporting the bucket), gives its share to the bucket's other clients (sent to
    /// them at once) and drops buckets left without clients. The gRPC service runs it every
    /// second.
    pub fn sweep(&self, now: Duration) {
        for shard in &self.shards {
            let mut pushes = Pushes::new();
            {
                let mut shard = lock(shard);
                let before = shard.buckets.len();
                shard.buckets.retain(|key, bucket| {
                    if bucket.expire(now, None) {
                        bucket.reshare(key, now, None, &mut pushes);
                    }
                    !bucket.clients.is_empty()
                });
                self.buckets
                    .fetch_sub(before - shard.buckets.len(), Ordering::Relaxed);
            }
            send(pushes);
        }
    }

    fn shard(&self, key: &BucketKey) -> &Mutex<Shard> {
        let at = (self.hasher.hash_one(key) as usize) % self.shards.len();
        &self.shards[at]
    }

    /// This stream's share of `key` under `limit`, after its report of `usage`: `None` when
    /// the bucket is new and the map is full.
    fn share(
        &self,
        key: &BucketKey,
        stream: &QuotaStream,
        usage: Usage,
        limit: f64,
        pushes: &mut Pushes,
    ) -> Option<(RateLimitStrategy, Duration)> {
        let mut shard = lock(self.shard(key));
        let bucket = match shard.buckets.entry(key.clone()) {
            MapEntry::Occupied(held) => held.into_mut(),
            MapEntry::Vacant(vacant) => {
                let most = self.bounds.buckets;
                let counted = self
                    .buckets
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                        (held < most).then_some(held + 1)
                    });
                counted.ok()?;
                vacant.insert(Bucket {
                    limit,
                    clients: Vec::new(),
                })
            }
        };
        bucket.limit = limit;
        bucket.expire(usage.now, Some(stream.id));
        let me = match bucket.clients.iter().position(|c| c.stream == stream.id) {
            Some(me) => me,
            None => {
                bucket.clients.push(Client::new(stream.id, stream.outbox.clone()));
                bucket.clients.len() - 1
            }
        };
        bucket.clients[me].observe(usage);
        bucket.reshare(key, usage.now, Some(me), pushes)
    }

    /// Takes `stream` out of `key`'s clients at once (its bucket was abandoned or its rule no
    /// longer shares): the others share what it had.
    fn leave(&self, key: &BucketKey, stream: u64, now: Duration, pushes: &mut Pushes) {
        let mut shard = lock(self.shard(key));
        let Some(bucket) = shard.buckets.get_mut(key) else {
            return;
        };
        bucket.clients.retain(|client| client.stream != stream);
        if bucket.clients.is_empty() {
            shard.buckets.remove(key);
            self.buckets.fetch_sub(1, Ordering::Relaxed);
        } else {
            bucket.reshare(key, now, None, pushes);
        }
    }

    /// Marks `stream` gone from `key`: its share stays reserved until its assignment expires.
    fn depart(&self, key: &BucketKey, stream: u64) {
        let mut shard = lock(self.shard(key));
        if let Some(bucket) = shard.buckets.get_mut(key) {
            for client in bucket.clients.iter_mut().filter(|c| c.stream == stream) {
                client.gone = true;
            }
        }
    }

    /// What the rules say of `id` in `domain`.
    fn policy(&self, domain: &str, id: &BTreeMap<String, String>) -> Policy {
        let engine = self.engine.latest();
        let generation = engine.current.load();
        let Some(rules) = generation.rules.domain(domain) else {
            return Policy::Abandon;
        };
        let mut entries: Vec<Entry<'_>> = (id.iter())
            .map(|(key, value)| Entry {
                key: key.as_str(),
                value: value.as_str(),
            })
            .collect();
        match find_in_any_order(rules, &mut entries) {
            None => Policy::Abandon,
            Some(rule) if rule.shadow_mode || engine.settings.shadow => Policy::Allow,
            Some(rule) => match rule.limit {
                Limit::Unlimited => Policy::Allow,
                Limit::Quota(quota) => {
                    let per_second = quota.count() as f64 / quota.period().as_secs_f64();
                    if quota.is_deny_all() || per_second.is_nan() || per_second <= 0.0 {
                        Policy::Deny
                    } else {
                        Policy::Share(per_second / f64::from(self.bounds.servers.max(1)))
                    }
                }
            },
        }
    }
}

/// The rule `entries` reach, in key order or (up to [`MAX_REORDERED`] entries) any other:
/// the orders are walked by Heap's algorithm, each tried once.
fn find_in_any_order<'r>(rules: &'r DomainRules, entries: &mut [Entry<'_>]) -> Option<&'r Rule> {
    if let Some(rule) = rules.find(entries) {
        return Some(rule);
    }
    let n = entries.len();
    if n > MAX_REORDERED {
        return None;
    }
    let mut counters = [0usize; MAX_REORDERED];
    let mut i = 1;
    while i < n {
        if counters[i] < i {
            let other = if i % 2 == 0 { 0 } else { counters[i] };
            entries.swap(other, i);
            if let Some(rule) = rules.find(entries) {
                return Some(rule);
            }
            counters[i] += 1;
            i = 1;
        } else {
            counters[i] = 0;
            i += 1;
        }
    }
    None
}

/// One bucket's report, read.
#[derive(Debug, Clone, Copy)]
struct Usage {
    requests: u64,
    elapsed: Option<Duration>,
    now: Duration,
}

impl Bucket {
    /// Drops every client but `keep` whose assignment expired before `now`; whether any was.
    fn expire(&mut self, now: Duration, keep: Option<u64>) -> bool {
        let before = self.clients.len();
        self.clients
            .retain(|client| Some(client.stream) == keep || client.expires >= now);
        self.clients.len() != before
    }

    /// Works the shares out again at `now`: each live client whose share moved beyond the
    /// tolerance is given its new one, pushed to it unless it is `me`, whose assignment (kept
    /// or new) is returned with its time to live. A client whose stream ended keeps what it
    /// had, reserved, until it expires.
    fn reshare(
        &mut self,
        key: &BucketKey,
        now: Duration,
        me: Option<usize>,
        pushes: &mut Pushes,
    ) -> Option<(RateLimitStrategy, Duration)> {
        let limit = self.limit;
        for client in &mut self.clients {
            client.gone |= client.outbox.is_closed();
        }
        let reserved: f64 = (self.clients.iter())
            .filter(|client| client.gone)
            .filter_map(|client| client.assigned.map(|a| a.rate))
            .sum();
        let demands: Vec<f64> = (self.clients.iter())
            .filter(|client| !client.gone)
            .map(|client| client.demand.unwrap_or(limit))
            .collect();
        let shares = fair_shares((limit - reserved).max(0.0), &demands);
        let mut mine = None;
        let live = (self.clients.iter_mut().enumerate()).filter(|(_, client)| !client.gone);
        for ((at, client), share) in live.zip(shares) {
            let moved = client
                .assigned
                .is_none_or(|held| (held.rate - share).abs() > SHARE_TOLERANCE * held.rate.max(share));
            if moved {
                client.assigned = Some(Assigned {
                    rate: share,
                    strategy: strategy_for(share),
                });
            }
            let ttl = client.ttl();
            let Some(assigned) = client.assigned else {
                continue;
            };
            if Some(at) == me {
                client.expires = now + ttl;
                mine = Some((assigned.strategy, ttl));
            } else if moved {
                client.expires = now + ttl;
                let action = BucketAction::assign(
                    BucketId {
                        bucket: key.id.clone(),
                    },
                    assigned.strategy,
                    proto::Duration::of(ttl),
                );
                let (_, actions) =
                    (pushes.entry(client.stream)).or_insert_with(|| (client.outbox.clone(), Vec::new()));
                actions.push(action);
            }
        }
        mine
    }
}

impl Client {
    fn new(stream: u64, outbox: mpsc::Sender<RateLimitQuotaResponse>) -> Self {
        Self {
            stream,
            outbox,
            demand: None,
            interval: DEFAULT_INTERVAL,
            last_report: None,
            expires: Duration::ZERO,
            gone: false,
            assigned: None,
        }
    }

    /// Reads a report: the rate it shows moves the demand, its elapsed time the interval (up
    /// at once, down slowly: a report sent early, as on a new assignment, barely shortens it).
    fn observe(&mut self, usage: Usage) {
        let since = (self.last_report).and_then(|last| usage.now.checked_sub(last));
        let elapsed = (usage.elapsed.filter(|e| !e.is_zero())).or(since.filter(|e| !e.is_zero()));
        if let Some(elapsed) = elapsed {
            let rate = usage.requests as f64 / elapsed.as_secs_f64();
            self.demand = Some(match self.demand {
                Some(demand) => demand + SMOOTHING * (rate - demand),
                None => rate,
            });
            let elapsed = elapsed.clamp(INTERVALS.0, INTERVALS.1);
            self.interval = if self.last_report.is_none() || elapsed > self.interval {
                elapsed
            } else {
                self.interval - (self.interval - elapsed) / 8
            };
        }
        self.last_report = Some(usage.now);
    }

    fn ttl(&self) -> Duration {
        ttl_of(self.interval)
    }
}

/// An assignment's time to live for a report `interval`.
fn ttl_of(interval: Duration) -> Duration {
    (interval * TTL_INTERVALS).max(MIN_TTL)
}

/// The token bucket of `rate` requests per second: filled about every [`FILL_TARGET`] with a
/// whole number of tokens (at least one), its interval that number over the rate to the
/// nanosecond, so the rate is kept to about a part in 10⁸; it holds one fill. A rate of 0 is a
/// blanket `DENY_ALL` (a token bucket must hold a token).
fn strategy_for(rate: f64) -> RateLimitStrategy {
    if rate.is_nan() || rate <= 0.0 {
        return RateLimitStrategy::blanket(BlanketRule::DenyAll);
    }
    let tokens = (rate * FILL_TARGET.as_secs_f64())
        .round()
        .clamp(1.0, f64::from(u32::MAX));
    let most = MAX_FILL.as_nanos() as f64;
    // Whole numbers: tokens in 1..=u32::MAX, nanoseconds in 1..=MAX_FILL's.
    let fill = Duration::from_nanos((tokens * 1e9 / rate).round().clamp(1.0, most) as u64);
    let tokens = tokens as u32;
    RateLimitStrategy {
        strategy: Some(Strategy::TokenBucket(TokenBucket {
            max_tokens: tokens,
            tokens_per_fill: Some(UInt32Value { value: tokens }),
            fill_interval: Some(proto::Duration::of(fill)),
        })),
    }
}

fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends each stream its pushes, as one message; a full queue drops it.
fn send(pushes: Pushes) {
    for (_, (outbox, bucket_action)) in pushes {
        let _ = outbox.try_send(RateLimitQuotaResponse { bucket_action });
    }
}

impl QuotaStream {
    /// The stream's domain, once its first message gave it.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Reads one message of the stream at `now` (on [`Quotas::now`]'s clock, or a simulated
    /// one used throughout) and answers each of its buckets, in order; the assignments of
    /// other streams it changes are queued for them.
    ///
    /// # Errors
    /// The message is malformed: the whole message is refused (nothing of it is applied) and
    /// the stream is to end with the error.
    pub fn report(
        &mut self,
        message: RateLimitQuotaUsageReports,
        now: Duration,
    ) -> Result<RateLimitQuotaResponse, QuotaError> {
        let bounds = self.quotas.bounds;
        let domain = match self.domain.take() {
            None if message.domain.is_empty() => return Err(QuotaError::NoDomain),
            None => message.domain,
            Some(domain) if message.domain.is_empty() || message.domain == domain => domain,
            Some(domain) => {
                let given = message.domain;
                self.domain = Some(domain.clone());
                return Err(QuotaError::DomainChanged { domain, given });
            }
        };
        self.domain = Some(domain.clone());
        let usages = message.bucket_quota_usages;
        if usages.len() > bounds.reports_per_message {
            return Err(QuotaError::TooManyReports {
                given: usages.len(),
                most: bounds.reports_per_message,
            });
        }
        let mut read = Vec::with_capacity(usages.len());
        for (index, usage) in usages.into_iter().enumerate() {
            let report = |why: String| QuotaError::Report { index, why };
            let id = usage.bucket_id.map(|id| id.bucket).unwrap_or_default();
            if id.is_empty() {
                return Err(report("bucket_id has no entries".into()));
            }
            if id.len() > bounds.bucket_id_entries {
                let most = bounds.bucket_id_entries;
                return Err(report(format!(
                    "bucket_id has {} entries, at most {most}",
                    id.len()
                )));
            }
            let bytes: usize = id.iter().map(|(k, v)| k.len() + v.len()).sum();
            if bytes > bounds.bucket_id_bytes {
                let most = bounds.bucket_id_bytes;
                return Err(report(format!("bucket_id is {bytes} bytes, at most {most}")));
            }
            let elapsed = match usage.time_elapsed {
                None => None,
                Some(elapsed) => Some(
                    elapsed
                        .to_std()
                        .ok_or_else(|| report("time_elapsed is negative".into()))?,
                ),
            };
            let requests = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            read.push((
                id,
                Usage {
                    requests,
                    elapsed,
                    now,
                },
            ));
        }
        let mut pushes = Pushes::new();
        let mut bucket_action = Vec::with_capacity(read.len());
        for (id, usage) in read {
            let action = self.answer(&domain, id, usage, &mut pushes);
            bucket_action.push(action);
        }
        send(pushes);
        Ok(RateLimitQuotaResponse { bucket_action })
    }

    /// One bucket's answer.
    fn answer(
        &mut self,
        domain: &str,
        id: BTreeMap<String, String>,
        usage: Usage,
        pushes: &mut Pushes,
    ) -> BucketAction {
        let quotas = Arc::clone(&self.quotas);
        let policy = quotas.policy(domain, &id);
        let key = BucketKey {
            domain: domain.to_owned(),
            id,
        };
        let blanket = |rule| {
            let interval = usage.elapsed.unwrap_or(DEFAULT_INTERVAL);
            let ttl = ttl_of(interval.clamp(INTERVALS.0, INTERVALS.1));
            (RateLimitStrategy::blanket(rule), ttl)
        };
        let assigned = match policy {
            Policy::Share(limit) => {
                let held = self.buckets.contains(&key);
                let shared = if held || self.buckets.len() < quotas.bounds.buckets_per_stream {
                    quotas.share(&key, self, usage, limit, pushes)
                } else {
                    None
                };
                match (&shared, held) {
                    (Some(_), false) => {
                        self.buckets.insert(key.clone());
                    }
                    // Swept meanwhile, and no room left to hold it again.
                    (None, true) => {
                        self.buckets.remove(&key);
                    }
                    _ => {}
                }
                shared
            }
            Policy::Allow => Some(blanket(BlanketRule::AllowAll)),
            Policy::Deny => Some(blanket(BlanketRule::DenyAll)),
            Policy::Abandon => None,
        };
        if !matches!(policy, Policy::Share(_)) && self.buckets.remove(&key) {
            quotas.leave(&key, self.id, usage.now, pushes);
        }
        let id = BucketId { bucket: key.id };
        match assigned {
            Some((strategy, ttl)) => BucketAction::assign(id, strategy, proto::Duration::of(ttl)),
            None => BucketAction::abandon(id),
        }
    }
}

impl Drop for QuotaStream {
    fn drop(&mut self) {
        for key in &self.buckets {
            self.quotas.depart(key, self.id);
        }
        self.quotas.streams.fetch_sub(1, Ordering::AcqRel);
    }
}
