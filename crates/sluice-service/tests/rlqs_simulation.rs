//! Three simulated Envoys sharing one limit through RLQS, each applying the token bucket it is
//! assigned to its own offered load, as Envoy's `rate_limit_quota` filter does.
//!
//! The limit is 1000/s; the Envoys offer 150, 300 and 1050 requests a second (demands
//! 1 : 2 : 7) and report every second. Halfway, the first leaves and the second doubles. Over
//! every 10 s window from two report intervals after a change has taken effect (a departure
//! takes effect when the leaver's last assignment expires, its time to live after it was
//! sent), the Envoys together admit the limit within 2%, and each at least its max-min fair
//! share (or its demand, if less) less 5%.
//!
//! `virtual_clock` drives the server's buckets directly on a simulated clock, a millisecond a
//! step (`RLQS_SIM_PHASE_SECONDS` sets each phase's length, 40 s by default; `bench/rlqs.sh`
//! runs it longer and prints every window); `over_a_socket` runs the same Envoys briefly in
//! real time against the gRPC server, the assignments read by a client of Envoy's own
//! message definitions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3 as envoy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use prost::Message;

use sluice_descriptors::RuleSet;
use sluice_service::rlqs::proto::{self, Action, BlanketRule, Strategy};
use sluice_service::rlqs::{QuotaBounds, QuotaService, QuotaStream, Quotas};
use sluice_service::{Engine, EngineSettings};
use tokio::sync::mpsc;

const RULES: &str =
    "domain: sim\ndescriptors:\n  - key: name\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";
const LIMIT: f64 = 1000.0;
const REPORT_EVERY_MS: u64 = 1000;
const STEP_MS: u64 = 1;

fn engine() -> Arc<Engine> {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    Arc::new(Engine::new(rules, EngineSettings::default()).unwrap())
}

fn bucket_id() -> proto::BucketId {
    proto::BucketId {
        bucket: [("name".to_owned(), "api".to_owned())].into(),
    }
}

/// What an Envoy applies to the bucket.
#[derive(Debug, Clone, PartialEq)]
enum Applied {
    /// No assignment yet, or it expired: allowed (`no_assignment_behavior` allow-all).
    Nothing,
    Blanket(bool),
    Bucket {
        strategy: proto::TokenBucket,
        rate: f64,
        max: f64,
        tokens: f64,
    },
}

/// One simulated Envoy: its offered load, the assignment it applies, what it admitted.
struct SimEnvoy {
    offered: f64,
    /// Requests due but not yet arrived (a fraction).
    due: f64,
    applied: Applied,
    expires_ms: u64,
    allowed: u64,
    denied: u64,
    last_report_ms: u64,
    /// Offset of its reports in each interval.
    offset_ms: u64,
    /// Admitted in each second.
    admitted: Vec<u64>,
}

impl SimEnvoy {
    fn new(offered: f64, offset_ms: u64, seconds: usize) -> Self {
        Self {
            offered,
            due: 0.0,
            applied: Applied::Nothing,
            expires_ms: 0,
            allowed: 0,
            denied: 0,
            last_report_ms: 0,
            offset_ms,
            admitted: vec![0; seconds],
        }
    }

    /// Applies an answer, as the filter does: a new strategy starts a new (full) token bucket,
    /// the same one only extends the assignment.
    fn apply(&mut self, answer: &proto::RateLimitQuotaResponse, now_ms: u64) {
        for action in &answer.bucket_action {
            match action.bucket_action {
                Some(Action::QuotaAssignmentAction(assignment)) => {
                    let ttl = assignment.assignment_time_to_live.unwrap().to_std().unwrap();
                    self.expires_ms = now_ms + ttl.as_millis() as u64;
                    let strategy = assignment.rate_limit_strategy.unwrap().strategy.unwrap();
                    let next = match strategy {
                        Strategy::BlanketRule(rule) => Applied::Blanket(rule == BlanketRule::AllowAll as i32),
                        Strategy::TokenBucket(bucket) => {
                            if let Applied::Bucket { strategy, .. } = &self.applied
                                && *strategy == bucket
                            {
                                continue;
                            }
                            let fill = bucket.fill_interval.unwrap().to_std().unwrap();
                            let per_fill = f64::from(bucket.tokens_per_fill.unwrap().value);
                            Applied::Bucket {
                                strategy: bucket,
                                rate: per_fill / fill.as_secs_f64(),
                                max: f64::from(bucket.max_tokens),
                                tokens: f64::from(bucket.max_tokens),
                            }
                        }
                        other => panic!("{other:?}"),
                    };
                    self.applied = next;
                }
                Some(Action::AbandonAction(_)) => self.applied = Applied::Nothing,
                None => panic!("no action"),
            }
        }
    }

