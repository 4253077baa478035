//! The rules API over a real socket on an SQLite file: create, read, replace and delete with
//! `ETag`/`If-Match`, the snapshot's 304, problem+json for what is wrong, and tokens.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use sluice_rules::{RulesApi, SqliteStore, Tokens};

const WRITER: &str = "writer-token-0123456789";
const READER: &str = "reader-token-0123456789";

fn rules(domain: &str, per_minute: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: ip\n    rate_limit: {{unit: minute, requests_per_unit: {per_minute}}}\n"
    )
}

async fn serve(tokens: &str) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("rules.db")).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = RulesApi::new(store, tokens.parse().unwrap());
    tokio::spawn(api.serve(listener, std::future::pending()));
    (addr, dir)
}

struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim().to_string())
        })
    }
}

async fn call(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        Answer {
            status: head[9..12].parse().unwrap(),
            head: head.to_string(),
            body: body.to_string(),
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_domain_is_created_replaced_and_deleted_with_its_etag() {
    let (addr, _dir) = serve("").await;
    let created = call(addr, "PUT", "/v1/domains/edge", &[], &rules("edge", 60)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.header("etag").as_deref(), Some("\"1\""));

    let read = call(addr, "GET", "/v1/domains/edge", &[], "").await;
    assert_eq!(read.status, 200);
    let body: serde_json::Value = serde_json::from_str(&read.body).unwrap();
    assert_eq!(
        (body["revision"].as_u64(), body["rules"].as_str()),
        (Some(1), Some(rules("edge", 60).as_str()))
    );

    // A replace must say which revision it read.
    let blind = call(addr, "PUT", "/v1/domains/edge", &[], &rules("edge", 30)).await;
    assert_eq!(blind.status, 428, "{}", blind.body);
    let replaced = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("if-match", "\"1\"")],
        &rules("edge", 30),
    )
    .await;
    assert_eq!(
        (replaced.status, replaced.header("etag").as_deref()),
        (200, Some("\"2\""))
    );
    let stale = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("if-match", "\"1\"")],
        &rules("edge", 10),
    )
    .await;
    assert_eq!(stale.status, 412);
    assert_eq!(
        stale.header("content-type").as_deref(),
        Some("application/problem+json")
    );
    assert!(stale.body.contains("revision 2"), "{}", stale.body);
    // Create-only on an existing domain.
    let again = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("if-none-match", "*")],
        &rules("edge", 10),
    )
    .await;
    assert_eq!(again.status, 412);

    assert_eq!(
        call(addr, "DELETE", "/v1/domains/edge", &[], "").await.status,
        428
    );
    assert_eq!(
        call(addr, "DELETE", "/v1/domains/edge", &[("if-match", "\"1\"")], "")
            .await
            .status,
        412
    );
    let deleted = call(addr, "DELETE", "/v1/domains/edge", &[("if-match", "\"2\"")], "").await;
    assert_eq!(
        (deleted.status, deleted.header("etag").as_deref()),
        (204, Some("\"3\""))
    );
    assert_eq!(call(addr, "GET", "/v1/domains/edge", &[], "").await.status, 404);

    let history = call(addr, "GET", "/v1/domains/edge/history", &[], "").await;
    let changes: serde_json::Value = serde_json::from_str(&history.body).unwrap();
    let revisions: Vec<u64> = changes
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(revisions, [1, 2, 3]);
    assert_eq!(changes[2]["after"], serde_json::Value::Null);
    assert_eq!(changes[1]["who"], "local");
}

