//! `sluice serve` as a reverse proxy, over real sockets, in front of a real application
//! (`common::upstream`): bodies streamed both ways in bounded memory, slow peers within the
//! idle timeout, hop-by-hop and forwarding headers, upgrades, HTTP/2 clients, the upstream's
//! own answers passed through, limited requests never forwarded, a request its client drops
//! dropped upstream too, routes, and the demo's load profiles through the proxy.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use common::upstream::{
    CHUNK, Digest, End, Misbehaviour, RawUpstream, Upload, Upstream, exchange, metric, pattern,
    process_status, read_head, read_response,
};
use common::{PATIENCE, Response, Server, TempDir, sluice, wait_until};
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// `tester` is admitted far more often than any test asks; `once`, once a minute.
const BASE: &str = "
fetch_latency: 0s
admin: {listen: 127.0.0.1:0}
accounts:
  tester: 100000/s
  once: 1/min
";

const TESTER: (&str, &str) = ("X-Account-ID", "tester");
const MIB: u64 = 1 << 20;

/// `sluice serve` with [`BASE`] and `extra` (an `upstream:` section, other keys).
fn start(extra: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", &format!("{BASE}{extra}"));
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (server, dir)
}

/// The headers an `/headers` answer says the upstream received: every value of `name`.
fn seen<'a>(answer: &'a Response, name: &str) -> Vec<&'a str> {
    (answer.body.lines().skip(1))
        .filter_map(|line| line.split_once(": "))
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
        .collect()
}

/// Peak resident memory sluice may reach having streamed 100 MiB bodies each way: a proxy that
/// held a whole body would pass it.
const PEAK_KIB: u64 = 64 * 1024;

#[test]
fn bodies_of_any_size_stream_both_ways_whole_in_bounded_memory() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    for len in [0, MIB, 100 * MIB] {
        let expected = Digest::of_pattern(len);
        // Downloads: chunked as the upstream sent it, or with its Content-Length.
        let chunked = exchange(server.addr, "GET", &format!("/bytes/{len}"), Upload::None);
        assert_eq!(
            (chunked.status, &chunked.end),
            (200, &End::Complete),
            "{len} B: {chunked:?}"
        );
        assert_eq!(chunked.body, expected, "{len} B chunked");
        assert_eq!(chunked.header("transfer-encoding"), Some("chunked"));
        let sized = exchange(server.addr, "GET", &format!("/bytes-len/{len}"), Upload::None);
        assert_eq!(
            (sized.status, &sized.end),
            (200, &End::Complete),
            "{len} B: {sized:?}"
        );
        assert_eq!(sized.body, expected, "{len} B with Content-Length");
        assert_eq!(sized.header("content-length"), Some(len.to_string().as_str()));
        // Uploads, echoed back by the upstream as they arrive.
        for upload in [Upload::Length(len), Upload::Chunked(len)] {
            let echoed = exchange(server.addr, "POST", "/echo", upload);
            assert_eq!(
                (echoed.status, &echoed.end),
                (200, &End::Complete),
                "{upload:?}: {echoed:?}"
            );
            assert_eq!(echoed.body, expected, "{upload:?} echoed");
        }
    }
    let peak = process_status(&server, "VmHWM");
    println!("sluice's peak resident memory: {peak} KiB");
    assert!(
        peak < PEAK_KIB,
        "sluice peaked at {peak} KiB streaming 100 MiB bodies"
    );
}

#[test]
fn one_upstream_connection_serves_every_request_in_turn_whatever_its_body() {
    let upstream = Upstream::start("app");
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", &format!("{BASE}upstream: {}\n", upstream.url()));
    // One serving thread: one pool, so requests in turn need one connection.
    let server = Server::start(&["--config", file.to_str().unwrap(), "--threads", "1"]);
    for round in 0..3 {
        for path in [
            "/bytes-len/12",
            "/bytes/12",
            "/bytes-len/1048576",
            "/bytes/1048576",
        ] {
            let answer = exchange(server.addr, "GET", path, Upload::None);
            assert_eq!(
                (answer.status, &answer.end),
                (200, &End::Complete),
                "{path}: {answer:?}"
            );
        }
        for upload in [Upload::Length(MIB), Upload::Chunked(MIB)] {
            let echoed = exchange(server.addr, "POST", "/echo", upload);
            assert_eq!(
                (echoed.status, &echoed.end),
                (200, &End::Complete),
                "{upload:?}: {echoed:?}"
            );
        }
        let mut client = server.client();
        for _ in 0..5 {
            assert_eq!(client.get("/", &[TESTER]).status, 200);
        }
        assert_eq!(upstream.connections(), 1, "round {round}");
    }
    assert_eq!(upstream.total(), 3 * (4 + 2 + 5));
}

