//! `sluice serve`'s resource bounds over real sockets: connections beyond `max_connections`
//! wait until one closes; over-large request heads and too many headers are answered 431 and
//! the connection closed; ordinary requests are unaffected.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use common::{PATIENCE, Server, TempDir};

const CONFIG: &str = "
fetch_latency: 0s
bypass: [admin@example.com]
";

fn start(config: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (server, dir)
}

/// A GET of `/` as the bypassing account, with `extra` header lines.
fn request(extra: &str) -> String {
    format!("GET / HTTP/1.1\r\nHost: test\r\nX-Account-ID: admin@example.com\r\n{extra}\r\n")
}

/// Reads one response's status line and everything up to the end of the connection (or of
/// the first response, for one kept open: its body is `Hello World!`).
fn status_of(stream: &mut TcpStream) -> u16 {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&seen);
        if let Some(line) = text.lines().next().filter(|_| text.contains("\r\n\r\n")) {
            return line
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("bad status line {line:?}"));
        }
        match stream.read(&mut buf) {
            Ok(0) => panic!("closed before a response: {text:?}"),
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) => panic!("no response ({e}): {text:?}"),
        }
    }
}

/// Whether the server closes the connection (reads end, or are reset) within `PATIENCE`.
fn closed(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn beyond_max_connections_a_connection_is_served_once_another_closes() {
    let (server, _dir) = start(&format!("{CONFIG}max_connections: 2\n"));
    let mut first = server.client();
    let mut second = server.client();
    assert_eq!(first.as_account(Some("admin@example.com")).status, 200);
    assert_eq!(second.as_account(Some("admin@example.com")).status, 200);

    let mut third = TcpStream::connect(server.addr).unwrap();
    third.write_all(request("").as_bytes()).unwrap();
    // The two served connections go on answering, round trip after round trip, while the
    // third's request, sent before them, gets nothing.
    for _ in 0..20 {
        assert_eq!(first.as_account(Some("admin@example.com")).status, 200);
        assert_eq!(second.as_account(Some("admin@example.com")).status, 200);
    }
    third.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    match third.peek(&mut byte) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        other => panic!("the third connection was answered at the limit: {other:?}"),
    }
    third.set_nonblocking(false).unwrap();
    third.set_read_timeout(Some(PATIENCE)).unwrap();

    drop(first);
    assert_eq!(status_of(&mut third), 200, "served once a place freed");
    assert_eq!(second.as_account(Some("admin@example.com")).status, 200);
}

#[test]
fn an_over_large_request_head_gets_431_and_the_connection_closes() {
    let (server, _dir) = start(CONFIG);
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    // 100 KB in one header; the server stops reading at its limit, so the write is on its own
    // thread and may fail once the connection is closed.
    let big = request(&format!("X-Big: {}\r\n", "b".repeat(100_000)));
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = stream.write_all(big.as_bytes());
        })
    };
    assert_eq!(status_of(&mut stream), 431);
    assert!(closed(&mut stream), "the connection stays open after a 431");
    writer.join().unwrap();

    // A head within the default bound (32 KiB) is served as any other.
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    let fits = request(&format!("X-Big: {}\r\n", "b".repeat(20_000)));
    stream.write_all(fits.as_bytes()).unwrap();
    assert_eq!(status_of(&mut stream), 200);
}

#[test]
fn max_header_bytes_and_max_headers_are_configurable() {
    let (server, _dir) = start(&format!("{CONFIG}max_header_bytes: 2048\nmax_headers: 20\n"));
    let send = |extra: &str| {
        let mut stream = TcpStream::connect(server.addr).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        stream.write_all(request(extra).as_bytes()).unwrap();
        stream
    };
    // Complete heads just over 2 KiB: below hyper's least buffer, yet refused.
    let mut stream = send(&format!("X-Big: {}\r\n", "b".repeat(2100)));
    assert_eq!(status_of(&mut stream), 431);
    assert!(closed(&mut stream));
    let mut stream = send(&format!("X-Big: {}\r\n", "b".repeat(1500)));
    assert_eq!(status_of(&mut stream), 200);

    let headers = |n: usize| (0..n).map(|i| format!("X-H{i}: {i}\r\n")).collect::<String>();
    let mut stream = send(&headers(25));
    assert_eq!(status_of(&mut stream), 431);
    assert!(closed(&mut stream));
    let mut stream = send(&headers(10));
    assert_eq!(status_of(&mut stream), 200);
}

#[test]
fn the_default_header_count_bound_is_hyper_s_hundred() {
    let (server, _dir) = start(CONFIG);
    let headers = |n: usize| (0..n).map(|i| format!("X-H{i}: {i}\r\n")).collect::<String>();
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request(&headers(120)).as_bytes()).unwrap();
    assert_eq!(status_of(&mut stream), 431);
    let mut stream = TcpStream::connect(server.addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(request(&headers(90)).as_bytes()).unwrap();
    assert_eq!(status_of(&mut stream), 200);
}

#[test]
fn validate_reports_the_connection_limit_and_refuses_nonsense() {
    let dir = TempDir::new();
    let run = |text: &str| {
        let file = dir.write("bounds.yaml", text);
        let out = common::sluice().arg("validate").arg(&file).output().unwrap();
        (
            out.status.success(),
            String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (ok, out) = run(CONFIG);
    assert!(ok, "{out}");
    assert!(out.contains("bounds.yaml: ok; max_connections "), "{out}");
    assert!(out.contains("file-descriptor limit"), "{out}");
    let (ok, out) = run(&format!("{CONFIG}max_connections: 7\n"));
    assert!(ok && out.contains("max_connections 7 (as configured)"), "{out}");
    for (text, field) in [
        ("max_connections: 0\n", "max_connections: must be between 1"),
        ("max_header_bytes: 10\n", "max_header_bytes: must be between 1024"),
        ("max_headers: 0\n", "max_headers: must be between 1"),
    ] {
        let (ok, out) = run(&format!("{CONFIG}{text}"));
        assert!(!ok, "{text:?} passed");
        assert!(out.contains(field), "{text:?}: {out}");
    }
}
