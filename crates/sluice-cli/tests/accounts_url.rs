//! Seed 000's quota fetch made real: `accounts_url` asks a quota service (here a real one on a
//! socket) for each key not in `accounts`. The failsafe quota governs a key until the answer
//! comes, the answer then applies, a key the service does not know gets `unknown`, and when
//! the service fails the key keeps its last answer.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::{Server, TempDir, wait_until};

/// A quota service: `GET /quota/KEY` answers the quota in `quotas` (text), 404 for a key it
/// does not have, and 503 to everything while `broken` is set. Every path asked is kept.
struct QuotaService {
    url: String,
    asked: Arc<Mutex<Vec<String>>>,
    broken: Arc<AtomicBool>,
}

impl QuotaService {
    fn start(quotas: HashMap<&'static str, &'static str>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/quota/{{key}}", listener.local_addr().unwrap());
        let asked = Arc::new(Mutex::new(Vec::new()));
        let broken = Arc::new(AtomicBool::new(false));
        let (seen, failing) = (Arc::clone(&asked), Arc::clone(&broken));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                let mut line = String::new();
                let mut reader = BufReader::new(&stream);
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                // The rest of the head.
                let mut header = String::new();
                while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                    header.clear();
                }
                let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                seen.lock().unwrap().push(path.clone());
                let key = path.strip_prefix("/quota/").unwrap_or("");
                let (status, body) = match quotas.get(key) {
                    _ if failing.load(Ordering::SeqCst) => ("503 Service Unavailable", "down"),
                    Some(quota) => ("200 OK", *quota),
                    None => ("404 Not Found", "no such account"),
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { url, asked, broken }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

fn policy_of(server: &Server, account: &str) -> String {
    let response = server.client().as_account(Some(account));
    response.header("ratelimit-policy").unwrap_or("").to_owned()
}

#[test]
fn keys_take_the_quota_services_answer_after_the_failsafe_and_keep_it_when_it_fails() {
    let service = QuotaService::start(HashMap::from([("zed%40example.com", "3/min")]));
    let dir = TempDir::new();
    let config = dir.write(
        "sluice.yaml",
        &format!(
            "accounts: {{alice@example.com: 1/s}}\naccounts_url: \"{}\"\nfailsafe: 100/min\nunknown: 0/s\nfetch_latency: 0s\nrefresh: 300ms\n",
            service.url
        ),
    );
    let server = Server::start(&["--config", config.to_str().unwrap(), "--threads", "1"]);

    // zed's first request is decided on the failsafe quota while the service is asked.
    let first = policy_of(&server, "zed@example.com");
    assert_eq!(first, "\"default\";q=100;w=60", "the failsafe quota first");
    wait_until("zed's quota from the service", || {
        policy_of(&server, "zed@example.com") == "\"default\";q=3;w=60"
    });
    assert!(service.asked().contains(&"/quota/zed%40example.com".to_owned()));
    // An account in `accounts` is never asked; one the service does not know is unknown (0/s).
    assert_eq!(policy_of(&server, "alice@example.com"), "\"default\";q=1;w=1");
    wait_until("nobody's quota to be unknown", || {
        server.client().as_account(Some("nobody@example.com")).status == 429
    });
    assert!(!service.asked().iter().any(|path| path.contains("alice")));

    // The service fails: zed keeps 3/min through refreshes that fail (a refresh is due at
    // the first check after `refresh`).
    service.broken.store(true, Ordering::SeqCst);
    let before = service.asked().len();
    wait_until("refreshes to fail", || {
        assert_eq!(policy_of(&server, "zed@example.com"), "\"default\";q=3;w=60");
        service.asked().len() >= before + 2
    });
    server.wait_for_log("quota fetch failed");
}

fn sample(metrics: &str, metric: &str) -> u64 {
    (metrics.lines())
        .find(|line| line.starts_with(metric))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {metric} in:\n{metrics}"))
}

/// The quota service hung (the connection accepted, never an answer) and then slow (answers
/// after the fetch timeout), behind a fault relay: every request is answered at once, each
/// fetch ends at `fetch_timeout`, and the keys nobody could fetch share the failsafe pool, so a
/// flood of them gets the pool's units in total, not a failsafe quota each.
#[test]
fn a_hung_or_slow_quota_service_costs_new_keys_at_most_the_failsafe_pool() {
    use common::fault::{Fault, FaultProxy};
    use std::time::{Duration, Instant};

    let service = QuotaService::start(HashMap::from([("zed%40example.com", "3/min")]));
    let upstream = (service.url.strip_prefix("http://").unwrap())
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let proxy = FaultProxy::start(upstream);
    let dir = TempDir::new();
    let config = dir.write(
        "sluice.yaml",
        &format!(
            "accounts: {{}}\naccounts_url: \"{}/quota/{{key}}\"\nfailsafe: 100/h\nfailsafe_pool: 5/h\nunknown: 0/s\nfetch_latency: 0s\nfetch_timeout: 300ms\nrefresh: 1h\nadmin: {{listen: 127.0.0.1:0}}\n",
            proxy.http_url()
        ),
    );
    let server = Server::start(&["--config", config.to_str().unwrap(), "--threads", "1"]);
    let metrics = || {
        common::Client::connect(server.admin.unwrap())
            .get("/metrics", &[])
            .body
    };

    for (round, fault) in [Fault::Stall, Fault::Latency(Duration::from_secs(2))]
        .into_iter()
        .enumerate()
    {
        proxy.set(fault);
        let failed_before = sample(&metrics(), "sluice_quota_fetch_errors");
        // A flood of new keys, one request each: the pool (5 an hour, over both rounds) is all
        // they get together.
        let mut admitted = 0;
        for n in 0..20 {
            let start = Instant::now();
            let response = server
                .client()
                .as_account(Some(&format!("new-{round}-{n}@example.com")));
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "{fault:?}: an answer took {:?}",
                start.elapsed()
            );
            admitted += u64::from(response.status == 200);
        }
        let expected = if round == 0 { 5 } else { 0 };
        assert_eq!(admitted, expected, "{fault:?}: admitted under the failsafe pool");
        // Every fetch ends at the timeout (the limiter's or the HTTP client's, whichever
        // fires first), not when the service answers (never, or in 2 s).
        let (start, timeout) = (Instant::now(), Duration::from_millis(300));
        wait_until(&format!("{fault:?}: 20 failed fetches"), || {
            sample(&metrics(), "sluice_quota_fetch_errors") >= failed_before + 20
        });
        assert!(
            start.elapsed() < timeout + Duration::from_secs(1),
            "{fault:?}: the fetches ended after {:?}",
            start.elapsed()
        );
        assert_eq!(sample(&metrics(), "sluice_quota_fetches_in_flight"), 0);
    }

    // The service answers again (once the one-at-a-time test service has read the 40 requests
    // the relay held): a new key's fetch brings its quota.
    proxy.set(Fault::None);
    wait_until("the held requests to reach the service", || {
        service.asked().len() >= 40
    });
    wait_until("zed's quota from the service", || {
        policy_of(&server, "zed@example.com") == "\"default\";q=3;w=60"
    });
}
