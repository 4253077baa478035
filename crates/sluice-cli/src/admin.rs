//! The admin listener (`admin.listen`): what an operator asks during an incident.
//!
//! | request | answer |
//! |---|---|
//! | `GET /metrics` | every number in OpenMetrics text ([`crate::metrics`]) |
//! | `GET /healthz` | 200 while the process answers |
//! | `GET /readyz` | 200 or 503, with a JSON body naming each check: config, rules, Redis |
//! | `GET /v1/rule-stats` | every rule with its limit and decisions (JSON; the console's source) |
//! | `GET /v1/top?rule=R&n=N` | the keys rule `R` (its place or name) denied most over about the last minute |
//! | `GET /v1/top?domain=D&n=N` | the keys denied most across every rule (of domain `D` only, if given), each with its rule |
//! | `GET /ui` | the live console, its assets in the binary |
//! | `/rules/...` | with `rules: {url}`: the rules service's API (`/v1/...`), forwarded with the caller's own `Authorization`, so the console edits rules with the user's token, never the host's |

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, Uri};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use serde::{Deserialize, Serialize};
use sluice_descriptors::Limit;
use sluice_redis::FailurePolicy;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::metrics::Observed;

/// The most keys `/v1/top` lists.
const MAX_TOP: usize = sluice_service::TOP_KEYS * 2;

/// How often readiness is checked for the gRPC health service.
const READINESS_EVERY: Duration = Duration::from_secs(1);

/// The admin routes over what the host observes.
pub fn router(observed: Observed) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/v1/rule-stats", get(rule_stats))
        .route("/v1/top", get(top))
        .route("/ui", get(console))
        .route("/rules/{*path}", any(rules_api))
        .layer(DefaultBodyLimit::max(sluice_rules::MAX_RULES_BYTES))
        .with_state(observed)
}

/// Serves the admin routes on `listener` (over `tls` if given) until `stop` turns true.
pub fn serve(
    observed: Observed,
    listener: TcpListener,
    tls: Option<Arc<crate::tls::ServerTls>>,
    stop: watch::Receiver<bool>,
) {
    let app = router(observed);
    let mut stopping = stop.clone();
    let stopped = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    tokio::spawn(async move {
        let served = match tls {
            None => axum::serve(listener, app).with_graceful_shutdown(stopped).await,
            Some(tls) => match crate::tls::TlsListener::new(listener, tls, stop) {
                Ok(listener) => axum::serve(listener, app).with_graceful_shutdown(stopped).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = served {
            tracing::error!("admin: {e}");
        }
    });
}

/// Checks readiness every second into `ready` (what the gRPC health service reports) until
/// `stop` turns true.
pub fn watch_readiness(
    observed: Observed,
    ready: watch::Sender<bool>,
    mut draining: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            let (now, _) = readiness(&observed).await;
            ready.send_if_modified(|was| std::mem::replace(was, now) != now);
            tokio::select! {
                () = tokio::time::sleep(READINESS_EVERY) => {}
                // Draining starts: said at once, not at the next tick.
                Ok(()) = draining.changed() => {}
                _ = stop.wait_for(|stop| *stop) => return,
            }
        }
    });
}

async fn metrics(State(observed): State<Observed>) -> Response {
    match observed.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics could not be written\n",
        )
            .into_response(),
    }
}

/// One readiness check.
#[derive(Debug, Serialize)]
struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// Whether the host is ready, and each check.
async fn readiness(observed: &Observed) -> (bool, Vec<Check>) {
    let mut checks = vec![Check {
        name: "config",
        ok: true,
        detail: "loaded".into(),
    }];
    if observed.state.draining.load(Relaxed) {
        checks.push(Check {
            name: "shutdown",
            ok: false,
            detail: "stopping: still answering while load balancers move away".into(),
        });
    }
    if observed.service.is_some() {
        let state = &observed.state;
        let revision = state.rules_revision.load(Relaxed);
        let mut detail = if state.rules_from_snapshot.load(Relaxed) {
            format!("revision {revision}, from the snapshot file")
        } else if revision > 0 {
            format!("revision {revision}, from the rules service")
        } else {
            "from files".into()
        };
        if state.rules_service_down.load(Relaxed) {
            detail.push_str("; the rules service does not answer now (the rules in force stay)");
        }
        checks.push(Check {
            name: "rules",
            ok: true,
            detail,
        });
    }
    for (name, engine) in observed.engines() {
        let Some(redis) = engine.redis() else { continue };
        let (ok, detail) = match redis.store.ping().await {
            Ok(()) => (true, "answers".to_owned()),
            Err(e) => match redis.policy {
                FailurePolicy::FailClosed => (false, format!("{e}; fail_closed denies every request")),
                policy => (true, format!("{e}; answering by the failure policy ({policy:?})")),
            },
        };
        checks.push(Check {
            name: if name == "service" {
                "redis (service)"
            } else {
                "redis"
            },
            ok,
            detail,
        });
    }
    (checks.iter().all(|c| c.ok), checks)
}

async fn readyz(State(observed): State<Observed>) -> Response {
    let (ready, checks) = readiness(&observed).await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({ "ready": ready, "checks": checks });
    (status, axum::Json(body)).into_response()
}