#[test]
fn an_upload_expecting_100_continue_is_told_to_go_on() {
    // As curl sends a body over a megabyte: the head alone, then the body once told to.
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let head = "POST /sink HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let go_on = read_head(&mut reader);
    assert_eq!(go_on.status, 100, "{go_on:?}");
    stream.write_all(&pattern(0, 5000)).unwrap();
    let answer = read_response(&mut reader);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.text, Digest::of_pattern(5000).to_string());
}

#[test]
fn a_head_request_gets_the_length_without_a_body_and_the_connection_goes_on() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let two = "HEAD /bytes-len/1000 HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n\
               GET / HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n";
    stream.write_all(two.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let head = read_head(&mut reader);
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(head.header("content-length"), Some("1000"));
    // No body follows: the next bytes are the second answer.
    let next = read_response(&mut reader);
    assert_eq!(
        (next.status, next.text.as_str()),
        (200, "Hello World!"),
        "{next:?}"
    );
}

#[test]
fn slow_bodies_and_heads_within_the_timeouts_get_through_and_a_stalled_upload_is_answered_408() {
    let upstream = Upstream::start("app");
    let section = format!(
        "upstream: {{url: {}, idle_timeout: 2s, head_timeout: 5s}}\n",
        upstream.url()
    );
    let (server, _dir) = start(&section);
    let head = |len: usize| {
        format!("POST /sink HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\nContent-Length: {len}\r\n\r\n")
    };

    // Twelve pieces 200 ms apart: longer than the idle timeout in all, never in one pause.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(head(12_000).as_bytes()).unwrap();
    for piece in 0..12 {
        std::thread::sleep(Duration::from_millis(200));
        stream.write_all(&pattern(piece * 1000, 1000)).unwrap();
    }
    let answer = read_response(&mut BufReader::new(stream));
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.text,
        Digest::of_pattern(12_000).to_string(),
        "the upstream read it all"
    );

    // A tenth of the body, then nothing.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(head(10_000).as_bytes()).unwrap();
    stream.write_all(&pattern(0, 1000)).unwrap();
    let answer = read_response(&mut BufReader::new(stream));
    assert_eq!(answer.status, 408, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/problem+json"));
    let problem: serde_json::Value = serde_json::from_str(&answer.text).unwrap();
    assert_eq!(problem["status"], 408, "{answer:?}");
    assert_eq!(metric(&server, "sluice_upstream_requests_total{code=\"408\"}"), 1);
    // The client's stall, not the upstream's failure.
    for reason in ["connect", "connect_timeout", "head_timeout", "broken"] {
        let series = format!("sluice_upstream_failures_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&server, &series), 0, "{reason}");
    }

    // A head 300 ms late, well within the head timeout.
    let answer = server.client().get("/slow-head/300", &[TESTER]);
    assert_eq!((answer.status, answer.body.as_str()), (200, "slow head"));
}

#[test]
fn hop_by_hop_headers_are_removed_both_ways() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let mut client = server.client();
    let sent = [
        TESTER,
        ("Connection", "keep-alive, X-Secret"),
        ("X-Secret", "1"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Proxy-Connection", "keep-alive"),
        ("X-Kept", "2"),
    ];
    let answer = client.get("/headers", &sent);
    assert_eq!(answer.status, 200, "{answer:?}");
    for gone in [
        "connection",
        "x-secret",
        "keep-alive",
        "te",
        "proxy-connection",
        "upgrade",
    ] {
        assert_eq!(
            seen(&answer, gone),
            [] as [&str; 0],
            "{gone} reached the upstream: {}",
            answer.body
        );
    }
    assert_eq!(seen(&answer, "x-kept"), ["2"]);

    // The upstream's own, on the way back.
    let answer = client.get("/hop", &[TESTER]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("x-kept"), Some("1"));
    assert_eq!(answer.header("x-private"), None, "{answer:?}");
    assert_eq!(answer.header("keep-alive"), None, "{answer:?}");
    let connection = answer.header("connection").unwrap_or_default();
    assert!(
        !connection.to_ascii_lowercase().contains("x-private"),
        "{answer:?}"
    );
}

/// Headers a client makes up about where it is and how it came.
const SPOOFED: [(&str, &str); 5] = [
    ("X-Forwarded-For", "203.0.113.9"),
    ("Forwarded", "for=203.0.113.9;proto=https"),
    ("X-Forwarded-Proto", "https"),
    ("X-Real-IP", "203.0.113.9"),
    ("X-Forwarded-Host", "evil.example"),
];

#[test]
fn an_untrusted_clients_forwarding_headers_are_replaced_by_what_sluice_saw() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let answer = server
        .client()
        .get("/headers", &[&[TESTER][..], &SPOOFED].concat());
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(seen(&answer, "x-forwarded-for"), ["127.0.0.1"], "{}", answer.body);
    assert_eq!(
        seen(&answer, "forwarded"),
        ["for=127.0.0.1;proto=http"],
        "{}",
        answer.body
    );
    assert_eq!(seen(&answer, "x-forwarded-proto"), ["http"], "{}", answer.body);
    assert_eq!(seen(&answer, "x-real-ip"), [] as [&str; 0], "{}", answer.body);
    assert_eq!(
        seen(&answer, "x-forwarded-host"),
        [] as [&str; 0],
        "{}",
        answer.body
    );
    assert_eq!(
        seen(&answer, "host"),
        ["test"],
        "the client's Host, kept: {}",
        answer.body
    );
}

