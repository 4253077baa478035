//! The check API's body (`POST /v1/check`), through the API's own router.

use http::{Request, StatusCode, header};
use serde_json::Value;
use sluice::Quota;
use sluice_service::{CheckApi, MAX_BODY_BYTES};
use std::sync::Arc;

use crate::service::{block_on, call, engine, fields_are_headers, hits, rule, within_bounds};

/// `data` as the JSON body of `POST /v1/check`, answered by the check API on a fresh engine
/// over a small rules table: never a panic; the answer is 200, a 400 problem naming what is
/// wrong, or 413 for a body over the bound, never a server error; an answered request keeps
/// the bounds and has one status per descriptor, over the limit exactly when a status not in
/// shadow mode is, with no limit only where it is not over, the override's quota (or its
/// rule's; an override the rule's algorithm cannot hold is denied) printed so it reads
/// back, no more remaining than its capacity, a retry time exactly when over, over where the
/// hits can never fit (up to the first denying status: all-or-nothing only looks at the
/// rest), and fields a response can hold.
///
/// # Example
/// ```
/// sluice_invariants::check_api(br#"{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "al"}], "limit": "2/min"}]}"#);
/// sluice_invariants::check_api(b"{\"domain\": 7}");
/// ```
pub fn check_api(data: &[u8]) {
    let mut router = CheckApi::new(Arc::new(engine())).router();
    let request = Request::post("/v1/check")
        .header(header::CONTENT_TYPE, "application/json")
        .body(axum::body::Body::from(data.to_vec()));
    let request = match request {
        Ok(request) => request,
        Err(e) => panic!("{e}"),
    };
    let (status, body) = block_on(call(&mut router, request));
    let answer: Value = match serde_json::from_slice(&body) {
        Ok(answer) => answer,
        Err(e) => panic!("{status}: not JSON ({e}): {:?}", String::from_utf8_lossy(&body)),
    };
    match status {
        StatusCode::OK => answer_holds(data, &answer),
        StatusCode::BAD_REQUEST => {
            let detail = answer["detail"].as_str().unwrap_or_default();
            assert!(!detail.is_empty(), "a refusal that says nothing: {answer}");
        }
        StatusCode::PAYLOAD_TOO_LARGE => assert!(data.len() > MAX_BODY_BYTES, "{}", data.len()),
        other => panic!("answered {other}: {answer}"),
    }
}

fn answer_holds(data: &[u8], answer: &Value) {
    let asked: Value = match serde_json::from_slice(data) {
        Ok(asked) => asked,
        Err(e) => panic!("a body that is not JSON was answered ({e}): {answer}"),
    };
    let Some(descriptors) = asked["descriptors"].as_array() else {
        panic!("answered without descriptors: {asked}");
    };
    let entries: Vec<Vec<(String, String)>> = (descriptors.iter())
        .map(|d| {
            (d["entries"].as_array().into_iter().flatten())
                .map(|e| (text(&e["key"]), text(&e["value"])))
                .collect()
        })
        .collect();
    let domain = text(&asked["domain"]);
    assert!(
        within_bounds(&domain, entries.iter().map(Vec::as_slice)),
        "a request outside the bounds was answered: {asked}"
    );
    let peek = asked["peek"] == Value::Bool(true);
    let Some(statuses) = answer["statuses"].as_array() else {
        panic!("no statuses: {answer}");
    };
    assert_eq!(statuses.len(), descriptors.len(), "{answer}");
    let mut denies = false;
    for (i, (asked_one, status)) in descriptors.iter().zip(statuses).enumerate() {
        let over = match status["code"].as_str() {
            Some("OK") => false,
            Some("OVER_LIMIT") => true,
            _ => panic!("status {i}: {status}"),
        };
        assert_eq!(
            status.get("retry_after_ms").is_some(),
            over,
            "status {i}: a retry time where it is not over, or none where it is: {status}"
        );
        let limit = &status["current_limit"];
        if limit.is_null() {
            assert!(!over, "status {i} is over no limit: {status}");
            continue;
        }
        let name = limit["name"].as_str().unwrap_or_default();
        let Some((rule_quota, shadow, kind)) = rule(name) else {
            panic!("status {i} names no rule: {status}");
        };
        assert_eq!(limit["shadow_mode"], Value::Bool(shadow), "status {i}: {status}");
        let shown = limit["quota"].as_str().unwrap_or_default();
        let Ok(quota) = shown.parse::<Quota>() else {
            panic!("status {i}: the quota {shown:?} does not read back");
        };
        let expected = match asked_one["limit"].as_str() {
            Some(text) => match text.parse::<Quota>() {
                Ok(quota) => quota,
                Err(e) => panic!("status {i}: the override {text:?} was taken: {e}"),
            },
            None => match rule_quota {
                Some(quota) => quota,
                None => panic!("status {i}: the unlimited rule {name} was counted"),
            },
        };
        if kind.check(&expected).is_err() {
            // An override the rule's algorithm cannot hold is taken, and its counter stays on
            // the failsafe quota (deny-all here): denied, and reported as that quota.
            if !peek && !denies {
                assert!(over, "status {i}: {expected} admitted on {kind}: {status}");
            }
            denies |= over && !shadow;
            continue;
        }
        assert_eq!(quota, expected, "status {i}: {status}");
        let remaining = status["limit_remaining"].as_u64();
        assert!(
            remaining.is_some_and(|left| left <= quota.capacity()),
            "status {i}: more left than {quota} holds: {status}"
        );
        let (own, request) = (asked_one["hits"].as_u64(), asked["hits"].as_u64());
        // After a descriptor that denies, all-or-nothing only looks at the rest.
        if !peek && !denies && hits(own, request) > quota.capacity() {
            assert!(over, "status {i}: more hits than {quota} holds: {status}");
        }
        denies |= over && !shadow;
    }
    let overall = if denies { "OVER_LIMIT" } else { "OK" };
    assert_eq!(answer["overall_code"], overall, "{answer}");
    let fields = answer["headers"].as_array().into_iter().flatten();
    let fields: Vec<(&str, &str)> = fields
        .map(|f| {
            (
                f["name"].as_str().unwrap_or(""),
                f["value"].as_str().unwrap_or(""),
            )
        })
        .collect();
    fields_are_headers(fields.into_iter());
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}