#[derive(Serialize)]
struct RuleBody {
    engine: &'static str,
    domain: String,
    rule: String,
    name: Option<String>,
    limit: String,
    shadow_mode: bool,
    allowed: u64,
    denied: u64,
    shadow_denied: u64,
    near_limit: u64,
}

async fn rule_stats(State(observed): State<Observed>) -> Response {
    let mut body = Vec::new();
    for (engine_name, engine) in observed.engines() {
        for report in engine.rule_counts() {
            body.push(RuleBody {
                engine: engine_name,
                domain: report.domain,
                rule: report.rule.to_string(),
                name: report.name,
                limit: match report.limit {
                    Limit::Quota(quota) => std::iter::once(&quota)
                        .chain(&report.stacked)
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    Limit::Unlimited => "unlimited".into(),
                },
                shadow_mode: report.shadow_mode,
                allowed: report.counts.allowed,
                denied: report.counts.denied,
                shadow_denied: report.counts.shadow_denied,
                near_limit: report.counts.near_limit,
            });
        }
    }
    body.sort_by(|a, b| (a.engine, &a.rule).cmp(&(b.engine, &b.rule)));
    axum::Json(body).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TopQuery {
    rule: Option<String>,
    domain: Option<String>,
    n: Option<usize>,
}

async fn top(
    State(observed): State<Observed>,
    query: Result<Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let usage = "ask /v1/top [?domain=DOMAIN | ?rule=RULE (its place or name)] [&n=N]\n";
    let Ok(Query(query)) = query else {
        return (StatusCode::BAD_REQUEST, usage).into_response();
    };
    let n = query.n.unwrap_or(10).clamp(1, MAX_TOP);
    let engines = observed.engines();
    let Some(rule) = query.rule else {
        return top_across(&engines, query.domain.as_deref(), n);
    };
    if query.domain.is_some() {
        return (StatusCode::BAD_REQUEST, usage).into_response();
    }
    for (_, engine) in engines {
        if let Some(keys) = engine.top_denied(&rule, n) {
            let keys: Vec<_> = keys
                .into_iter()
                .map(|(key, denied)| serde_json::json!({ "key": key, "denied": denied }))
                .collect();
            return axum::Json(serde_json::json!({ "rule": rule, "keys": keys })).into_response();
        }
    }
    (StatusCode::NOT_FOUND, format!("no rule {rule:?}\n")).into_response()
}

/// The keys denied most across every rule of every engine (of `domain`'s rules only, if
/// given), each with its rule.
fn top_across(
    engines: &[(&'static str, Arc<sluice_service::Engine>)],
    domain: Option<&str>,
    n: usize,
) -> Response {
    let mut keys = Vec::new();
    let mut found = domain.is_none();
    for (engine_name, engine) in engines {
        if let Some(top) = engine.top_denied_across(domain, n) {
            found = true;
            keys.extend(top.into_iter().map(|top| (*engine_name, top)));
        }
    }
    if !found {
        let domain = domain.unwrap_or_default();
        return (StatusCode::NOT_FOUND, format!("no domain {domain:?}\n")).into_response();
    }
    keys.sort_by(|(_, a), (_, b)| b.denied.cmp(&a.denied).then_with(|| a.key.cmp(&b.key)));
    keys.truncate(n);
    let keys: Vec<_> = (keys.into_iter())
        .map(|(engine, top)| {
            serde_json::json!({
                "key": top.key,
                "denied": top.denied,
                "engine": engine,
                "domain": top.domain,
                "rule": top.rule.to_string(),
                "name": top.name,
            })
        })
        .collect();
    axum::Json(serde_json::json!({ "domain": domain, "keys": keys })).into_response()
}

async fn console() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("console.html"),
    )
        .into_response()
}

/// What is forwarded of a console's request to the rules service, and of its answer back.
const FORWARDED: [header::HeaderName; 4] = [
    header::AUTHORIZATION,
    header::IF_MATCH,
    header::IF_NONE_MATCH,
    header::CONTENT_TYPE,
];
const ANSWERED: [header::HeaderName; 3] = [header::CONTENT_TYPE, header::ETAG, header::WWW_AUTHENTICATE];

async fn rules_api(
    State(observed): State<Observed>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let Some(source) = &observed.rules_service else {
        return (
            StatusCode::NOT_FOUND,
            "this host reads its rules from files: there is no rules service to edit\n",
        )
            .into_response();
    };
    let Ok(body) = body else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "a body is at most 4 MiB\n").into_response();
    };
    // The path as the client wrote it (still percent-encoded), after `/rules/`.
    let path = uri.path().strip_prefix("/rules/").unwrap_or("");
    let path = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let forwarded = FORWARDED
        .iter()
        .filter_map(|name| Some((name.clone(), headers.get(name)?.clone())))
        .collect();
    match source.forward(method, &path, forwarded, body).await {
        Ok((status, headers, body)) => {
            let mut answer = (status, body).into_response();
            for name in ANSWERED {
                if let Some(value) = headers.get(&name) {
                    answer.headers_mut().insert(name, value.clone());
                }
            }
            answer
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("rules service: {e}\n")).into_response(),
    }
}
