//! The layer's own cost per request, without sockets: `cargo bench -p sluice-http --bench layer`.
//!
//! A request is built, goes through `RateLimit<Hello>::call`, its future is polled to the
//! response as a server would, and the response is dropped; `request and response only`
//! measures the building and dropping alone. Cases: a bypassed key (the limiter skipped), an
//! admitted key with the rate-limit fields, the same without fields, and a denied key; then
//! the admitted and denied keys under `on_excess` waiting (up to 1 s) with nobody waiting:
//! the denied one cannot be served within 1 s, so it is refused at once.

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use sluice::{KeyedLimiter, StaticQuotas, TokenBucket, WaitPolicy};
use sluice_http::{KeyPart, RateLimit, RateLimitLayer};
use tower_layer::Layer;
use tower_service::Service;

#[derive(Clone)]
struct Hello;

impl Service<Request<()>> for Hello {
    type Response = Response<&'static str>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new("Hello World!")))
    }
}

fn service(headers_on_allow: bool, wait: bool) -> RateLimit<Hello> {
    let quotas = StaticQuotas::from_iter([
        ("bench@example.com".to_string(), "1000000000/s".parse().unwrap()),
        ("alice@example.com".to_string(), "1/h".parse().unwrap()),
    ]);
    let limiter = KeyedLimiter::builder(TokenBucket, "10/s".parse().unwrap())
        .source(quotas)
        .build()
        .unwrap();
    RateLimitLayer::builder(limiter)
        .key([KeyPart::Header("x-account-id".parse().unwrap())])
        .bypass(["admin@example.com"])
        .headers_on_allow(headers_on_allow)
        .on_excess(if wait {
            WaitPolicy::wait_up_to(Duration::from_secs(1))
        } else {
            WaitPolicy::reject()
        })
        .build()
        .unwrap()
        .layer(Hello)
}

fn respond(service: &mut RateLimit<Hello>, request: Request<()>) -> Response<&'static str> {
    let future = pin!(service.call(request));
    match future.poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(response)) => response,
        _ => unreachable!("the inner service is ready at once"),
    }
}

fn request(account: &'static str) -> Request<()> {
    Request::builder()
        .uri("/")
        .header("x-account-id", account)
        .body(())
        .unwrap()
}

fn layer(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    // (name, account, fields on admitted answers, the status every timed request gets,
    // whether it carries the rate-limit fields, and whether excess requests may wait).
    let cases = [
        ("bypass", "admin@example.com", true, 200, false, false),
        ("admitted, fields", "bench@example.com", true, 200, true, false),
        (
            "admitted, no fields",
            "bench@example.com",
            false,
            200,
            false,
            false,
        ),
        ("denied", "alice@example.com", true, 429, true, false),
        (
            "admitted, on_excess wait",
            "bench@example.com",
            true,
            200,
            true,
            true,
        ),
        (
            "denied, on_excess wait (beyond max_wait)",
            "alice@example.com",
            true,
            429,
            true,
            true,
        ),
    ];
    // Building and dropping the request and response alone, to subtract from the rest.
    group.bench_function("request and response only", |b| {
        b.iter(|| {
            drop(std::hint::black_box((
                request("bench@example.com"),
                Response::new("Hello World!"),
            )))
        })
    });
    for (name, account, fields, status, with_fields, wait) in cases {
        let mut service = service(fields, wait);
        // The first request takes alice's one request an hour; from then on each case must be
        // what its name says, or the timing measures something else.
        drop(respond(&mut service, request(account)));
        let response = respond(&mut service, request(account));
        assert_eq!(response.status().as_u16(), status, "{name}");
        assert_eq!(
            response.headers().contains_key("ratelimit"),
            with_fields,
            "{name}"
        );
        group.bench_function(name, |b| b.iter(|| respond(&mut service, request(account))));
    }
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
