//! The rules service's write bodies: a domain's rules file (`PUT`) and a JSON Patch on it
//! (`PATCH`), through the API's own router on an in-memory store; what is stored is then read
//! as a host's retriever reads it.

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use http::{Request, StatusCode, header};
use serde_json::Value;
use sluice_descriptors::{Rule, parse_domain};
use sluice_rules::{MAX_RULES_BYTES, RulesApi, SqliteStore, Tokens};
use sluice_rules_client::{DomainBody, Snapshot};

use crate::input::Input;
use crate::service::{block_on, call};

/// The domains a written file is filed under.
const DOMAINS: [&str; 2] = ["edge", "api"];

/// What every patch applies to: nesting, values, a quota text, names and `replaces`.
pub(crate) const PATCHED: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60, name: per_user}
    descriptors:
      - key: path
        value: /export
        rate_limit: {quota: 1/h burst 2, algorithm: fixed_window}
  - key: plan
    value: gold
    rate_limit: {unit: day, requests_per_unit: 100, replaces: [{name: per_user}]}
";

/// `data` as a rules file `PUT` to a domain (the first byte picks which): never a panic or a
/// server error; a body that is not UTF-8 is a 400, rules the validator refuses or that name
/// another domain a 422; stored rules are read back exactly as written, a host's retriever
/// takes the store's snapshot with the same rules, and a patch with no operations leaves the
/// rules as they were (the patch's YAML round trip keeps every rule) or is refused as one
/// that would change them.
///
/// # Example
/// ```
/// sluice_invariants::rules_document(b"\x00domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n");
/// sluice_invariants::rules_document(b"\x01domain: api\ndescriptors: {}");
/// ```
pub fn rules_document(data: &[u8]) {
    let mut input = Input::new(data);
    let domain = input.pick(&DOMAINS);
    let body = input.rest();
    block_on(async {
        let mut api = api();
        let (status, answer) = put(&mut api, domain, body).await;
        let Ok(text) = std::str::from_utf8(body) else {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{answer:?}");
            return;
        };
        let parsed = parse_domain(text);
        match &parsed {
            Ok(rules) if rules.name() == domain => {}
            _ => {
                assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{parsed:?}: {answer:?}");
                return;
            }
        }
        assert_eq!(status, StatusCode::CREATED, "{answer:?}");
        let stored = read(&mut api, domain).await;
        assert_eq!(stored.rules, text, "stored otherwise than written");
        let rules = sorted_rules(text);
        hosts_take(&mut api, domain, &rules).await;

        let (status, answer) = patch(&mut api, domain, b"[]").await;
        if status == StatusCode::CONFLICT {
            // Rules a document would change (`value: 1e3`) are refused, never changed.
            let answer = String::from_utf8_lossy(&answer);
            assert!(answer.contains("Stored rules not patchable"), "{answer}");
            assert_eq!(read(&mut api, domain).await.rules, text);
            return;
        }
        assert_eq!(
            status,
            StatusCode::OK,
            "an empty patch of stored rules: {answer:?}"
        );
        let patched = read(&mut api, domain).await;
        assert_eq!(
            sorted_rules(&patched.rules),
            rules,
            "an empty patch changed the rules:\n{text}\n---\n{}",
            patched.rules
        );
    });
}

