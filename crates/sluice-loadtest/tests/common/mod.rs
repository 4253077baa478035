//! A small demo server for the tests: hyper over a real socket, limited by sluice's
//! `KeyedLimiter` with the demo's accounts, a simulated quota fetch and counters of what it
//! answered.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use sluice::{FetchResult, FnSource, KeyedLimiter, Quota, StaticQuotas, TokenBucket};
use tokio::net::TcpListener;

/// What the server answered.
#[derive(Default)]
pub struct Answered {
    pub ok: AtomicU64,
    pub too_many: AtomicU64,
    pub other: AtomicU64,
}

impl Answered {
    pub fn get(&self) -> (u64, u64, u64) {
        (
            self.ok.load(Ordering::SeqCst),
            self.too_many.load(Ordering::SeqCst),
            self.other.load(Ordering::SeqCst),
        )
    }
}

pub const ACCOUNTS: [(&str, &str); 9] = [
    ("ANONYMOUS", "0.1/s"),
    ("alice@example.com", "1/s"),
    ("bob@example.com", "1.1/s"),
    ("carol@example.com", "2/s"),
    ("chuck@example.com", "10/s"),
    ("craig@example.com", "100/s"),
    ("dan@example.com", "1000/s"),
    ("erin@example.com", "10000/s"),
    ("eve@example.com", "100000/s"),
];

/// This account is answered 503, to see errors counted.
pub const BROKEN: &str = "broken@example.com";

/// Starts the demo server on 127.0.0.1 and returns its address and counters.
///
/// Unknown accounts get quota 0 once their (simulated, `fetch_latency` long) fetch completes;
/// until then the failsafe quota `100/s` applies, all such accounts together within the
/// failsafe pool (the demo's rate, with a burst of 100 so that a profile starting a hair after
/// the flood of new accounts still finds some). `admin@example.com` bypasses the limiter.
pub async fn demo_server(fetch_latency: Duration) -> (SocketAddr, Arc<Answered>) {
    let quotas =
        Arc::new(StaticQuotas::from_iter(ACCOUNTS.map(|(account, quota)| {
            (account.to_string(), quota.parse::<Quota>().unwrap())
        })));
    let source = FnSource(move |key: &String| {
        let quota = quotas.get(key.as_str());
        async move {
            tokio::time::sleep(fetch_latency).await;
            FetchResult::Ok(quota)
        }
    });
    let pool = format!("{}/s burst 100", sluice_loadtest::DEMO_FAILSAFE_POOL);
    let limiter = KeyedLimiter::builder(TokenBucket, "100/s".parse().unwrap())
        .failsafe_pool(pool.parse().unwrap())
        // Room for every invalidN account of a short test: evicting the others would send them
        // through the failsafe period again.
        .capacity(2_000_000)
        .source(source)
        .spawner(|task| {
            tokio::spawn(task);
        })
        .build()
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(Answered::default());
    let counters = Arc::clone(&answered);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (limiter, counters) = (limiter.clone(), Arc::clone(&counters));
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    let account = request
                        .headers()
                        .get("x-account-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("ANONYMOUS")
                        .to_string();
                    let (status, body, counter) = if account == BROKEN {
                        (StatusCode::SERVICE_UNAVAILABLE, "Broken", &counters.other)
                    } else if account == "admin@example.com" || limiter.check(account.as_str()).is_allowed() {
                        (StatusCode::OK, "Hello World!", &counters.ok)
                    } else {
                        (
                            StatusCode::TOO_MANY_REQUESTS,
                            "Exceeded quota",
                            &counters.too_many,
                        )
                    };
                    counter.fetch_add(1, Ordering::SeqCst);
                    let mut response = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
                    *response.status_mut() = status;
                    async move { Ok::<_, Infallible>(response) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, answered)
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: sluice_loadtest::Args,
}

/// Parses loadtest arguments as the `sluice loadtest` command line would.
pub fn args(argv: &[&str]) -> sluice_loadtest::Args {
    let mut all = vec!["sluice-loadtest"];
    all.extend_from_slice(argv);
    Cli::try_parse_from(all).unwrap().args
}