#[test]
fn a_trusted_proxys_forwarding_headers_are_kept_and_extended_on_one_line() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!(
        "trusted_proxies: [127.0.0.1/32]\nupstream: {}\n",
        upstream.url()
    ));
    let mut client = server.client();
    let answer = client.get("/headers", &[&[TESTER][..], &SPOOFED[..3]].concat());
    assert_eq!(answer.status, 200, "{answer:?}");
    // One line each, so an application reading a header's first line sees the whole list.
    assert_eq!(
        seen(&answer, "x-forwarded-for"),
        ["203.0.113.9, 127.0.0.1"],
        "{}",
        answer.body
    );
    assert_eq!(
        seen(&answer, "forwarded"),
        ["for=203.0.113.9;proto=https, for=127.0.0.1;proto=http"],
        "{}",
        answer.body
    );
    assert_eq!(seen(&answer, "x-forwarded-proto"), ["https"], "{}", answer.body);
    // A list the proxy wrote on two lines: joined, then extended.
    let two_lines = [
        TESTER,
        ("X-Forwarded-For", "198.51.100.7"),
        ("X-Forwarded-For", "203.0.113.9"),
    ];
    let answer = client.get("/headers", &two_lines);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        seen(&answer, "x-forwarded-for"),
        ["198.51.100.7, 203.0.113.9, 127.0.0.1"],
        "{}",
        answer.body
    );
}

#[test]
fn host_is_the_clients_unless_the_upstreams_is_asked_for_and_the_query_goes_as_sent() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!(
        "upstream: {{url: {}, host: upstream}}\n",
        upstream.url()
    ));
    let answer =
        (server.client().with_host("app.example")).get("/headers?q=a%20b&r=1", &[TESTER, SPOOFED[4]]);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.starts_with("GET /headers?q=a%20b&r=1 HTTP/1.1\n"),
        "path and query as sent: {}",
        answer.body
    );
    assert_eq!(
        seen(&answer, "host"),
        [upstream.addr.to_string().as_str()],
        "{}",
        answer.body
    );
    assert_eq!(
        seen(&answer, "x-forwarded-host"),
        ["app.example"],
        "{}",
        answer.body
    );
}

