//! `sluice serve` with `on_excess: wait`, over real sockets: requests over their quota wait in
//! their key's queue and are served in order at the quota's pace; one that cannot be served
//! within `max_wait`, or finds its queue full, is refused at once; a client that disconnects
//! leaves its place; ten thousand waiters across a thousand keys stay within a stated memory
//! bound.

mod common;

use std::net::Shutdown;
use std::time::{Duration, Instant};

use common::{Client, Response, Server, TempDir, wait_until};

fn start(config: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (server, dir)
}

/// The value of a sample of `metric` on the admin listener.
fn metric(server: &Server, metric: &str, label: &str) -> u64 {
    let metrics = Client::connect(server.admin.expect("admin.listen is set"))
        .get("/metrics", &[])
        .body;
    metrics
        .lines()
        .find(|line| line.starts_with(metric) && line.contains(label))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {metric} in:\n{metrics}"))
}

fn waiting(server: &Server) -> u64 {
    metric(server, "sluice_waiting_requests", "")
}

/// Sends a request as `account` on a new connection and waits until the server has queued
/// it, so arrival order is the order of these calls.
fn queue_one(server: &Server, account: &str, queued_before: u64) -> Client {
    let mut client = server.client();
    client.send_as(account);
    wait_until("the request to wait", || waiting(server) == queued_before + 1);
    client
}

/// The `Server-Timing` wait of a response, in milliseconds.
fn waited_ms(response: &Response) -> f64 {
    let timing = response
        .header("server-timing")
        .unwrap_or_else(|| panic!("no server-timing: {response:?}"));
    timing
        .strip_prefix("ratelimit-wait;dur=")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("bad server-timing {timing:?}"))
}

const WAIT: &str = "
fetch_latency: 0s
admin: {listen: 127.0.0.1:0}
on_excess: wait
max_wait: 10s
accounts:
  alice: 10/s burst 1
  slow: 1/s burst 1
  patient: {quota: 1/s burst 1, max_wait: 2500ms, queue_limit: 2}
  short: {quota: 1/s burst 1, queue_limit: 1}
  hasty: {quota: 1/s burst 1, on_excess: reject}
  glacial: {quota: 12/min burst 1, max_wait: 30s}
";

#[test]
fn waited_requests_are_served_in_order_at_the_quotas_pace() {
    let (server, _dir) = start(WAIT);
    // slow: 1/s burst 1, so the first is admitted at once and waiter k is due k seconds later.
    let origin = Instant::now();
    let ms = |at: Instant| at.duration_since(origin).as_secs_f64() * 1e3;
    let mut first = server.client();
    let answer = first.as_account(Some("slow"));
    let admitted = (0.0, ms(Instant::now())); // when the first was admitted, at the latest
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("server-timing"), None, "served at once: {answer:?}");
    // Four more, each queued (the server says so) before the next is sent.
    let mut joined = Vec::new();
    let mut clients = Vec::new();
    for i in 0..4 {
        let sent = ms(Instant::now());
        clients.push(queue_one(&server, "slow", i));
        joined.push((sent, ms(Instant::now())));
    }
    // Each waiter's Server-Timing is its wait on the server's clock: joined plus waited is
    // when it was served, within the window the client knows its joining in.
    let mut served = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        let answer = client.response();
        assert_eq!(answer.status, 200, "waiter {i}: {answer:?}");
        let waited = waited_ms(&answer);
        served.push((joined[i].0 + waited, joined[i].1 + waited));
    }
    // The limiter's schedule: waiter k is served k intervals after the first's admission,
    // never sooner (2 ms: the timer's and the clocks' rounding), and late by no more than the
    // server takes to wake it (a quarter of the interval, for a machine busy with other tests:
    // the next waiter's turn is still three quarters away).
    for (k, (earliest, latest)) in served.iter().enumerate() {
        let due = (
            admitted.0 + 1000.0 * (k as f64 + 1.0),
            admitted.1 + 1000.0 * (k as f64 + 1.0),
        );
        assert!(
            *latest >= due.0 - 2.0,
            "waiter {k} served at {earliest}..{latest} ms, due at {due:?}"
        );
        assert!(
            *earliest <= due.1 + 250.0,
            "waiter {k} served at {earliest}..{latest} ms, due at {due:?}"
        );
    }
    assert_eq!(waiting(&server), 0);
    assert_eq!(metric(&server, "sluice_wait_outcomes_total", "served"), 4);
}

#[test]
fn past_max_wait_or_the_queue_limit_a_request_is_refused_at_once() {
    let (server, _dir) = start(WAIT);
    // patient: 1/s, waits up to 2.5 s, 2 in the queue.
    assert_eq!(server.client().as_account(Some("patient")).status, 200);
    let mut one = queue_one(&server, "patient", 0); // due in 1 s
    let mut two = queue_one(&server, "patient", 1); // due in 2 s
    let started = Instant::now();
    let refused = server.client().as_account(Some("patient")); // due in 3 s: past 2.5 s
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(
        refused.header("retry-after"),
        Some("3"),
        "when it could have been served"
    );
    assert_eq!(refused.header("server-timing"), None);
    assert_eq!(waiting(&server), 2, "answered while the others still wait");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "at once, not after a wait"
    );
    // short: a queue of 1.
    assert_eq!(server.client().as_account(Some("short")).status, 200);
    let mut queued = queue_one(&server, "short", 2);
    let full = server.client().as_account(Some("short"));
    assert_eq!(full.status, 429, "{full:?}");
    // hasty: never waits, though the server's default is to wait.
    assert_eq!(server.client().as_account(Some("hasty")).status, 200);
    assert_eq!(server.client().as_account(Some("hasty")).status, 429);
    assert_eq!(waiting(&server), 3);
    for client in [&mut one, &mut two, &mut queued] {
        assert_eq!(client.response().status, 200);
    }
    assert_eq!(
        metric(&server, "sluice_wait_outcomes_total", "reason=\"max_wait\""),
        1
    );
    assert_eq!(
        metric(&server, "sluice_wait_outcomes_total", "reason=\"queue_limit\""),
        1
    );
    assert_eq!(
        metric(&server, "sluice_wait_outcomes_total", "reason=\"max_waiters\""),
        0
    );
    assert_eq!(metric(&server, "sluice_wait_outcomes_total", "late"), 0);
}