    /// One step of `STEP_MS`: the bucket fills, the due requests arrive and are decided.
    fn step(&mut self, now_ms: u64) {
        let dt = STEP_MS as f64 / 1000.0;
        if now_ms >= self.expires_ms {
            self.applied = Applied::Nothing;
        }
        if let Applied::Bucket {
            rate, max, tokens, ..
        } = &mut self.applied
        {
            *tokens = (*tokens + *rate * dt).min(*max);
        }
        self.due += self.offered * dt;
        while self.due >= 1.0 {
            self.due -= 1.0;
            let admit = match &mut self.applied {
                Applied::Nothing => true,
                Applied::Blanket(allow) => *allow,
                Applied::Bucket { tokens, .. } if *tokens >= 1.0 => {
                    *tokens -= 1.0;
                    true
                }
                Applied::Bucket { .. } => false,
            };
            if admit {
                self.allowed += 1;
                let second = (now_ms / 1000) as usize;
                if let Some(admitted) = self.admitted.get_mut(second) {
                    *admitted += 1;
                }
            } else {
                self.denied += 1;
            }
        }
    }

    /// Its report since the last, and resets the counts.
    fn report(&mut self, now_ms: u64, domain: &str) -> proto::RateLimitQuotaUsageReports {
        let elapsed = Duration::from_millis(now_ms - self.last_report_ms);
        self.last_report_ms = now_ms;
        let usage = proto::BucketQuotaUsage {
            bucket_id: Some(bucket_id()),
            time_elapsed: Some(proto::Duration::of(elapsed)),
            num_requests_allowed: std::mem::take(&mut self.allowed),
            num_requests_denied: std::mem::take(&mut self.denied),
        };
        proto::RateLimitQuotaUsageReports {
            domain: domain.into(),
            bucket_quota_usages: vec![usage],
        }
    }
}

/// The expected shares of each phase: max-min fair, worked out by hand.
const PHASE_ONE: [Option<f64>; 3] = [Some(150.0), Some(300.0), Some(550.0)];
const PHASE_TWO: [Option<f64>; 3] = [None, Some(500.0), Some(500.0)];