#[test]
fn an_admitted_upgrade_joins_the_two_connections_and_a_limited_one_never_reaches_the_upstream() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let upgrade = "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Account-ID: once\r\n\r\n";

    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(upgrade.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let switched = read_head(&mut reader);
    assert_eq!(switched.status, 101, "{switched:?}");
    assert_eq!(switched.header("upgrade"), Some("websocket"));
    assert!(
        switched
            .header("connection")
            .unwrap()
            .eq_ignore_ascii_case("upgrade")
    );
    // Raw bytes, no HTTP: echoed by the upstream through the joined connections.
    let large: Vec<u8> = (0..4).flat_map(|i| pattern(i * CHUNK as u64, CHUNK)).collect();
    for message in [&b"hello"[..], b"GET / HTTP/1.1\r\n\r\n", &large] {
        stream.write_all(message).unwrap();
        let mut echoed = vec![0; message.len()];
        reader.read_exact(&mut echoed).unwrap();
        assert!(echoed == message, "{} bytes echoed otherwise", message.len());
    }

    // `once` has had its request this minute: the next upgrade is sluice's to refuse.
    let mut refused = TcpStream::connect(server.addr).unwrap();
    refused.set_read_timeout(Some(PATIENCE)).unwrap();
    refused.write_all(upgrade.as_bytes()).unwrap();
    let answer = read_response(&mut BufReader::new(refused));
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(upstream.hits("/ws"), 1);
    // The tunnel still carries bytes.
    stream.write_all(b"still here").unwrap();
    let mut echoed = [0; 10];
    reader.read_exact(&mut echoed).unwrap();
    assert_eq!(&echoed, b"still here");
}

#[test]
fn an_http2_client_is_answered_by_the_http1_upstream() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let request = |method: &str, path: &str, body: Bytes| {
            Request::builder()
                .method(method)
                .uri(format!("http://test{path}"))
                .header("x-account-id", "tester")
                .body(Full::new(body))
                .unwrap()
        };

        let answer = sender
            .send_request(request("GET", "/headers", Bytes::new()))
            .await
            .unwrap();
        assert_eq!(
            (answer.version(), answer.status().as_u16()),
            (Version::HTTP_2, 200)
        );
        assert_eq!(answer.headers()["x-upstream"], "app");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.starts_with("GET /headers HTTP/1.1\n"), "{text}");
        assert!(text.contains("\nhost: test\n"), "the :authority as Host: {text}");

        // A megabyte each way: flow control on the client's side, streamed to the upstream.
        let upload: Bytes = (0..16).flat_map(|i| pattern(i * CHUNK as u64, CHUNK)).collect();
        let answer = sender
            .send_request(request("POST", "/echo", upload.clone()))
            .await
            .unwrap();
        assert_eq!(
            (answer.version(), answer.status().as_u16()),
            (Version::HTTP_2, 200)
        );
        let echoed = answer.into_body().collect().await.unwrap().to_bytes();
        assert!(
            echoed == upload,
            "{} of {} bytes echoed",
            echoed.len(),
            upload.len()
        );
        let answer = sender
            .send_request(request("POST", "/sink", upload))
            .await
            .unwrap();
        let sunk = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(sunk, Digest::of_pattern(MIB).to_string());
    });
    assert_eq!(upstream.hits("/echo") + upstream.hits("/sink"), 2);
}

#[test]
fn the_upstreams_own_429_and_retry_after_pass_through_and_are_counted() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let mut client = server.client();
    let answer = client.get("/status/429", &[TESTER]);
    assert_eq!(answer.status, 429, "{answer:?}");
    assert_eq!(answer.header("retry-after"), Some("7"), "{answer:?}");
    assert_eq!(answer.header("x-upstream"), Some("app"));
    assert_eq!(answer.body, "upstream says slow down");
    // sluice's own 429 is not the upstream's.
    assert_eq!(client.get("/", &[("X-Account-ID", "once")]).status, 200);
    let own = client.get("/", &[("X-Account-ID", "once")]);
    assert_eq!((own.status, own.header("x-upstream")), (429, None), "{own:?}");
    assert_eq!(metric(&server, "sluice_upstream_requests_total{code=\"429\"}"), 1);
    assert_eq!(metric(&server, "sluice_upstream_requests_total{code=\"200\"}"), 1);
    assert_eq!(metric(&server, "sluice_upstream_seconds_count"), 2);
}

