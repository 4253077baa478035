//! # sluice-http: rate limiting for HTTP services
//!
//! A tower [`Layer`](tower_layer::Layer), [`RateLimitLayer`], that puts a sluice
//! [`KeyedLimiter`](sluice::KeyedLimiter) in front of any `http` service: axum routers, plain
//! hyper 1.x services, tonic... For each request it works out
//!
//! - **who is asking** ([`KeyPart`]): a header (`X-Account-ID`, `Client-Id`...), a bearer API
//!   key, the client IP, or several of them joined. The client IP is the peer's, or behind
//!   [`TrustedProxies`] the right-most untrusted address they report. An absent part reads as
//!   `ANONYMOUS` (configurable); bypassed keys skip the limiter; over-long keys are answered
//!   400 and never stored;
//! - **what it costs** ([`RouteCosts`]): units by path prefix and method;
//! - **the answer**: `429 Exceeded quota` with `Retry-After` in whole seconds rounded up
//!   (never 0), the IETF draft's `RateLimit-Policy: "default";q=10;w=1` and
//!   `RateLimit: "default";r=0;t=1`, and `X-RateLimit-Limit/-Remaining/-Reset`; admitted
//!   responses carry the same fields unless turned off.
//!
//! In the `RateLimit-Policy` field `q` is the quota's capacity (its burst) and `w` the
//! seconds it takes to refill it from empty, so `r ≤ q` and `t ≤ w` always hold.
//!
//! ```
//! use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
//! use sluice_http::{CostRule, KeyPart, RateLimitLayer, RouteCosts};
//!
//! let quotas = StaticQuotas::from_iter([("alice@example.com".to_string(), "10/s".parse()?)]);
//! let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse()?).source(quotas).build()?;
//! let layer = RateLimitLayer::builder(limiter)
//!     .key([KeyPart::Header("x-account-id".parse()?)])
//!     .bypass(["admin@example.com"])
//!     .costs(RouteCosts::new([CostRule::new("/export", None, 5)]))
//!     .build()?;
//! // axum: Router::new().route(...).layer(layer); hyper: layer.layer(service)
//! # let _ = layer;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! For client-IP keys the server puts a [`PeerAddr`] in each request's extensions; with axum,
//! serve `into_make_service_with_connect_info::<SocketAddr>()` and read its `ConnectInfo`
//! through [`RateLimitBuilder::peer_addr_with`].
//!
//! The store behind the layer is a [`LimitBackend`]: the in-memory `KeyedLimiter` answers at
//! once; a remote store (such as a decision engine whose counters are on Redis) answers
//! through a [`CheckFuture`], and the request waits for it before reaching the inner service.
//!
//! A cost known only once the response is written (tokens generated, bytes sent) can be
//! charged after it ([`RateLimitBuilder::charge_from`]): the inner service reports it in a
//! response header, the layer charges it to the request's key whatever is left, and the key's
//! next requests wait for the debt to be repaid.
//!
//! A request over its quota may wait for capacity instead of being refused
//! ([`RateLimitBuilder::on_excess`]): in its key's queue, holding only its place, within a
//! `max_wait` it is refused at once if it cannot be served in, a queue limit per key and a
//! bound on all waiters ([`WaitRoom`]). Its response says how long it waited in
//! `Server-Timing: ratelimit-wait;dur=MILLISECONDS`.
//!
//! Hot path: building the key allocates nothing (a stack buffer when parts are joined or an
//! address is printed), the only lock is the limiter's own, and the rate-limit fields are
//! printed into one buffer.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod charge;
mod cost;
mod fields;
mod headers;
mod key;
mod layer;
mod problem;
mod proxy;
mod wait;

pub use backend::{CheckFuture, LimitBackend, SeveralLimits};
pub use charge::{ChargeCounts, ChargeFrom, ChargeTally};
pub use cost::{CostRule, PathError, RouteCosts, normalize_path};
pub use fields::FieldSet;
pub use headers::FieldPolicy;
pub use key::{KeyPart, KeyPartError, MAX_KEY_LEN};
pub use layer::{
    DEFAULT_IPV6_PREFIX, EXCEEDED_BODY, LayerBuildError, PeerAddrReader, RateLimit, RateLimitBuilder,
    RateLimitLayer, ResponseFuture,
};
pub use problem::{PROBLEM_JSON, problem};
pub use proxy::{
    ClientIpError, ClientIpHeader, ClientIpHeaderError, IpNet, IpNetError, PeerAddr, TrustedProxies,
};
pub use wait::{DEFAULT_MAX_WAITERS, WaitCounts, WaitRoom};