fn phase_seconds() -> u64 {
    std::env::var("RLQS_SIM_PHASE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
        .max(20)
}

/// Checks every whole 10 s window in `[from, to)` seconds: the total within 2% of the limit,
/// each Envoy at least its expected share less 5%. Prints each.
fn check_windows(envoys: &[SimEnvoy], from: u64, to: u64, expected: [Option<f64>; 3]) -> usize {
    let mut windows = 0;
    let mut start = from;
    while start + 10 <= to {
        let range = start as usize..start as usize + 10;
        let per_envoy: Vec<u64> = envoys
            .iter()
            .map(|e| e.admitted[range.clone()].iter().sum())
            .collect();
        let total: u64 = per_envoy.iter().sum();
        println!(
            "window [{start:>4}, {:>4}) s: admitted {total:>6} (limit {}), by envoy {per_envoy:?}",
            start + 10,
            LIMIT * 10.0
        );
        let off = (total as f64 - LIMIT * 10.0).abs() / (LIMIT * 10.0);
        assert!(
            off <= 0.02,
            "window at {start} s: {total} admitted, {:.2}% off",
            off * 100.0
        );
        for (at, (admitted, share)) in per_envoy.iter().zip(expected).enumerate() {
            if let Some(share) = share {
                let least = share * 10.0 * 0.95;
                assert!(
                    *admitted as f64 >= least,
                    "envoy {at} at {start} s: {admitted} below {least}"
                );
            }
        }
        windows += 1;
        start += 10;
    }
    windows
}

#[test]
fn virtual_clock() {
    let phase = phase_seconds();
    let seconds = (2 * phase) as usize;
    let quotas = Arc::new(Quotas::new(engine(), QuotaBounds::default()));
    let mut envoys = vec![
        SimEnvoy::new(150.0, 0, seconds),
        SimEnvoy::new(300.0, 333, seconds),
        SimEnvoy::new(1050.0, 667, seconds),
    ];
    let mut streams: Vec<Option<(QuotaStream, mpsc::Receiver<proto::RateLimitQuotaResponse>)>> =
        (0..3).map(|_| Some(quotas.open().unwrap())).collect();
    let mut last_assignment_to_leaver = 0;
    for now_ms in (0..seconds as u64 * 1000).step_by(STEP_MS as usize) {
        let now = Duration::from_millis(now_ms);
        if now_ms == phase * 1000 {
            // The first leaves (its stream closes, its traffic stops); the second doubles.
            streams[0] = None;
            envoys[0].offered = 0.0;
            envoys[1].offered = 600.0;
        }
        for (envoy, stream) in envoys.iter_mut().zip(&mut streams) {
            let Some((stream, pushes)) = stream else {
                continue;
            };
            envoy.step(now_ms);
            if now_ms >= REPORT_EVERY_MS && now_ms % REPORT_EVERY_MS == envoy.offset_ms {
                let domain = if envoy.last_report_ms == 0 { "sim" } else { "" };
                let report = envoy.report(now_ms, domain);
                let answer = stream.report(report, now).unwrap();
                envoy.apply(&answer, now_ms);
            }
            while let Ok(pushed) = pushes.try_recv() {
                envoy.apply(&pushed, now_ms);
            }
        }
        if streams[0].is_some() && envoys[0].expires_ms > 0 {
            last_assignment_to_leaver = envoys[0].expires_ms;
        }
        if now_ms % 1000 == 500 {
            quotas.sweep(now);
        }
    }
    // Phase one: from two report intervals in.
    let windows = check_windows(&envoys, 2, phase, PHASE_ONE);
    // Phase two: the leaver's share is the others' once its assignment expires and a sweep
    // finds it (a second at most); then two report intervals.
    let effective = last_assignment_to_leaver.div_ceil(1000) + 1;
    assert!(
        effective <= phase + 4,
        "the leaver's assignment ran to {last_assignment_to_leaver} ms"
    );
    let windows = windows + check_windows(&envoys, effective + 2, 2 * phase, PHASE_TWO);
    assert!(windows >= 4, "{windows} windows checked");
}

/// Converts a message between the two definitions of it, through its bytes.
fn convert<A: Message, B: Message + Default>(message: &A) -> B {
    B::decode(message.encode_to_vec().as_slice()).unwrap()
}

/// One Envoy in real time over a socket for `run`: steps its clock to the wall's (a
/// millisecond a step, caught up after each wait), reports every second and applies what it
/// is sent; gives it back at the end.
async fn envoy_over_a_socket(
    addr: std::net::SocketAddr,
    mut envoy: SimEnvoy,
    start: Instant,
    run: Duration,
) -> SimEnvoy {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let (reports, to_send) = mpsc::channel::<envoy::RateLimitQuotaUsageReports>(16);
    let outbound = futures_util::stream::unfold(to_send, |mut to_send| async move {
        to_send.recv().await.map(|report| (report, to_send))
    });
    let mut answers = client
        .stream_rate_limit_quotas(outbound)
        .await
        .unwrap()
        .into_inner();
    let mut stepped_ms = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    while start.elapsed() < run {
        tokio::select! {
            answer = answers.message() => {
                let answer = answer.unwrap().unwrap();
                envoy.apply(&convert(&answer), stepped_ms);
            }
            _ = tick.tick() => {
                let now_ms = start.elapsed().as_millis() as u64;
                while stepped_ms < now_ms {
                    stepped_ms += STEP_MS;
                    envoy.step(stepped_ms);
                    if stepped_ms >= REPORT_EVERY_MS && stepped_ms % REPORT_EVERY_MS == envoy.offset_ms {
                        let domain = if envoy.last_report_ms == 0 { "sim" } else { "" };
                        let report = envoy.report(stepped_ms, domain);
                        reports.send(convert(&report)).await.unwrap();
                    }
                }
            }
        }
    }
    envoy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_a_socket() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(QuotaService::new(engine()).serve(listener, std::future::pending()));
    let run = Duration::from_millis(4500);
    let start = Instant::now();
    let envoys = [(150.0, 0), (300.0, 333), (1050.0, 667)].map(|(offered, offset)| {
        tokio::spawn(envoy_over_a_socket(
            addr,
            SimEnvoy::new(offered, offset, 5),
            start,
            run,
        ))
    });
    let mut done = Vec::new();
    for envoy in envoys {
        done.push(envoy.await.unwrap());
    }
    for (envoy, share) in done.iter().zip(PHASE_ONE) {
        let Applied::Bucket { rate, .. } = envoy.applied else {
            panic!("{:?}", envoy.applied);
        };
        let share = share.unwrap();
        assert!(
            (rate - share).abs() <= share * 0.01,
            "assigned {rate}, fair {share}"
        );
    }
    // Seconds 2 to 4, after every Envoy's first report: the limit, within 2%.
    let total: u64 = done
        .iter()
        .map(|envoy| envoy.admitted[2..4].iter().sum::<u64>())
        .sum();
    let off = (total as f64 - 2.0 * LIMIT).abs() / (2.0 * LIMIT);
    assert!(off <= 0.02, "{total} admitted over two seconds");
}

#[test]
fn servers_behind_one_address_each_hand_out_their_part_of_the_limit() {
    for servers in [1, 4] {
        let bounds = QuotaBounds {
            servers,
            ..QuotaBounds::default()
        };
        let quotas = Arc::new(Quotas::new(engine(), bounds));
        let (mut stream, _pushes) = quotas.open().unwrap();
        let mut envoy = SimEnvoy::new(1050.0, 0, 1);
        let answer = stream
            .report(envoy.report(1000, "sim"), Duration::from_secs(1))
            .unwrap();
        envoy.apply(&answer, 1000);
        let Applied::Bucket { rate, .. } = envoy.applied else {
            panic!("{servers} servers: {:?}", envoy.applied)
        };
        let part = LIMIT / f64::from(servers);
        assert!(
            (rate - part).abs() <= part * 0.01,
            "{servers} servers: {rate}/s, not {part}/s"
        );
    }
}