#[test]
fn limited_requests_never_reach_the_upstream() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    let mut client = server.client();
    let answers: Vec<Response> = (0..5)
        .map(|_| client.get("/count", &[("X-Account-ID", "once")]))
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|answer| answer.status).collect();
    assert_eq!(statuses, [200, 429, 429, 429, 429], "{answers:?}");
    assert!(
        answers[1..].iter().all(|a| a.header("x-upstream").is_none()),
        "{answers:?}"
    );
    assert_eq!(upstream.hits("/count"), 1);
}

#[test]
fn a_waiting_request_reaches_the_upstream_once_served_and_one_that_leaves_never_does() {
    let upstream = Upstream::start("app");
    // One request every 5 s: a waiter is far from its turn when the test looks. (An account
    // more, after BASE's.)
    let (server, _dir) = start(&format!(
        "  patient: {{quota: 12/min burst 1, on_excess: wait, max_wait: 30s}}\nupstream: {}\n",
        upstream.url()
    ));
    let waiting = || metric(&server, "sluice_waiting_requests");
    let count = "GET /count HTTP/1.1\r\nHost: test\r\nX-Account-ID: patient\r\n\r\n";
    assert_eq!(
        server
            .client()
            .get("/count", &[("X-Account-ID", "patient")])
            .status,
        200
    );

    // One that leaves while waiting.
    let gone = server.client();
    (&mut gone.stream()).write_all(count.as_bytes()).unwrap();
    wait_until("the first to wait", || waiting() == 1);
    gone.stream().shutdown(Shutdown::Both).unwrap();
    drop(gone);
    wait_until("the first to leave", || waiting() == 0);

    // One that waits its turn (the one the first left).
    let mut stays = server.client();
    (&mut stays.stream()).write_all(count.as_bytes()).unwrap();
    wait_until("the second to wait", || waiting() == 1);
    assert_eq!(upstream.hits("/count"), 1, "forwarded while waiting");
    let answer = stays.response();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("x-upstream"), Some("app"));
    assert!(answer.header("server-timing").is_some(), "it waited: {answer:?}");
    assert_eq!(
        upstream.hits("/count"),
        2,
        "the one that left was never forwarded"
    );
}

#[test]
fn a_client_gone_while_the_upstream_prepares_its_answer_drops_the_upstream_request() {
    // Answers after 20 s unless its connection closes first.
    let slow = RawUpstream::start(Misbehaviour::AnswerAfter(Duration::from_secs(20)));
    let (server, _dir) = start(&format!("upstream: {}\n", slow.url()));
    let client = server.client();
    (&mut client.stream())
        .write_all(b"GET /slow HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n")
        .unwrap();
    wait_until("the request to reach the upstream", || slow.requests() == 1);
    client.stream().shutdown(Shutdown::Both).unwrap();
    drop(client);
    wait_until("the upstream to answer or see its connection closed", || {
        slow.dropped() + slow.answered() == 1
    });
    assert_eq!(slow.dropped(), 1, "the upstream request outlived its client");
}

#[test]
fn a_client_gone_mid_transfer_leaves_the_upstreams_side_abandoned_too() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    // A download of 100 GiB: a proxy that drained it to keep the connection would not be done
    // within the test.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let download = format!(
        "GET /bytes/{} HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n",
        100u64 << 30
    );
    stream.write_all(download.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    assert_eq!(read_head(&mut reader).status, 200);
    let mut some = vec![0; MIB as usize];
    reader.read_exact(&mut some).unwrap();
    stream.shutdown(Shutdown::Both).unwrap();
    drop((stream, reader));
    wait_until("the upstream to see its download dropped", || {
        upstream.abandoned() == 1
    });

    // An upload of a gigabyte that stops after a megabyte, its client gone.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    let upload = format!(
        "POST /sink HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\nContent-Length: {}\r\n\r\n",
        1u64 << 30
    );
    stream.write_all(upload.as_bytes()).unwrap();
    for i in 0..16 {
        stream.write_all(&pattern(i * CHUNK as u64, CHUNK)).unwrap();
    }
    wait_until("the upload to reach the upstream", || upstream.hits("/sink") == 1);
    stream.shutdown(Shutdown::Both).unwrap();
    drop(stream);
    wait_until("the upstream to see its upload broken off", || {
        upstream.abandoned() == 2
    });
}

