//! `sluice serve` as a reverse proxy in front of upstreams that fail: one refusing connections,
//! one the connect timeout gives up on, one that never answers, one that resets in the middle
//! of a body, one that closes without answering, one that pauses mid-body. Each is answered as
//! docs/proxy.md says, counted by its reason, and none leaves connections or threads behind.

mod common;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};

use common::upstream::{
    Blackhole, End, Misbehaviour, RawUpstream, Upstream, metric, process_status, read_body, read_head,
    read_response, refusing,
};
use common::{PATIENCE, Response, Server, TempDir, wait_until};

/// sluice in front of one upstream of each kind, a route each; the test application behind
/// the rest.
struct Faults {
    refused: SocketAddr,
    blackhole: Blackhole,
    hang: RawUpstream,
    reset: RawUpstream,
    reset_chunked: RawUpstream,
    close: RawUpstream,
    _app: Upstream,
    server: Server,
    _dir: TempDir,
}

impl Faults {
    fn start() -> Self {
        let app = Upstream::start("app");
        let refused = refusing();
        let blackhole = Blackhole::start();
        let hang = RawUpstream::start(Misbehaviour::Hang);
        let reset = RawUpstream::start(Misbehaviour::ResetMidBody { chunked: false });
        let reset_chunked = RawUpstream::start(Misbehaviour::ResetMidBody { chunked: true });
        let close = RawUpstream::start(Misbehaviour::CloseAfterRequest);
        let config = format!(
            "
fetch_latency: 0s
admin: {{listen: 127.0.0.1:0}}
accounts:
  tester: 100000/s
upstream:
  url: {}
  routes:
    - {{prefix: /refused/, url: http://{refused}}}
    - {{prefix: /unreachable/, url: {}}}
    - {{prefix: /hang/, url: {}}}
    - {{prefix: /reset/, url: {}}}
    - {{prefix: /reset-chunked/, url: {}}}
    - {{prefix: /close/, url: {}}}
  connect_timeout: 300ms
  head_timeout: 500ms
  idle_timeout: 1s
",
            app.url(),
            blackhole.url(),
            hang.url(),
            reset.url(),
            reset_chunked.url(),
            close.url()
        );
        let dir = TempDir::new();
        let file = dir.write("sluice.yaml", &config);
        let server = Server::start(&["--config", file.to_str().unwrap()]);
        Self {
            refused,
            blackhole,
            hang,
            reset,
            reset_chunked,
            close,
            _app: app,
            server,
            _dir: dir,
        }
    }

    fn get(&self, path: &str) -> Response {
        self.server.client().get(path, &[("X-Account-ID", "tester")])
    }

    /// `sluice_upstream_failures_total` by reason: connect, connect_timeout, head_timeout,
    /// broken.
    fn failures(&self) -> [u64; 4] {
        ["connect", "connect_timeout", "head_timeout", "broken"].map(|reason| {
            metric(
                &self.server,
                &format!("sluice_upstream_failures_total{{reason=\"{reason}\"}}"),
            )
        })
    }

    fn refused(&self) {
        problem(&self.get("/refused/x"), 502, self.refused);
    }

    fn unreachable(&self) {
        problem(&self.get("/unreachable/x"), 504, self.blackhole.addr);
    }

    fn hang(&self) {
        let dropped = self.hang.dropped();
        problem(&self.get("/hang/x"), 504, self.hang.addr);
        // Given up on: its connection closed, not left to the upstream.
        wait_until("sluice to close the silent upstream's connection", || {
            self.hang.dropped() == dropped + 1
        });
    }

    fn close(&self) {
        let requests = self.close.requests();
        problem(&self.get("/close/x"), 502, self.close.addr);
        assert_eq!(self.close.requests(), requests + 1, "sent once, not retried");
    }

    /// A megabyte announced, a kilobyte sent, then RST: the client's body is cut where the
    /// upstream's was, never completed (a chunked one ended with its last chunk would pass for
    /// whole) and never left hanging.
    fn reset_mid_body(&self, chunked: bool) {
        let (path, upstream) = match chunked {
            false => ("/reset/x", &self.reset),
            true => ("/reset-chunked/x", &self.reset_chunked),
        };
        let mut stream = TcpStream::connect(self.server.addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let head = format!("GET {path} HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n");
        stream.write_all(head.as_bytes()).unwrap();
        let mut reader = BufReader::new(stream);
        let mut answer = read_head(&mut reader);
        assert_eq!(answer.status, 200, "{answer:?}");
        upstream.release();
        read_body(&mut reader, &mut answer);
        assert!(matches!(answer.end, End::Cut(_)), "{path}: {answer:?}");
        assert!(answer.body.len <= 1000, "{path}: {answer:?}");
    }

    /// The app's body pausing: shorter than the idle timeout, whole; longer, cut after what
    /// came.
    fn slow_body(&self) {
        let pausing = |ms: u64| {
            let mut stream = TcpStream::connect(self.server.addr).unwrap();
            stream.set_read_timeout(Some(PATIENCE)).unwrap();
            let head = format!("GET /slow-body/{ms} HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n");
            stream.write_all(head.as_bytes()).unwrap();
            read_response(&mut BufReader::new(stream))
        };
        let whole = pausing(200);
        assert_eq!((whole.status, &whole.end), (200, &End::Complete), "{whole:?}");
        assert_eq!(whole.text, "first part\nsecond part\n");
        let cut = pausing(5000);
        assert_eq!(cut.status, 200, "{cut:?}");
        assert!(matches!(cut.end, End::Cut(_)), "{cut:?}");
        assert_eq!(cut.text, "first part\n");
    }
}

/// A problem+json answer of `status` naming `upstream`.
fn problem(answer: &Response, status: u16, upstream: SocketAddr) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/problem+json"));
    let json: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(json["status"], status, "{answer:?}");
    let detail = json["detail"].as_str().unwrap();
    assert!(detail.starts_with(&format!("{upstream}: ")), "{answer:?}");
}

#[test]
fn a_refused_connection_is_answered_502_naming_the_upstream() {
    let faults = Faults::start();
    faults.refused();
    assert_eq!(faults.failures(), [1, 0, 0, 0]);
    assert_eq!(
        metric(&faults.server, "sluice_upstream_requests_total{code=\"502\"}"),
        1
    );
}

#[test]
fn a_connection_not_made_within_the_connect_timeout_is_answered_504() {
    let faults = Faults::start();
    faults.unreachable();
    assert_eq!(faults.failures(), [0, 1, 0, 0]);
    assert_eq!(
        metric(&faults.server, "sluice_upstream_requests_total{code=\"504\"}"),
        1
    );
}

#[test]
fn an_upstream_that_never_answers_is_answered_504_and_let_go() {
    let faults = Faults::start();
    faults.hang();
    assert_eq!(faults.failures(), [0, 0, 1, 0]);
    assert_eq!(
        metric(&faults.server, "sluice_upstream_requests_total{code=\"504\"}"),
        1
    );
}

#[test]
fn an_upstream_that_closes_without_answering_is_answered_502() {
    let faults = Faults::start();
    faults.close();
    assert_eq!(faults.failures(), [0, 0, 0, 1]);
    assert_eq!(
        metric(&faults.server, "sluice_upstream_requests_total{code=\"502\"}"),
        1
    );
}

#[test]
fn a_body_the_upstream_resets_is_cut_for_the_client_too() {
    let faults = Faults::start();
    faults.reset_mid_body(false);
    faults.reset_mid_body(true);
    // Heads that came: answers, not failures.
    assert_eq!(faults.failures(), [0, 0, 0, 0]);
    assert_eq!(
        metric(&faults.server, "sluice_upstream_requests_total{code=\"200\"}"),
        2
    );
}

#[test]
fn a_response_body_pausing_longer_than_the_idle_timeout_is_cut() {
    let faults = Faults::start();
    faults.slow_body();
    assert_eq!(faults.failures(), [0, 0, 0, 0]);
}

/// Threads sluice may gain over a run of failures: none is made per request.
const THREADS_SLACK: u64 = 2;

#[test]
fn failures_leave_no_connections_descriptors_or_threads_behind() {
    let faults = Faults::start();
    let server = &faults.server;
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{}/fd", server.child.id()))
            .unwrap()
            .count()
    };
    let open = || metric(server, "sluice_open_connections");
    assert_eq!(open(), 0);
    let (threads, fds) = (process_status(server, "Threads"), descriptors());
    const ROUNDS: u64 = 10;
    for _ in 0..ROUNDS {
        faults.refused();
        faults.unreachable();
        faults.hang();
        faults.close();
        faults.reset_mid_body(false);
        faults.reset_mid_body(true);
    }
    faults.slow_body();
    assert_eq!(faults.failures(), [ROUNDS, ROUNDS, ROUNDS, ROUNDS]);
    wait_until("the client connections to close", || open() == 0);
    wait_until("the descriptors to be closed", || descriptors() <= fds);
    let now = process_status(server, "Threads");
    println!(
        "threads: {threads} before, {now} after; descriptors: {fds} before, {} after",
        descriptors()
    );
    assert!(
        now <= threads + THREADS_SLACK,
        "{threads} threads before, {now} after"
    );
}

/// sluice in front of an upstream answering every request with `answer`.
fn behind(answer: &'static [u8]) -> (RawUpstream, Server, TempDir) {
    let upstream = RawUpstream::start(Misbehaviour::Answer(answer));
    let config = format!(
        "
fetch_latency: 0s
admin: {{listen: 127.0.0.1:0}}
accounts:
  tester: 100000/s
upstream: {{url: {}, head_timeout: 2s}}
",
        upstream.url()
    );
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", &config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (upstream, server, dir)
}

#[test]
fn bytes_past_an_answers_end_are_never_taken_for_the_next_answer() {
    // One answer of 2 bytes, then what would read as a second answer: a proxy that kept the
    // connection would give it to the next request.
    let (upstream, server, _dir) = behind(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhiHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil",
    );
    for round in 1..=5 {
        let answer = server.client().get("/", &[("X-Account-ID", "tester")]);
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, "hi"),
            "round {round}: {answer:?}"
        );
    }
    assert_eq!(upstream.requests(), 5, "each request reached the upstream");
}

#[test]
fn an_answer_framed_two_ways_is_refused_502_and_counted_broken() {
    for answer in [
        &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    ] {
        let (upstream, server, _dir) = behind(answer);
        let refused = server.client().get("/", &[("X-Account-ID", "tester")]);
        problem(&refused, 502, upstream.addr);
        assert!(refused.body.contains("framing"), "{refused:?}");
        assert_eq!(
            metric(&server, "sluice_upstream_failures_total{reason=\"broken\"}"),
            1
        );
    }
}