#[test]
fn a_client_that_disconnects_leaves_its_place() {
    let (server, _dir) = start(WAIT);
    assert_eq!(server.client().as_account(Some("slow")).status, 200);
    let gone = queue_one(&server, "slow", 0); // due in 1 s
    let mut next = queue_one(&server, "slow", 1); // due in 2 s, until the one ahead leaves
    gone.stream().shutdown(Shutdown::Both).unwrap();
    drop(gone);
    wait_until("the disconnected waiter to leave", || waiting(&server) == 1);
    let answer = next.response();
    assert_eq!(answer.status, 200);
    // It took the place of the one that left: served one interval after the first.
    assert!(waited_ms(&answer) < 1_500.0, "{answer:?}");
}

/// Bytes of the server's resident memory.
fn rss(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Resident memory a waiting request may cost the server, its connection included.
const BYTES_PER_WAITER: u64 = 24 * 1024;

#[test]
fn ten_thousand_waiters_across_a_thousand_keys_stay_within_the_memory_bound() {
    let (server, _dir) = start(
        "
fetch_latency: 0s
admin: {listen: 127.0.0.1:0}
unknown: 1/min burst 1
on_excess: wait
max_wait: 1h
max_waiters: 20000
",
    );
    let keys: Vec<String> = (0..1000).map(|i| format!("key-{i}")).collect();
    let mut warm = server.client();
    for key in &keys {
        assert_eq!(warm.as_account(Some(key)).status, 200);
    }
    let before = rss(&server);
    let mut clients: Vec<Client> = (0..10_000).map(|_| server.client()).collect();
    wait_until("the connections to open", || {
        metric(&server, "sluice_open_connections", "") >= 10_000
    });
    let connected = rss(&server);
    for round in 0..10 {
        for (key, client) in keys.iter().zip(&mut clients[round * 1000..]) {
            client.send_as(key);
        }
        wait_until("the round to queue", || {
            waiting(&server) == (round as u64 + 1) * 1000
        });
    }
    let after = rss(&server);
    let per_waiter = after.saturating_sub(before) / 10_000;
    println!(
        "10000 waiting: {per_waiter} bytes of resident memory each, {} for the connection and {} \
         for the request and its place",
        connected.saturating_sub(before) / 10_000,
        after.saturating_sub(connected) / 10_000,
    );
    assert!(per_waiter <= BYTES_PER_WAITER, "{per_waiter} bytes per waiter");
    for client in &clients {
        let _ = client.stream().shutdown(Shutdown::Both);
    }
    drop(clients);
    wait_until("every waiter to leave", || waiting(&server) == 0);
    // Still serving: a new key is admitted at once.
    assert_eq!(warm.as_account(Some("fresh")).status, 200);
}

#[test]
fn a_reload_keeps_the_waiters_in_their_places() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", WAIT);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    // glacial: one every 5 s.
    assert_eq!(server.client().as_account(Some("glacial")).status, 200);
    let mut first = queue_one(&server, "glacial", 0);
    let first_joined = Instant::now();
    // A new limiter (another failsafe quota): the held counts move to it, and the waiter,
    // which joined under the old one, is served by the new one in its turn.
    dir.write("sluice.yaml", &format!("{WAIT}failsafe: 5/s\nmax_waiters: 5\n"));
    server.wait_for_log("sluice.yaml: config reloaded; limiter settings changed");
    server.wait_for_log("max_waiters changed; read at start only");
    let mut second = queue_one(&server, "glacial", 1);
    let second_joined = Instant::now();
    let (a, b) = (first.response(), second.response());
    assert_eq!((a.status, b.status), (200, 200), "{a:?}\n{b:?}");
    // The second is served one interval (5 s) after the first: behind it, not ahead.
    // How long ago each was served: since it joined, less its wait.
    let a_ago = first_joined.elapsed().as_secs_f64() * 1e3 - waited_ms(&a);
    let b_ago = second_joined.elapsed().as_secs_f64() * 1e3 - waited_ms(&b);
    let apart = a_ago - b_ago;
    assert!(apart > 4_900.0, "served {apart} ms apart: {a:?}\n{b:?}");
    assert_eq!(metric(&server, "sluice_wait_outcomes_total", "late"), 0);
}

#[test]
fn a_request_may_wait_longer_than_the_idle_timeout() {
    // Idle connections close after 1 s (2 s at most); glacial's waiter is due in 5 s.
    let (server, _dir) = start(&format!("{WAIT}idle_timeout: 1s\n"));
    assert_eq!(server.client().as_account(Some("glacial")).status, 200);
    let mut waiter = queue_one(&server, "glacial", 0);
    let answer = waiter.response();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(waited_ms(&answer) > 4_000.0, "{answer:?}");
    // An idle connection is still closed.
    let idle = server.client();
    idle.stream()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = std::io::Read::read(&mut idle.stream(), &mut byte);
    assert!(matches!(read, Ok(0)), "closed by the server: {read:?}");
}
