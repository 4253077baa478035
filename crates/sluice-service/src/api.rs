//! The HTTP check API: `POST /v1/check` with a JSON body, answered by the engine with the same
//! statuses as the gRPC service; `?peek=true` (or `"peek": true`) counts nothing. `POST
//! /v1/report`, with the same body, charges usage known after the fact ([`Engine::report`])
//! and answers each limit's balance, negative while in debt.
//!
//! Errors are `application/problem+json` (RFC 9457) naming what was wrong.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;

use crate::request::WireDescriptor;
use crate::{CheckRequest, Code, DescriptorRequest, DescriptorStatus, Engine, Reported, Verdict};

/// The largest request body read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The HTTP check API over an [`Engine`].
///
/// # Example
/// ```no_run
/// use std::sync::Arc;
/// use sluice_descriptors::RuleSet;
/// use sluice_service::{CheckApi, Engine, EngineSettings};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let rules = RuleSet::load("ratelimit/".as_ref())?;
/// let engine = Arc::new(Engine::new(rules, EngineSettings::default())?);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8082").await?;
/// CheckApi::new(engine).serve(listener, std::future::pending()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CheckApi {
    engine: Arc<Engine>,
}

impl CheckApi {
    /// The API over `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    /// Its routes, to serve or to nest in another router.
    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/check", post(check))
            .route("/v1/report", post(report))
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            .with_state(self.engine)
    }

    /// Serves the API on `listener` until `shutdown` completes.
    ///
    /// # Errors
    /// The listener failed.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    domain: String,
    descriptors: Vec<DescriptorBody>,
    #[serde(default)]
    hits: Option<u64>,
    #[serde(default)]
    peek: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescriptorBody {
    entries: Vec<EntryBody>,
    #[serde(default)]
    hits: Option<u64>,
    /// A quota for this descriptor in place of its rule's (`"10/s burst 5"`).
    #[serde(default)]
    limit: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryBody {
    key: String,
    value: String,
}

#[derive(Serialize)]
struct VerdictBody {
    overall_code: &'static str,
    statuses: Vec<StatusBody>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<HeaderBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_metadata: Option<serde_json::Value>,
}

#[derive(Serialize)]
struct HeaderBody {
    name: String,
    value: String,
}

#[derive(Serialize)]
struct StatusBody {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<LimitBody>,
    limit_remaining: u64,
    duration_until_reset_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    /// Each limit of a descriptor of several (its rule's quotas), in the rule's order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    limits: Vec<StatusBody>,
}

#[derive(Serialize)]
struct LimitBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    quota: String,
    shadow_mode: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    quota_mode: bool,
}

fn problem(status: StatusCode, title: &'static str, detail: String) -> Response {
    sluice_http::problem(status, title, &detail).into_response()
}

/// A JSON body of type `T`, or the problem to answer: unreadable, not JSON, or malformed
/// (named where it went wrong, as `title` says).
fn read_json<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    title: &'static str,
) -> Result<T, Box<Response>> {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let status = rejection.status();
            let detail = if status == StatusCode::PAYLOAD_TOO_LARGE {
                format!("the body is larger than {MAX_BODY_BYTES} bytes")
            } else {
                rejection.body_text()
            };
            return Err(Box::new(problem(status, "Unreadable body", detail)));
        }
    };
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(';')
                .next()
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
        });
    if !json {
        return Err(Box::new(problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type",
            "the body must be JSON, with content-type: application/json".into(),
        )));
    }
    match serde_json::from_slice(&body) {
        Ok(parsed) => Ok(parsed),
        // Read again, slowly, only to name where it went wrong: the refusal stands whatever
        // the second reading says (it does not look past the request, where trailing
        // characters are).
        Err(fast) => {
            let read =
                serde_path_to_error::deserialize::<_, T>(&mut serde_json::Deserializer::from_slice(&body));
            let detail = match read {
                Err(e) if e.path().to_string() != "." => format!("{}: {}", e.path(), e.inner()),
                Err(e) => e.inner().to_string(),
                Ok(_) => fast.to_string(),
            };
            Err(Box::new(problem(StatusCode::BAD_REQUEST, title, detail)))
        }
    }
}

async fn check(
    State(engine): State<Arc<Engine>>,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let parsed: CheckBody = match read_json(&headers, body, "Malformed check request") {
        Ok(parsed) => parsed,
        Err(problem) => return *problem,
    };
    let peek = parsed.peek || asks_peek(&uri);
    let request = match to_request(parsed) {
        Ok(request) => request,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "Malformed check request", detail),
    };
    let verdict = engine
        .check_from(Some(crate::FrontEnd::CheckApi), &request, peek)
        .await;
    match verdict {
        Ok(verdict) => axum::Json(to_body(verdict)).into_response(),
        Err(e) => problem(
            StatusCode::BAD_REQUEST,
            "Check request out of bounds",
            e.to_string(),
        ),
    }
}

/// A usage report: the check's body without `peek`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportBody {
    domain: String,
    descriptors: Vec<DescriptorBody>,
    #[serde(default)]
    hits: Option<u64>,
}

#[derive(Serialize)]
struct ReportBodyOut {
    statuses: Vec<ReportedBody>,
}

/// One descriptor's account: its tightest limit's (the lowest balance), and each limit's when
/// it has several.
#[derive(Serialize)]
struct ReportedBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<LimitBody>,
    charged: u64,
    limit_remaining: i64,
    duration_until_reset_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    limits: Vec<ReportedBody>,
}

