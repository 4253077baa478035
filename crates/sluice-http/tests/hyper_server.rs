//! The layer in a plain hyper 1.x server, over real sockets.

mod common;

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::io::{BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
use sluice_http::{
    ClientIpHeader, CostRule, KeyPart, LayerBuildError, PeerAddr, RateLimit, RateLimitLayer, RouteCosts,
    TrustedProxies,
};
use tower_layer::Layer;
use tower_service::Service;

use common::{connect, send, serve_on};

#[derive(Clone)]
struct Hello;

impl Service<Request<Incoming>> for Hello {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Incoming>) -> Self::Future {
        ready(Ok(Response::new(Full::new(Bytes::from_static(b"Hello World!")))))
    }
}

/// Serves `service` on a free port in a background runtime, giving each request its peer.
fn spawn_server(service: RateLimit<Hello>) -> SocketAddr {
    serve_on(|listener| async move {
        loop {
            let (stream, peer) = listener.accept().await.unwrap();
            let service = service.clone();
            let hyper_service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(PeerAddr(peer));
                service.clone().call(request)
            });
            tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), hyper_service));
        }
    })
}

struct Reply {
    status: u16,
    head: String,
    body: String,
}

fn get(stream: &mut BufReader<TcpStream>, path: &str, headers: &str) -> Reply {
    let (status, head) = send(
        stream,
        &format!("GET {path} HTTP/1.1\r\nHost: t\r\n{headers}\r\n"),
    );
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |v| v.trim().parse().unwrap());
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
    Reply {
        status,
        head,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[test]
fn limits_by_peer_address_in_a_plain_hyper_server() {
    let quotas = StaticQuotas::from_iter([("127.0.0.1".to_string(), "2/min".parse().unwrap())]);
    let limiter = KeyedLimiter::builder(TokenBucket, "1/min".parse().unwrap())
        .source(quotas)
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter)
        .key([KeyPart::ClientIp])
        .build()
        .unwrap();
    assert!(layer.needs_peer_addr());
    let mut stream = connect(spawn_server(layer.layer(Hello)));
    let statuses: Vec<u16> = (0..4).map(|_| get(&mut stream, "/", "").status).collect();
    assert_eq!(statuses, [200, 200, 429, 429]);
}

#[test]
fn behind_a_proxy_only_the_configured_header_names_the_client() {
    let limiter = KeyedLimiter::builder(TokenBucket, "1/min".parse().unwrap())
        .unknown_key_quota("1/min".parse().unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter.clone())
        .key([KeyPart::ClientIp])
        .trusted_proxies(TrustedProxies::new(["127.0.0.1".parse().unwrap()]))
        .client_ip_header(ClientIpHeader::Forwarded)
        .ipv6_prefix(48)
        .build()
        .unwrap();
    let mut stream = connect(spawn_server(layer.layer(Hello)));
    let as_client = |stream: &mut _, forwarded: &str, spoof: &str| {
        get(
            stream,
            "/",
            &format!("Forwarded: {forwarded}\r\nX-Forwarded-For: {spoof}\r\n"),
        )
    };
    assert_eq!(as_client(&mut stream, "for=203.0.113.8", "1.1.1.1").status, 200);
    assert_eq!(as_client(&mut stream, "for=203.0.113.8", "1.1.1.2").status, 429);
    // One /48 is one client.
    assert_eq!(
        as_client(&mut stream, "for=\"[2001:db8:1:2::1]\"", "-").status,
        200
    );
    assert_eq!(
        as_client(&mut stream, "for=\"[2001:db8:1:ffff::1]:80\"", "-").status,
        429
    );
    let r = as_client(&mut stream, "for=[2001:db8::1]", "1.1.1.3");
    assert_eq!((r.status, r.body.as_str()), (400, "Malformed Forwarded header"));
    let r = as_client(&mut stream, "for=198.51.100.1, proto=https", "1.1.1.3");
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Forwarded header gives no client address")
    );
    assert_eq!(limiter.metrics().entries, 2, "refused requests are never counted");

    let refused = RateLimitLayer::builder(limiter)
        .ipv6_prefix(0)
        .build()
        .unwrap_err();
    assert_eq!(refused, LayerBuildError::Ipv6Prefix(0));
}

