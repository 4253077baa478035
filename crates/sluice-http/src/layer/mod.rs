//! The tower [`Layer`] and its [`Service`](tower_service::Service): decide each request before
//! the inner service sees it.
//!
//! Laid out as `tower::limit` is: the builder ([`RateLimitBuilder`]), the layer (here), the
//! service ([`RateLimit`]) and its response future ([`ResponseFuture`]). The `Gatekeeper`
//! behind them holds the settings and the backend, and decides.

mod builder;
mod future;
mod gatekeeper;
mod service;

use std::sync::Arc;

use tower_layer::Layer;

pub use builder::{DEFAULT_IPV6_PREFIX, LayerBuildError, PeerAddrReader, RateLimitBuilder};
pub use future::ResponseFuture;
pub use gatekeeper::EXCEEDED_BODY;
use gatekeeper::Gatekeeper;
pub use service::RateLimit;

use crate::{ChargeCounts, LimitBackend};

/// A tower [`Layer`] that limits requests per client key with a [`LimitBackend`].
///
/// Each request's key is built from its headers and address ([`KeyPart`]); a bypassed key
/// goes straight through; otherwise the request's cost ([`RouteCosts`]) is checked. A denied
/// request is answered `429 Exceeded quota` with `Retry-After` (whole seconds, rounded up,
/// never 0), `RateLimit-Policy`, `RateLimit` and `X-RateLimit-Limit/-Remaining/-Reset`; an
/// admitted one reaches the inner service and its response gets the same fields (without
/// `Retry-After`) unless turned off. A key longer than the maximum, or not text, is answered
/// `400` and never reaches the backend. For client-IP keys the server puts a [`PeerAddr`] in
/// the request's extensions.
///
/// Works with any `Clone` `Service<http::Request<B>, Response = http::Response<R>>` whose
/// body `R` can be made from a `&'static str` (axum's `Body`, `http_body_util::Full<Bytes>`...).
/// With a backend that answers later ([`CheckFuture::pending`]) the request waits in the
/// response future and goes on to the service made ready by `poll_ready` (a clone stays).
///
/// # Example
/// ```
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
/// use sluice_http::{KeyPart, RateLimitLayer};
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// let quotas = StaticQuotas::from_iter([("alice".to_string(), "1/s".parse()?)]);
/// let limiter = KeyedLimiter::builder(TokenBucket, "10/s".parse()?).source(quotas).build()?;
/// let layer = RateLimitLayer::builder(limiter)
///     .key([KeyPart::Header("x-account-id".parse()?)])
///     .bypass(["admin"])
///     .build()?;
/// let hello = tower_service_fn(|_req: Request<()>| Response::new("Hello World!".to_string()));
/// let mut service = layer.layer(hello);
/// let ask = |who: &str| Request::builder().header("x-account-id", who).body(()).unwrap();
///
/// let poll = |f: &mut (dyn std::future::Future<Output = Result<Response<String>, Infallible>> + Unpin)| {
///     let waker = std::task::Waker::noop();
///     match std::pin::Pin::new(f).poll(&mut std::task::Context::from_waker(waker)) {
///         std::task::Poll::Ready(r) => r.unwrap(),
///         std::task::Poll::Pending => unreachable!(),
///     }
/// };
/// assert_eq!(poll(&mut service.call(ask("alice"))).status(), StatusCode::OK);
/// let denied = poll(&mut service.call(ask("alice")));
/// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(denied.headers()["retry-after"], "1");
/// assert_eq!(denied.headers()["ratelimit-policy"], "\"default\";q=1;w=1");
/// assert_eq!(poll(&mut service.call(ask("admin"))).status(), StatusCode::OK);
/// # fn tower_service_fn<F: FnMut(Request<()>) -> Response<String>>(f: F) -> Svc<F> { Svc(f) }
/// # #[derive(Clone)] struct Svc<F>(F);
/// # impl<F: FnMut(Request<()>) -> Response<String>> Service<Request<()>> for Svc<F> {
/// #     type Response = Response<String>;
/// #     type Error = Infallible;
/// #     type Future = std::future::Ready<Result<Response<String>, Infallible>>;
/// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
/// #         std::task::Poll::Ready(Ok(()))
/// #     }
/// #     fn call(&mut self, r: Request<()>) -> Self::Future { std::future::ready(Ok((self.0)(r))) }
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// [`KeyPart`]: crate::KeyPart
/// [`RouteCosts`]: crate::RouteCosts
/// [`PeerAddr`]: crate::PeerAddr
/// [`CheckFuture::pending`]: crate::CheckFuture::pending
#[derive(Clone)]
pub struct RateLimitLayer {
    gatekeeper: Arc<Gatekeeper>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.gatekeeper.keys.parts)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A builder over this backend: a sluice `KeyedLimiter<String, ..>` or another
    /// [`LimitBackend`].
    pub fn builder(backend: impl LimitBackend) -> RateLimitBuilder {
        Self::builder_shared(Arc::new(backend))
    }

    /// A builder over a shared backend: several layers, or a layer rebuilt on a config
    /// reload, can share one store.
    pub fn builder_shared(backend: Arc<dyn LimitBackend>) -> RateLimitBuilder {
        RateLimitBuilder::new(backend)
    }

    /// Whether requests must carry a [`PeerAddr`](crate::PeerAddr): the key uses the client
    /// IP. A server may skip inserting it otherwise.
    pub fn needs_peer_addr(&self) -> bool {
        self.gatekeeper.keys.needs_ip()
    }

    /// What the charges after responses came to ([`RateLimitBuilder::charge_from`]); `None`
    /// if the layer charges none.
    pub fn charge_counts(&self) -> Option<ChargeCounts> {
        self.gatekeeper.charge.as_ref().map(|charger| charger.counts())
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, Arc::clone(&self.gatekeeper))
    }
}