async fn report(
    State(engine): State<Arc<Engine>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let parsed: ReportBody = match read_json(&headers, body, "Malformed report") {
        Ok(parsed) => parsed,
        Err(problem) => return *problem,
    };
    let request = match CheckRequest::from_wire(parsed.domain, parsed.descriptors, parsed.hits) {
        Ok(request) => request,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, "Malformed report", detail),
    };
    match engine.report(&request).await {
        Ok(report) => axum::Json(ReportBodyOut {
            statuses: report
                .statuses
                .iter()
                .map(|limits| reported_body(limits))
                .collect(),
        })
        .into_response(),
        Err(e @ crate::RequestError::ChargeUnsupported(_)) => {
            problem(StatusCode::NOT_IMPLEMENTED, "Report not counted", e.to_string())
        }
        Err(e @ crate::RequestError::NotCharged(_)) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Report not counted",
            e.to_string(),
        ),
        Err(e) => problem(StatusCode::BAD_REQUEST, "Report out of bounds", e.to_string()),
    }
}

fn reported_one(reported: &Reported) -> ReportedBody {
    let limit = &reported.limit;
    ReportedBody {
        current_limit: Some(LimitBody {
            name: limit.name.clone(),
            quota: quota_text(limit.quota),
            shadow_mode: limit.shadow_mode,
            quota_mode: limit.quota_mode,
        }),
        charged: reported.charged,
        limit_remaining: reported.balance,
        duration_until_reset_ms: millis(reported.reset_after),
        retry_after_ms: (!reported.retry_after.is_zero()).then(|| millis(reported.retry_after)),
        limits: Vec::new(),
    }
}

fn reported_body(limits: &[Reported]) -> ReportedBody {
    let tightest = limits.iter().min_by_key(|reported| reported.balance);
    let Some(tightest) = tightest else {
        return ReportedBody {
            current_limit: None,
            charged: 0,
            limit_remaining: 0,
            duration_until_reset_ms: 0,
            retry_after_ms: None,
            limits: Vec::new(),
        };
    };
    ReportedBody {
        limits: if limits.len() > 1 {
            limits.iter().map(reported_one).collect()
        } else {
            Vec::new()
        },
        ..reported_one(tightest)
    }
}

/// Whether the query string says `peek=true` (or `peek=1`, or a bare `peek`).
fn asks_peek(uri: &Uri) -> bool {
    uri.query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "peek" | "peek=true" | "peek=1"))
    })
}

fn to_request(body: CheckBody) -> Result<CheckRequest, String> {
    CheckRequest::from_wire(body.domain, body.descriptors, body.hits)
}

impl WireDescriptor for DescriptorBody {
    fn into_request(self) -> Result<DescriptorRequest, String> {
        let limit = (self.limit.map(|text| text.parse::<sluice::Quota>()).transpose())
            .map_err(|e| format!("limit: {e}"))?;
        Ok(DescriptorRequest {
            entries: (self.entries.into_iter())
                .map(|entry| (entry.key, entry.value))
                .collect(),
            hits: self.hits,
            limit,
        })
    }
}

fn code_text(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A quota's text: formatted once per thread while answers keep naming the same quota (a
/// hot rule's), as formatting costs more than the rest of a status.
fn quota_text(quota: sluice::Quota) -> String {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(sluice::Quota, String)>> = const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return quota.to_string();
        };
        match &*last {
            Some((held, text)) if *held == quota => text.clone(),
            _ => {
                let text = quota.to_string();
                *last = Some((quota, text.clone()));
                text
            }
        }
    })
}

fn status_body(status: &DescriptorStatus) -> StatusBody {
    StatusBody {
        code: code_text(status.code),
        current_limit: status.limit.as_ref().map(|limit| LimitBody {
            name: limit.name.clone(),
            quota: quota_text(limit.quota),
            shadow_mode: limit.shadow_mode,
            quota_mode: limit.quota_mode,
        }),
        limit_remaining: status.remaining,
        duration_until_reset_ms: millis(status.reset_after),
        retry_after_ms: (status.code == Code::OverLimit).then(|| millis(status.retry_after)),
        limits: status.each.iter().map(status_body).collect(),
    }
}

fn to_body(verdict: Verdict) -> VerdictBody {
    VerdictBody {
        overall_code: code_text(verdict.overall),
        statuses: verdict.statuses.iter().map(status_body).collect(),
        headers: verdict
            .headers
            .into_iter()
            .map(|(name, value)| HeaderBody { name, value })
            .collect(),
        dynamic_metadata: verdict.dynamic_metadata.as_ref().map(json_of),
    }
}

/// A metadata tree as JSON (a number JSON cannot write, NaN or infinite, is null).
fn json_of(metadata: &sluice_descriptors::Metadata) -> serde_json::Value {
    use serde_json::Value;
    use sluice_descriptors::Metadata;
    match metadata {
        Metadata::Null => Value::Null,
        Metadata::Bool(b) => Value::Bool(*b),
        Metadata::Number(n) => serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number),
        Metadata::String(s) => Value::String(s.clone()),
        Metadata::List(items) => Value::Array(items.iter().map(json_of).collect()),
        Metadata::Map(fields) => Value::Object(
            (fields.iter())
                .map(|(name, value)| (name.clone(), json_of(value)))
                .collect(),
        ),
    }
}
