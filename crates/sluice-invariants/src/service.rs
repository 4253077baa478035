//! What the decision engine's two wire front ends (RLS, the check API) share in these checks:
//! a small rules table, a fresh engine over it, and the answers' common promises.

use std::future::Future;
use std::sync::OnceLock;

use sluice::{AlgorithmKind, Quota};
use sluice_descriptors::RuleSet;
use sluice_service::{CounterSettings, Engine, EngineSettings, FieldSet};

/// Every limit named, so an answer's limit says which rule it is; an exact value, a prefix,
/// nesting, a shadow rule, an unlimited one, a replacing one, and each algorithm.
pub(crate) const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: path
    value: /login
    rate_limit: {unit: second, requests_per_unit: 1, name: login, algorithm: fixed_window}
  - key: path
    value: /api*
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2, name: shadow, algorithm: sliding_window_log}
  - key: ip
    descriptors:
      - key: path
        rate_limit: {quota: 5/s burst 2, name: ip_path, algorithm: leaky_bucket}
  - key: free
    rate_limit: {unlimited: true, name: free}
  - key: plan
    value: gold
    rate_limit: {unit: day, requests_per_unit: 100, name: gold, replaces: [{name: per_user}], algorithm: sliding_window_counter}
"#;

/// A rule of [`RULES`] by its name: its quota (none if unlimited), whether it is in shadow
/// mode, and the algorithm counting it.
pub(crate) fn rule(name: &str) -> Option<(Option<Quota>, bool, AlgorithmKind)> {
    let quota = |text: &str| match text.parse() {
        Ok(quota) => Some(quota),
        Err(e) => panic!("{text}: {e}"),
    };
    Some(match name {
        "per_user" => (quota("3/min"), false, AlgorithmKind::TokenBucket),
        "login" => (quota("1/s"), false, AlgorithmKind::FixedWindow),
        "shadow" => (quota("2/h"), true, AlgorithmKind::SlidingWindowLog),
        "ip_path" => (quota("5/s burst 2"), false, AlgorithmKind::LeakyBucket),
        "free" => (None, false, AlgorithmKind::TokenBucket),
        "gold" => (quota("100/day"), false, AlgorithmKind::SlidingWindowCounter),
        _ => return None,
    })
}

/// A fresh engine over [`RULES`], with every answer field on: each input is decided on its
/// own counters.
pub(crate) fn engine() -> Engine {
    static RULE_SET: OnceLock<RuleSet> = OnceLock::new();
    let rules = RULE_SET.get_or_init(|| match RuleSet::from_yaml(RULES) {
        Ok(rules) => rules,
        Err(e) => panic!("the checks' rules: {e}"),
    });
    let settings = EngineSettings {
        headers: FieldSet::All,
        counters: CounterSettings {
            capacity: 64,
            ..CounterSettings::default()
        },
        ..EngineSettings::default()
    };
    match Engine::new(rules.clone(), settings) {
        Ok(engine) => engine,
        Err(e) => panic!("an engine over the checks' rules: {e}"),
    }
}

/// Runs `future` to its end on this thread's runtime (one per thread, kept between inputs).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => panic!("a runtime for the checks: {e}"),
        };
    }
    RUNTIME.with(|runtime| runtime.block_on(future))
}

/// The hits a descriptor adds: its own, else the request's, else 1 (0 counts as not given).
pub(crate) fn hits(own: Option<u64>, request: Option<u64>) -> u64 {
    own.filter(|h| *h > 0).or(request.filter(|h| *h > 0)).unwrap_or(1)
}

/// A request the engine decides keeps the default bounds (`RequestBounds`).
pub(crate) fn within_bounds<'a>(
    domain: &str,
    descriptors: impl ExactSizeIterator<Item = &'a [(String, String)]>,
) -> bool {
    let text = |t: &str| t.len() <= 1024;
    let count = descriptors.len();
    !domain.is_empty()
        && text(domain)
        && (1..=64).contains(&count)
        && descriptors.into_iter().all(|entries| {
            (1..=16).contains(&entries.len()) && entries.iter().all(|(k, v)| text(k) && text(v))
        })
}

/// An answer's rate-limit fields can go into an HTTP response as they are.
pub(crate) fn fields_are_headers<'a>(fields: impl Iterator<Item = (&'a str, &'a str)>) {
    for (name, value) in fields {
        assert!(
            http::HeaderName::from_bytes(name.as_bytes()).is_ok(),
            "field name {name:?}"
        );
        assert!(
            http::HeaderValue::from_str(value).is_ok(),
            "field {name}: {value:?}"
        );
    }
}

/// Sends `request` through `router` (an API's own routes, as its server serves them): the
/// status and the whole body.
pub(crate) async fn call(
    router: &mut axum::Router,
    request: http::Request<axum::body::Body>,
) -> (http::StatusCode, axum::body::Bytes) {
    use tower_service::Service;
    let ready = std::future::poll_fn(|cx| Service::<http::Request<axum::body::Body>>::poll_ready(router, cx));
    if let Err(never) = ready.await {
        match never {}
    }
    let response = match router.call(request).await {
        Ok(response) => response,
        Err(never) => match never {},
    };
    let status = response.status();
    match axum::body::to_bytes(response.into_body(), usize::MAX).await {
        Ok(body) => (status, body),
        Err(e) => panic!("{status}: the body broke off: {e}"),
    }
}