#[tokio::test]
async fn an_unchanged_store_answers_the_snapshot_poll_with_304() {
    let (addr, _dir) = serve("").await;
    call(addr, "PUT", "/v1/domains/edge", &[], &rules("edge", 60)).await;
    call(addr, "PUT", "/v1/domains/api", &[], &rules("api", 5)).await;
    let first = call(addr, "GET", "/v1/rules", &[], "").await;
    assert_eq!(
        (first.status, first.header("etag").as_deref()),
        (200, Some("\"2\""))
    );
    let snapshot: serde_json::Value = serde_json::from_str(&first.body).unwrap();
    let names: Vec<&str> = snapshot["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["domain"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "edge"]);
    let unchanged = call(addr, "GET", "/v1/rules", &[("if-none-match", "\"2\"")], "").await;
    assert_eq!((unchanged.status, unchanged.body.as_str()), (304, ""));
    call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("if-match", "\"1\"")],
        &rules("edge", 1),
    )
    .await;
    let changed = call(addr, "GET", "/v1/rules", &[("if-none-match", "\"2\"")], "").await;
    assert_eq!(
        (changed.status, changed.header("etag").as_deref()),
        (200, Some("\"3\""))
    );

    let page = call(addr, "GET", "/v1/domains?limit=1", &[], "").await;
    let listing: serde_json::Value = serde_json::from_str(&page.body).unwrap();
    assert_eq!(
        (listing["domains"][0]["domain"].as_str(), listing["next"].as_str()),
        (Some("api"), Some("api"))
    );
}

#[tokio::test]
async fn what_is_wrong_is_named() {
    let (addr, _dir) = serve("").await;
    let invalid = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[],
        "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .await;
    assert_eq!(invalid.status, 422);
    assert!(
        invalid.body.contains("descriptors[0].rate_limit.unit"),
        "{}",
        invalid.body
    );
    let elsewhere = call(addr, "PUT", "/v1/domains/edge", &[], &rules("api", 1)).await;
    assert_eq!(elsewhere.status, 422);
    assert!(elsewhere.body.contains("'api'"), "{}", elsewhere.body);
    let huge = format!(
        "domain: edge\n# {}\ndescriptors: []\n",
        "x".repeat(5 * 1024 * 1024)
    );
    assert_eq!(
        call(addr, "PUT", "/v1/domains/edge", &[], &huge).await.status,
        413
    );
    let bad_tag = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("if-match", "one")],
        &rules("edge", 1),
    )
    .await;
    assert_eq!(bad_tag.status, 400);
    assert_eq!(
        call(addr, "GET", "/v1/domains?limit=0", &[], "").await.status,
        400
    );
    assert_eq!(call(addr, "GET", "/v1/domains?lmit=3", &[], "").await.status, 400);
    // Nothing was written by any of them.
    let snapshot = call(addr, "GET", "/v1/rules", &[], "").await;
    assert_eq!(snapshot.header("etag").as_deref(), Some("\"0\""));
}

#[tokio::test]
async fn tokens_decide_who_reads_and_who_writes_and_the_history_names_them() {
    let tokens = format!("ci write {WRITER}\ndashboard read {READER}\n");
    let (addr, _dir) = serve(&tokens).await;
    let bearer = |token: &str| format!("Bearer {token}");
    let anonymous = call(addr, "PUT", "/v1/domains/edge", &[], &rules("edge", 60)).await;
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate").as_deref(), Some("Bearer"));
    let wrong = call(
        addr,
        "GET",
        "/v1/rules",
        &[("authorization", "Bearer writer-token-012345678")],
        "",
    )
    .await;
    assert_eq!(wrong.status, 401);
    let reader = bearer(READER);
    let read_only = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("authorization", &reader)],
        &rules("edge", 60),
    )
    .await;
    assert_eq!(read_only.status, 403);
    let writer = bearer(WRITER);
    let created = call(
        addr,
        "PUT",
        "/v1/domains/edge",
        &[("authorization", &writer)],
        &rules("edge", 60),
    )
    .await;
    assert_eq!(created.status, 201);
    let read = call(
        addr,
        "GET",
        "/v1/domains/edge/history",
        &[("authorization", &reader)],
        "",
    )
    .await;
    assert_eq!(read.status, 200);
    let changes: serde_json::Value = serde_json::from_str(&read.body).unwrap();
    assert_eq!(changes[0]["who"], "ci");
}