#[test]
fn a_client_that_stops_reading_a_download_is_closed_by_the_idle_check() {
    let upstream = Upstream::start("app");
    // The connection's idle timeout is short, the upstream's body timeout long: only the
    // client's stall can close it.
    let (server, _dir) = start(&format!(
        "idle_timeout: 1s\nupstream: {{url: {}, idle_timeout: 1h}}\n",
        upstream.url()
    ));
    let mut stream = TcpStream::connect(server.addr).unwrap();
    let download = format!(
        "GET /bytes/{} HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n\r\n",
        100u64 << 30
    );
    stream.write_all(download.as_bytes()).unwrap();
    wait_until("the download to start", || {
        upstream.hits(&format!("/bytes/{}", 100u64 << 30)) == 1
    });
    // Not a byte read: the socket buffers fill, and sluice has nothing more it can write.
    wait_until("the stalled connection to be closed", || {
        metric(&server, "sluice_open_connections") == 0
    });
    wait_until("the upstream to see its download dropped", || {
        upstream.abandoned() == 1
    });
    drop(stream);
}

#[test]
fn requests_go_to_the_upstream_of_the_longest_matching_route_else_to_the_url() {
    let (api, web) = (Upstream::start("api"), Upstream::start("web"));
    let (server, _dir) = start(&format!(
        "upstream: {{url: {}, routes: [{{prefix: /api/, url: {}}}]}}\n",
        web.url(),
        api.url()
    ));
    let mut client = server.client();
    for (path, name) in [("/api/x", "api"), ("/other", "web"), ("/apiary", "web")] {
        let answer = client.get(path, &[TESTER]);
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        assert_eq!(answer.header("x-upstream"), Some(name), "{path}");
    }
    assert_eq!((api.hits("/api/x"), api.total()), (1, 1));
    assert_eq!((web.hits("/other"), web.hits("/apiary"), web.total()), (1, 1, 2));
}

