//! The HTTP check API over a real socket: decisions, peeks, and problem+json for what is wrong.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use sluice_descriptors::RuleSet;
use sluice_service::{CheckApi, Engine, EngineSettings};

async fn serve() -> SocketAddr {
    let rules = RuleSet::from_yaml(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .unwrap();
    let engine = Arc::new(Engine::new(rules, EngineSettings::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(CheckApi::new(engine).serve(listener, std::future::pending()));
    addr
}

/// Posts `body` to `path` and returns (status, content type, body).
async fn post(addr: SocketAddr, path: &str, content_type: &str, body: Vec<u8>) -> (u16, String, String) {
    let path = path.to_owned();
    let content_type = content_type.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        let _ = stream.write_all(&body);
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer[9..12].parse().unwrap();
        let lower = answer.to_ascii_lowercase();
        let kind = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or_default()
            .trim()
            .to_owned();
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, kind, body)
    })
    .await
    .unwrap()
}

const ALICE: &str = r#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;

#[tokio::test]
async fn checks_count_and_a_peek_does_not() {
    let addr = serve().await;
    let json = "application/json";
    let (status, _, body) = post(addr, "/v1/check", json, ALICE.into()).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#""overall_code":"OK""#) && body.contains(r#""limit_remaining":1"#),
        "{body}"
    );
    for _ in 0..3 {
        let (_, _, body) = post(addr, "/v1/check?peek=true", json, ALICE.into()).await;
        assert!(
            body.contains(r#""limit_remaining":1"#),
            "a peek counts nothing: {body}"
        );
    }
    post(addr, "/v1/check", json, ALICE.into()).await;
    let (status, _, body) = post(addr, "/v1/check", json, ALICE.into()).await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#""overall_code":"OVER_LIMIT""#) && body.contains("retry_after_ms"),
        "{body}"
    );
    // By default an answer writes no rate-limit fields for the caller.
    assert!(!body.contains("headers"), "{body}");
}

#[tokio::test]
async fn what_is_wrong_is_named_in_problem_json() {
    let addr = serve().await;
    let json = "application/json";
    let cases: [(&str, Vec<u8>, u16, &str); 7] = [
        ("malformed", b"{\"domain\":".to_vec(), 400, "EOF"),
        // Once answered: the second, slower reading (to name the field) stops at the request.
        (
            "trailing characters",
            br#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}]}]} x"#.to_vec(),
            400,
            "trailing characters",
        ),
        ("missing field", br#"{"descriptors":[]}"#.to_vec(), 400, "domain"),
        (
            "missing value",
            br#"{"domain":"api","descriptors":[{"entries":[{"key":"user"}]}]}"#.to_vec(),
            400,
            "descriptors[0].entries[0]",
        ),
        (
            "unknown field",
            br#"{"domain":"api","descriptors":[],"hitz":1}"#.to_vec(),
            400,
            "hitz",
        ),
        (
            "no descriptors",
            br#"{"domain":"api","descriptors":[]}"#.to_vec(),
            400,
            "descriptors is empty",
        ),
        (
            "bad limit",
            br#"{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"a"}],"limit":"lots"}]}"#
                .to_vec(),
            400,
            "descriptors[0].limit",
        ),
    ];
    for (name, body, expected, detail) in cases {
        let (status, kind, text) = post(addr, "/v1/check", json, body).await;
        assert_eq!(
            (status, kind.as_str()),
            (expected, "application/problem+json"),
            "{name}: {text}"
        );
        assert!(text.contains(detail), "{name}: {text}");
    }
    let (status, kind, text) = post(addr, "/v1/check", json, vec![b' '; 70 * 1024]).await;
    assert_eq!(
        (status, kind.as_str()),
        (413, "application/problem+json"),
        "{text}"
    );
    let (status, kind, _) = post(addr, "/v1/check", "text/plain", ALICE.into()).await;
    assert_eq!((status, kind.as_str()), (415, "application/problem+json"));
}