/// `data` as a JSON Patch on a stored domain: never a panic or a server error; the answer is
/// 200, 400 (not a patch, or too many operations), 409 (a `test` failed: only for a patch
/// with one) or 422; a refused patch changes nothing; a patched domain is valid rules of the
/// same domain, no larger than a rules file may be, and a host's retriever takes it.
///
/// # Example
/// ```
/// sluice_invariants::rules_patch(br#"[{"op": "replace", "path": "/descriptors/0/rate_limit/requests_per_unit", "value": 30}]"#);
/// sluice_invariants::rules_patch(br#"[{"op": "copy", "from": "", "path": "/x"}]"#);
/// ```
pub fn rules_patch(data: &[u8]) {
    block_on(async {
        let mut api = api();
        let (status, answer) = put(&mut api, "edge", PATCHED.as_bytes()).await;
        assert_eq!(status, StatusCode::CREATED, "{answer:?}");
        let (status, answer) = patch(&mut api, "edge", data).await;
        match status {
            StatusCode::OK => {
                let stored = read(&mut api, "edge").await;
                assert!(
                    stored.rules.len() <= MAX_RULES_BYTES,
                    "patched to {} bytes",
                    stored.rules.len()
                );
                let rules = sorted_rules(&stored.rules);
                hosts_take(&mut api, "edge", &rules).await;
                return;
            }
            StatusCode::BAD_REQUEST => {}
            StatusCode::CONFLICT => {
                let operations: Vec<Value> = serde_json::from_slice(data).unwrap_or_default();
                assert!(
                    operations.iter().any(|op| op["op"] == "test"),
                    "a test failed in a patch without one: {answer:?}"
                );
            }
            StatusCode::UNPROCESSABLE_ENTITY => {}
            other => panic!("answered {other}: {answer:?}"),
        }
        let stored = read(&mut api, "edge").await;
        assert_eq!(
            (stored.rules.as_str(), stored.revision),
            (PATCHED, 1),
            "a refused patch changed the rules"
        );
    });
}

fn api() -> Router {
    let store = match SqliteStore::in_memory() {
        Ok(store) => Arc::new(store),
        Err(e) => panic!("an in-memory store: {e}"),
    };
    RulesApi::new(store, Tokens::default()).router()
}

fn request(method: &str, path: &str, kind: &str, body: &[u8]) -> Request<Body> {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, kind)
        .header(header::IF_MATCH, "*")
        .body(Body::from(body.to_vec()));
    match request {
        Ok(request) => request,
        Err(e) => panic!("{method} {path}: {e}"),
    }
}

/// Creates `domain` with `body` (a `PUT` without `If-Match`).
async fn put(api: &mut Router, domain: &str, body: &[u8]) -> (StatusCode, Bytes) {
    let mut put = request("PUT", &format!("/v1/domains/{domain}"), "application/yaml", body);
    put.headers_mut().remove(header::IF_MATCH);
    call(api, put).await
}

async fn patch(api: &mut Router, domain: &str, body: &[u8]) -> (StatusCode, Bytes) {
    let kind = "application/json-patch+json";
    call(
        api,
        request("PATCH", &format!("/v1/domains/{domain}"), kind, body),
    )
    .await
}

async fn get(api: &mut Router, path: &str) -> Bytes {
    let (status, body) = call(api, request("GET", path, "application/json", b"")).await;
    assert_eq!(status, StatusCode::OK, "GET {path}: {body:?}");
    body
}

async fn read(api: &mut Router, domain: &str) -> DomainBody {
    let body = get(api, &format!("/v1/domains/{domain}")).await;
    match serde_json::from_slice(&body) {
        Ok(domain) => domain,
        Err(e) => panic!("GET {domain}: {e}: {body:?}"),
    }
}

/// The store's snapshot, read as a host's retriever reads it, holds `domain` alone with
/// `rules`.
async fn hosts_take(api: &mut Router, domain: &str, rules: &[Rule]) {
    let snapshot = match Snapshot::from_json(get(api, "/v1/rules").await) {
        Ok(snapshot) => snapshot,
        Err(e) => panic!("a host refuses what the store took: {e}"),
    };
    let held = snapshot.rules.domain(domain).map(|d| {
        let mut held: Vec<Rule> = d.rules().cloned().collect();
        held.sort_by(|a, b| a.id.cmp(&b.id));
        held
    });
    assert_eq!(held.as_deref(), Some(rules), "the host holds other rules");
}

/// The rules `text` gives, in the order of their places.
fn sorted_rules(text: &str) -> Vec<Rule> {
    let domain = match parse_domain(text) {
        Ok(domain) => domain,
        Err(e) => panic!("stored rules that do not check: {e}\n{text}"),
    };
    let mut rules: Vec<Rule> = domain.rules().cloned().collect();
    rules.sort_by(|a, b| a.id.cmp(&b.id));
    rules
}
