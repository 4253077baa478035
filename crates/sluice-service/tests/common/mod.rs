//! What the front-end tests share: a listener on a free port, one HTTP exchange over a
//! connection of its own, and an engine in memory or on Redis under keys of its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use sluice_descriptors::RuleSet;
use sluice_redis::{FailurePolicy, RedisOptions, RedisStore};
use sluice_service::{Engine, EngineSettings, RedisCounters};

use crate::redis_support::RedisServer;

/// A listener on a free local port, and its address.
pub async fn listener() -> (tokio::net::TcpListener, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// Sends `request` on a new connection; the status code and the body.
pub async fn exchange(addr: SocketAddr, request: String) -> (u16, String) {
    let (status, _, body) = exchange_with_head(addr, request).await;
    (status, body)
}

/// Sends `request` on a new connection; the status code, the head (status line and
/// headers) and the body.
#[allow(dead_code, reason = "not every test reads the head")]
pub async fn exchange_with_head(addr: SocketAddr, request: String) -> (u16, String, String) {
    tokio::task::spawn_blocking(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let status = answer[9..12].parse().unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        (status, head.to_owned(), body.to_owned())
    })
    .await
    .unwrap()
}

/// An engine on `rules`: in memory, or on `redis` (failing closed) under a key prefix no other
/// engine of the run has (`name:N`), so engines compared side by side share nothing.
pub async fn engine_on(
    redis: Option<&RedisServer>,
    name: &str,
    rules: RuleSet,
    settings: EngineSettings,
) -> Arc<Engine> {
    Arc::new(match redis {
        None => Engine::new(rules, settings).unwrap(),
        Some(redis) => {
            let store = RedisStore::connect(&redis.url(), RedisOptions::default())
                .await
                .unwrap();
            let counters = RedisCounters {
                policy: FailurePolicy::FailClosed,
                prefix: format!("{name}:{}", unique()),
                ..RedisCounters::new(store)
            };
            Engine::on_redis(rules, settings, counters).unwrap()
        }
    })
}

/// A number no earlier call in this process gave.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
