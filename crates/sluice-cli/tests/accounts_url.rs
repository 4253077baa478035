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