#[test]
fn tokens_files_are_checked_line_by_line() {
    let cases = [
        ("ci write", "line 1: expected NAME SCOPE TOKEN"),
        ("ci admin 0123456789abcdef0", "scope 'admin'"),
        ("ci write short", "at least 16"),
        ("ci write sha256:abc", "64 hex digits"),
        (
            "a read 0123456789abcdef0\na write 0123456789abcdef1",
            "line 2: the name 'a' is given twice",
        ),
    ];
    for (text, wanted) in cases {
        let error = text.parse::<Tokens>().unwrap_err().to_string();
        assert!(error.contains(wanted), "{text:?}: {error}");
    }
    // A token kept as its hash only.
    let hashed: Tokens = "ci write sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        .parse()
        .unwrap();
    assert!(hashed.caller("test").is_some());
}

#[tokio::test]
async fn a_json_patch_changes_one_field_at_the_revision_read() {
    let (addr, _dir) = serve("").await;
    assert_eq!(
        call(addr, "PUT", "/v1/domains/edge", &[], &rules("edge", 60))
            .await
            .status,
        201
    );
    let json_patch = [
        ("content-type", "application/json-patch+json"),
        ("if-match", "\"1\""),
    ];
    let lower = r#"[{"op": "test", "path": "/descriptors/0/rate_limit/requests_per_unit", "value": 60},
                    {"op": "replace", "path": "/descriptors/0/rate_limit/requests_per_unit", "value": 30}]"#;
    let patched = call(addr, "PATCH", "/v1/domains/edge", &json_patch, lower).await;
    assert_eq!(patched.status, 200, "{}", patched.body);
    assert_eq!(patched.header("etag").as_deref(), Some("\"2\""));
    let body: serde_json::Value = serde_json::from_str(&patched.body).unwrap();
    let text = body["rules"].as_str().unwrap();
    assert!(text.contains("requests_per_unit: 30"), "{text}");
    sluice_descriptors::parse_domain(text).unwrap();

    // The same patch again: it read revision 1, the domain is at 2.
    let stale = call(addr, "PATCH", "/v1/domains/edge", &json_patch, lower).await;
    assert_eq!(stale.status, 412, "{}", stale.body);
    let at_2 = [
        ("content-type", "application/json-patch+json"),
        ("if-match", "\"2\""),
    ];
    // At the right revision, its test fails: the value is 30 now.
    let conflict = call(addr, "PATCH", "/v1/domains/edge", &at_2, lower).await;
    assert_eq!(conflict.status, 409, "{}", conflict.body);
    // A patch whose result is not valid rules is refused with the field named.
    let invalid = r#"[{"op": "replace", "path": "/descriptors/0/rate_limit/unit", "value": "fortnight"}]"#;
    let refused = call(addr, "PATCH", "/v1/domains/edge", &at_2, invalid).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert!(
        refused.body.contains("descriptors[0].rate_limit.unit"),
        "{}",
        refused.body
    );
    // A path that is not there; no If-Match; not a JSON Patch.
    let nowhere = r#"[{"op": "remove", "path": "/descriptors/5"}]"#;
    assert_eq!(
        call(addr, "PATCH", "/v1/domains/edge", &at_2, nowhere)
            .await
            .status,
        422
    );
    let unconditional = [("content-type", "application/json-patch+json")];
    assert_eq!(
        call(addr, "PATCH", "/v1/domains/edge", &unconditional, lower)
            .await
            .status,
        428
    );
    let plain = [("content-type", "application/json"), ("if-match", "\"2\"")];
    assert_eq!(
        call(addr, "PATCH", "/v1/domains/edge", &plain, lower)
            .await
            .status,
        415
    );
    // Nothing of the refused ones was stored.
    let history = call(addr, "GET", "/v1/domains/edge/history", &[], "").await;
    let changes: serde_json::Value = serde_json::from_str(&history.body).unwrap();
    assert_eq!(changes.as_array().map(Vec::len), Some(2), "{}", history.body);
}
