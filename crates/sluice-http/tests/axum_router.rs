//! The layer on an axum router, served over a real socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
use sluice_http::{CostRule, KeyPart, RateLimitLayer, RouteCosts};

/// Runs `serve` on a listener bound to a free port, on a runtime in a thread of its own.
fn serve_on<F, Fut>(serve: F) -> SocketAddr
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            serve(listener).await;
        });
    });
    rx.recv_timeout(Duration::from_secs(60)).unwrap()
}

fn serve(router: Router) -> SocketAddr {
    serve_on(|listener| async move { axum::serve(listener, router).await.unwrap() })
}

/// One request on a fresh connection: the status line and the lower-cased head.
fn get_as(addr: SocketAddr, path: &str, account: &str) -> (u16, String, String) {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut stream = BufReader::new(stream);
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: t\r\nX-Account-ID: {account}\r\nConnection: close\r\n\r\n");
    stream.get_mut().write_all(request.as_bytes()).unwrap();
    let mut head = String::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    (head[9..12].parse().unwrap(), head, body)
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