#[test]
fn with_routes_alone_an_unrouted_path_is_answered_404() {
    let api = Upstream::start("api");
    let (server, _dir) = start(&format!(
        "upstream: {{routes: [{{prefix: /api/, url: {}}}]}}\n",
        api.url()
    ));
    let mut client = server.client();
    let answer = client.get("/other", &[TESTER]);
    assert_eq!(answer.status, 404, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/problem+json"));
    assert_eq!(api.total(), 0);
    assert_eq!(client.get("/api/x", &[TESTER]).header("x-upstream"), Some("api"));
}

#[test]
fn the_demo_profiles_pass_through_the_proxy_and_only_admitted_requests_reach_the_upstream() {
    let upstream = Upstream::start("app");
    let dir = TempDir::new();
    let config = format!(
        "{}\nupstream: {}\n",
        sluice_config::DEFAULT_CONFIG,
        upstream.url()
    );
    let config = dir.write("sluice.yaml", &config);
    let out = dir.path().join("run");
    let output = sluice()
        .args([
            "loadtest",
            "--spawn",
            "--trials",
            "1",
            "--no-progress",
            "--profiles",
            "demo",
        ])
        .args(["--duration", "3s", "--connections", "1", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // As without the proxy: every verdict passes (exit 1 is a failed verdict, 2 a failed run).
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    let tsv = std::fs::read_to_string(out.join("results.tsv")).unwrap();
    let mut lines = tsv.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let rows: Vec<Vec<&str>> = lines.map(|line| line.split('\t').collect()).collect();
    assert_eq!(rows.len(), 12, "{tsv}");
    let column = |row: &[&str], name: &str| row[header.iter().position(|h| *h == name).unwrap()].to_owned();
    let verdict = |profile: &str| {
        let row = rows.iter().find(|row| row[0] == profile).unwrap();
        column(row, "verdict")
    };
    // Quotas far below what one connection offers: always saturated, so judged.
    for profile in [
        "invalid@example.com",
        "ANONYMOUS",
        "alice@example.com",
        "bob@example.com",
        "carol@example.com",
        "chuck@example.com",
    ] {
        assert_eq!(verdict(profile), "PASS", "{profile}: {stdout}");
    }
    let sum = |name: &str| -> u64 {
        (rows.iter())
            .map(|row| column(row, name).parse::<f64>().unwrap() as u64)
            .sum()
    };
    assert_eq!(sum("errors"), 0, "{tsv}");
    assert!(sum("requests denied") > 0, "{tsv}");
    assert_eq!(
        upstream.total(),
        sum("requests allowed"),
        "every admitted request reached the upstream, and nothing else: {tsv}"
    );
}

/// Writes `request` on a new connection and reads the answer.
fn raw(server: &Server, request: &str) -> common::upstream::Streamed {
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    read_response(&mut BufReader::new(stream))
}

#[test]
fn an_idle_tunnel_is_closed_after_the_idle_timeout() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!(
        "upstream: {{url: {}, idle_timeout: 1s}}\n",
        upstream.url()
    ));
    let upgrade = "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nX-Account-ID: tester\r\n\r\n";
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(upgrade.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    assert_eq!(read_head(&mut reader).status, 101);
    // Traffic keeps it open past the timeout...
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        stream.write_all(b"ping").unwrap();
        let mut echoed = [0; 4];
        reader.read_exact(&mut echoed).unwrap();
        assert_eq!(&echoed, b"ping");
    }
    // ...silence closes it.
    let quiet = std::time::Instant::now();
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    let closed_after = quiet.elapsed();
    assert!(
        closed_after >= Duration::from_millis(900) && closed_after < PATIENCE,
        "closed after {closed_after:?}"
    );
}

#[test]
fn an_h2c_upgrade_is_not_passed_on_and_a_protocol_not_offered_is_refused() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {}\n", upstream.url()));
    // h2c alone: forwarded as a plain request, with neither field.
    let h2c = "GET /headers HTTP/1.1\r\nHost: test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nX-Account-ID: tester\r\n\r\n";
    let answer = raw(&server, h2c);
    assert_eq!(answer.status, 200, "{answer:?}");
    for name in ["upgrade: ", "connection: ", "http2-settings: "] {
        assert!(
            !answer.text.to_ascii_lowercase().contains(name),
            "{name} reached the upstream: {}",
            answer.text
        );
    }
    // The test upstream switches `/ws` to websocket whatever is asked: offered h2c alone,
    // that is a protocol the client never offered.
    let answer = raw(
        &server,
        "GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nX-Account-ID: tester\r\n\r\n",
    );
    assert_eq!(answer.status, 502, "{answer:?}");
    // Offered with another protocol, h2c is dropped and the other kept.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
        .write_all(b"GET /ws HTTP/1.1\r\nHost: test\r\nConnection: Upgrade\r\nUpgrade: h2c, websocket\r\nX-Account-ID: tester\r\n\r\n")
        .unwrap();
    let switched = read_head(&mut BufReader::new(stream));
    assert_eq!(switched.status, 101, "{switched:?}");
    assert_eq!(switched.header("upgrade"), Some("websocket"));
}

#[test]
fn requests_the_upstream_could_read_otherwise_are_refused_before_it() {
    let upstream = Upstream::start("app");
    let (server, _dir) = start(&format!("upstream: {{url: {}, host: keep}}\n", upstream.url()));
    let cases = [
        (
            "a coding besides chunked",
            "POST /echo HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: gzip, chunked\r\nX-Account-ID: tester\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            501,
        ),
        (
            "no Host field in HTTP/1.1",
            "GET /echo HTTP/1.1\r\nX-Account-ID: tester\r\n\r\n",
            400,
        ),
        (
            "two Host fields",
            "GET /echo HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\nX-Account-ID: tester\r\n\r\n",
            400,
        ),
        (
            "a Host other than the target's",
            "GET http://a.example/echo HTTP/1.1\r\nHost: b.example\r\nX-Account-ID: tester\r\n\r\n",
            400,
        ),
    ];
    for (what, request, status) in cases {
        let answer = raw(&server, request);
        assert_eq!(answer.status, status, "{what}: {answer:?}");
        assert_eq!(
            answer.header("content-type"),
            Some("application/problem+json"),
            "{what}"
        );
    }
    assert_eq!(upstream.hits("/echo"), 0, "none reached the upstream");
    // The target's own authority as Host, in any case, is forwarded.
    let answer = raw(
        &server,
        "GET http://A.example/headers HTTP/1.1\r\nHost: a.EXAMPLE\r\nX-Account-ID: tester\r\n\r\n",
    );
    assert_eq!(answer.status, 200, "{answer:?}");
}