#[test]
fn oversized_keys_are_refused_and_never_stored() {
    let limiter = KeyedLimiter::builder(TokenBucket, "1/min".parse().unwrap())
        .unknown_key_quota("100/min".parse().unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter.clone())
        .key([KeyPart::Header("x-account-id".parse().unwrap())])
        .max_key_len(32)
        .build()
        .unwrap();
    let mut stream = connect(spawn_server(layer.layer(Hello)));
    for n in [33, 100, 1000, 5000] {
        let r = get(&mut stream, "/", &format!("X-Account-ID: {}\r\n", "k".repeat(n)));
        assert_eq!(r.status, 400);
    }
    assert_eq!(limiter.metrics().entries, 0);
    assert_eq!(
        get(&mut stream, "/", &format!("X-Account-ID: {}\r\n", "k".repeat(32))).status,
        200
    );
    assert_eq!(limiter.metrics().entries, 1);
}

#[test]
fn costs_above_capacity_are_denied_without_retry_after_and_fields_can_be_off_on_allow() {
    let limiter = KeyedLimiter::builder(TokenBucket, "1/min".parse().unwrap())
        .unknown_key_quota("5/min".parse().unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(limiter)
        .key([KeyPart::Bearer])
        .costs(RouteCosts::new([CostRule::new("/bulk", None, 6)]))
        .headers_on_allow(false)
        .policy_name("per-key")
        .build()
        .unwrap();
    let mut stream = connect(spawn_server(layer.layer(Hello)));
    let auth = "Authorization: Bearer key-1\r\n";
    let r = get(&mut stream, "/bulk/1", auth);
    assert_eq!(r.status, 429);
    assert!(!r.head.contains("retry-after"), "{}", r.head);
    assert!(
        r.head.contains("ratelimit-policy: \"per-key\";q=5;w=60"),
        "{}",
        r.head
    );
    let r = get(&mut stream, "/", auth);
    assert_eq!(r.status, 200);
    assert!(!r.head.contains("ratelimit"), "{}", r.head);
}

/// A store that answers later, as a remote one does: the in-memory limiter, one task switch
/// away.
struct Later(KeyedLimiter<String, TokenBucket, StaticQuotas<String>, sluice::ManualClock>);

impl sluice_http::LimitBackend for Later {
    fn check(&self, key: &str, cost: u64) -> sluice_http::CheckFuture {
        let (limiter, key) = (self.0.clone(), key.to_owned());
        sluice_http::CheckFuture::pending(async move {
            tokio::task::yield_now().await;
            limiter.check_n(&key, cost)
        })
    }

    fn quota(&self, key: &str) -> Option<sluice::Quota> {
        self.0.quota_of(key)
    }
}

#[test]
fn a_store_that_answers_later_gives_the_same_responses() {
    let build = || {
        let quotas = StaticQuotas::from_iter([("alice".to_string(), "2/min".parse().unwrap())]);
        KeyedLimiter::builder(TokenBucket, "2/min".parse().unwrap())
            .source(quotas)
            .unknown_key_quota("3/min".parse().unwrap())
            .clock(sluice::ManualClock::new(0))
            .build()
            .unwrap()
    };
    let layer = |builder: sluice_http::RateLimitBuilder| {
        builder
            .key([KeyPart::Header("x-account-id".parse().unwrap())])
            .max_key_len(32)
            .bypass(["admin"])
            .costs(RouteCosts::new([CostRule::new("/bulk", None, 6)]))
            .build()
            .unwrap()
    };
    let now = layer(RateLimitLayer::builder(build()));
    let later = layer(RateLimitLayer::builder(Later(build())));
    let mut to_now = connect(spawn_server(now.layer(Hello)));
    let mut to_later = connect(spawn_server(later.layer(Hello)));
    let long = format!("X-Account-ID: {}\r\n", "k".repeat(40));
    let requests = [
        ("/", "X-Account-ID: alice\r\n"),
        ("/", "X-Account-ID: alice\r\n"),
        ("/", "X-Account-ID: alice\r\n"),
        ("/", "X-Account-ID: admin\r\n"),
        ("/", long.as_str()),
        ("/bulk", "X-Account-ID: bob\r\n"),
        ("/", "X-Account-ID: bob\r\n"),
        ("/", ""),
    ];
    let without_date = |head: &str| -> String { head.lines().filter(|l| !l.starts_with("date:")).collect() };
    let mut statuses = Vec::new();
    for (path, headers) in requests {
        let (a, b) = (get(&mut to_now, path, headers), get(&mut to_later, path, headers));
        assert_eq!(without_date(&a.head), without_date(&b.head), "{path} {headers:?}");
        statuses.push(b.status);
    }
    assert_eq!(statuses, [200, 200, 429, 200, 400, 429, 200, 200]);
}
