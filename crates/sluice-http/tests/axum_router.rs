//! The layer on an axum router, served over a real socket.

mod common;

use std::io::Read;
use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
use sluice_http::{CostRule, KeyPart, RateLimitLayer, RouteCosts};

use common::{connect, send, serve_on};

fn serve(router: Router) -> SocketAddr {
    serve_on(|listener| async move { axum::serve(listener, router).await.unwrap() })
}

/// One request on a fresh connection: the status line and the lower-cased head.
fn get_as(addr: SocketAddr, path: &str, account: &str) -> (u16, String, String) {
    let mut stream = connect(addr);
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nX-Account-ID: {account}\r\nConnection: close\r\n\r\n");
    let (status, head) = send(&mut stream, &request);
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    (status, head, body)
}

#[test]
fn limits_an_axum_router() {
    let quotas = StaticQuotas::from_iter([("alice".to_string(), "4/min".parse().unwrap())]);
    let limiter = KeyedLimiter::builder(TokenBucket, "1/min".parse().unwrap())
        .source(quotas)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter)
        .key([KeyPart::Header("x-account-id".parse().unwrap())])
        .bypass(["admin"])
        .costs(RouteCosts::new([CostRule::new("/report", None, 3)]))
        .build()
        .unwrap();
    let router = Router::new()
        .route("/", get(|| async { "Hello World!" }))
        .route("/report", get(|| async { "a report" }))
        .layer(layer);
    let addr = serve(router);

    let (status, head, body) = get_as(addr, "/report", "alice");
    assert_eq!((status, body.as_str()), (200, "a report"));
    assert!(head.contains("ratelimit: \"default\";r=1;t=45"), "{head}");
    assert_eq!(get_as(addr, "/", "alice").0, 200);
    let (status, head, body) = get_as(addr, "/", "alice");
    assert_eq!((status, body.as_str()), (429, "Exceeded quota"));
    assert!(head.contains("retry-after: "), "{head}");
    assert!(head.contains("ratelimit-policy: \"default\";q=4;w=60"), "{head}");
    assert_eq!(get_as(addr, "/", "admin").0, 200);
}

#[test]
fn keys_by_client_ip_with_axum_connect_info() {
    use axum::extract::ConnectInfo;
    let quotas = StaticQuotas::from_iter([("127.0.0.1".to_string(), "2/min".parse().unwrap())]);
    let limiter = KeyedLimiter::builder(TokenBucket, "1/min".parse().unwrap())
        .source(quotas)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter)
        .key([KeyPart::ClientIp])
        .peer_addr_with(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))
        .build()
        .unwrap();
    let router = Router::new()
        .route("/", get(|| async { "Hello World!" }))
        .layer(layer);
    let addr = serve_on(|listener| async move {
        let service = router.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, service).await.unwrap();
    });
    let statuses: Vec<u16> = (0..3).map(|_| get_as(addr, "/", "anyone").0).collect();
    // Keyed by 127.0.0.1 (quota 2/min), not by the header and not as ANONYMOUS (1/min).
    assert_eq!(statuses, [200, 200, 429]);
    let (_, head, _) = get_as(addr, "/", "anyone");
    assert!(head.contains("ratelimit-policy: \"default\";q=2;w=60"), "{head}");
}

/// Post-paid: each response reports its cost in `x-usage` (as an LLM service reports tokens);
/// the layer charges it to the key after the response, strips the header, and the key's next
/// requests are refused until the debt is repaid. Malformed and huge values are counted.
#[test]
fn charges_the_cost_a_response_reports() {
    use axum::extract::Path;
    use sluice_http::ChargeFrom;
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/h".parse().unwrap())
        .unknown_key_quota("10/h".parse().unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter)
        .key([KeyPart::Header("x-account-id".parse().unwrap())])
        .charge_from(ChargeFrom::new("x-usage".parse().unwrap(), 1_000).strip(true))
        .bypass(["root"])
        .build()
        .unwrap();
    let counts = layer.clone();
    let router = Router::new()
        .route(
            "/generate/{tokens}",
            get(|Path(tokens): Path<String>| async move { ([("x-usage", tokens)], "generated") }),
        )
        .layer(layer);
    let addr = serve(router);

    // Admitted at 1, then 25 reported: 9 left, 10 below empty at most (one period's worth).
    let (status, head, body) = get_as(addr, "/generate/25", "alice");
    assert_eq!((status, body.as_str()), (200, "generated"));
    assert!(!head.contains("x-usage"), "stripped: {head}");
    let (status, head, _) = get_as(addr, "/generate/1", "alice");
    assert_eq!(status, 429, "{head}");
    // 11 units at 10 an hour: 3 960 s, less what the test took.
    assert!(head.contains("retry-after: 396"), "{head}");
    assert_eq!(
        get_as(addr, "/generate/3", "bob").0,
        200,
        "another key pays nothing"
    );
    let (status, head, _) = get_as(addr, "/generate/500", "root");
    assert_eq!(status, 200);
    assert!(
        !head.contains("x-usage"),
        "a bypassed key's header is stripped too: {head}"
    );

    for junk in ["-4", "2.5", "lots"] {
        assert_eq!(get_as(addr, &format!("/generate/{junk}"), "carol").0, 200);
    }
    assert_eq!(get_as(addr, "/generate/99999999999999999999999", "dave").0, 200);
    let counts = counts.charge_counts().unwrap();
    assert_eq!(
        (counts.charged, counts.malformed, counts.capped),
        (3, 3, 1),
        "{counts:?}"
    );
    assert_eq!(counts.units, 25 + 3 + 1_000);
    assert_eq!(counts.uncharged, 0);
    // Carol's malformed reports charged nothing: 7 admissions of her 10 remain.
    assert_eq!(get_as(addr, "/generate/0", "carol").0, 200);
}
