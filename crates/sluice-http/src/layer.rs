//! The tower [`Layer`] and [`Service`]: decide each request before the inner service sees it.

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use sluice::{CheckError, Decision, Quota};
use tower_layer::Layer;
use tower_service::Service;

use crate::headers::{RateFields, Rendered, denial_headers, valid_policy_name};
use crate::key::{KeyBuf, KeyPart, KeyRejection, KeySource, MAX_KEY_LEN};
use crate::{CheckFuture, KeyLimiter, PeerAddr, RouteCosts, TrustedProxies};

/// The body of a 429 response.
///
/// # Example
/// ```
/// assert_eq!(sluice_http::EXCEEDED_BODY, "Exceeded quota");
/// ```
pub const EXCEEDED_BODY: &str = "Exceeded quota";

/// Why a [`RateLimitBuilder`] could not build a layer.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{BuildError, RateLimitLayer};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse()?).build()?;
/// let refused = RateLimitLayer::builder(limiter).key([]).build();
/// assert_eq!(refused.unwrap_err(), BuildError::NoKeyParts);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// No key part was given.
    #[error("the key needs at least one part (header:NAME, bearer or ip)")]
    NoKeyParts,
    /// The maximum key length is 0 or above [`MAX_KEY_LEN`].
    #[error("the maximum key length must be between 1 and {MAX_KEY_LEN}, not {0}")]
    MaxKeyLength(usize),
    /// The default key is empty or longer than the maximum key length.
    #[error("the default key {0:?} must be non-empty and no longer than the maximum key length")]
    DefaultKey(String),
    /// The policy name cannot be written in a structured field.
    #[error("the policy name {0:?} must be printable ASCII without '\"' or '\\'")]
    PolicyName(String),
}

static NEXT_POLICY_ID: AtomicU64 = AtomicU64::new(0);

/// Everything the layer decides with, shared by every clone of the service.
struct Policy {
    /// Unique per built layer, so a cached denial is never another policy's.
    id: u64,
    limiter: Arc<dyn KeyLimiter>,
    keys: KeySource,
    proxies: TrustedProxies,
    bypass: HashSet<Box<str>, foldhash::fast::FixedState>,
    costs: RouteCosts,
    headers_on_allow: bool,
    policy_name: Box<str>,
    peer_addr: PeerAddrReader,
}

/// Reads the connection's peer address from a request's extensions.
///
/// # Example
/// ```
/// use std::net::SocketAddr;
/// let from_a_plain_address: sluice_http::PeerAddrReader = |ext| ext.get::<SocketAddr>().copied();
/// let mut ext = http::Extensions::new();
/// ext.insert("192.0.2.1:4000".parse::<SocketAddr>()?);
/// assert!(from_a_plain_address(&ext).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type PeerAddrReader = fn(&http::Extensions) -> Option<SocketAddr>;

fn read_peer_addr(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions.get::<PeerAddr>().map(|peer| peer.0)
}

enum Verdict {
    Pass(Option<RateFields>),
    Deny(RateFields),
    BadKey(KeyRejection),
    /// The limiter answers later; the key is kept to read its quota then.
    Wait(CheckFuture, Box<str>),
}

impl Policy {
    fn decide<B>(&self, request: &Request<B>) -> Verdict {
        let headers = request.headers();
        match self.keys.borrowed_key(headers) {
            Some(Ok(key)) => self.decide_for(request, key),
            Some(Err(rejection)) => Verdict::BadKey(rejection),
            None => {
                let ip = (self.peer_addr)(request.extensions())
                    .map(|peer| self.proxies.client_ip(peer.ip(), headers));
                let mut buf = KeyBuf::new(self.keys.max_len);
                match self.keys.key(headers, ip, &mut buf) {
                    Ok(key) => self.decide_for(request, key),
                    Err(rejection) => Verdict::BadKey(rejection),
                }
            }
        }
    }

    fn decide_for<B>(&self, request: &Request<B>, key: &str) -> Verdict {
        if !self.bypass.is_empty() && self.bypass.contains(key) {
            return Verdict::Pass(None);
        }
        let cost = self.costs.cost(request.method(), request.uri().path());
        let (check, quota) = self.limiter.check_quoted(key, cost);
        match check.into_ready() {
            Ok(answer) => self.verdict(answer, || quota.or_else(|| self.limiter.quota(key))),
            Err(pending) => Verdict::Wait(pending, key.into()),
        }
    }

    /// The verdict of a limiter's answer; `quota` is only asked for when fields are written.
    fn verdict(
        &self,
        answer: Result<Decision, CheckError>,
        quota: impl FnOnce() -> Option<Quota>,
    ) -> Verdict {
        match answer {
            Ok(decision) if decision.is_allowed() => {
                Verdict::Pass(self.headers_on_allow.then(|| RateFields::new(&decision, quota())))
            }
            Ok(decision) => Verdict::Deny(RateFields::new(&decision, quota())),
            Err(CheckError::CostExceedsCapacity { capacity, .. }) => {
                Verdict::Deny(RateFields::never(quota(), capacity))
            }
        }
    }

    fn denied<B: From<&'static str>>(&self, fields: RateFields) -> Response<B> {
        let headers = denial_headers(self.id, fields, || {
            let mut headers = plain_headers();
            fields.render(self.id, &self.policy_name).write(&mut headers);
            headers
        });
        plain(StatusCode::TOO_MANY_REQUESTS, EXCEEDED_BODY, headers)
    }

    fn bad_key<B: From<&'static str>>(rejection: KeyRejection) -> Response<B> {
        let body = match rejection {
            KeyRejection::TooLong => "Key too long",
            KeyRejection::NotText => "Key is not text",
        };
        plain(StatusCode::BAD_REQUEST, body, plain_headers())
    }
}

/// Builds a [`RateLimitLayer`].
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{IpNet, KeyPart, RateLimitLayer, TrustedProxies};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "100/s".parse()?).build()?;
/// let layer = RateLimitLayer::builder(limiter)
///     .key([KeyPart::Bearer, KeyPart::ClientIp])
///     .default_key("nobody")
///     .max_key_len(128)
///     .trusted_proxies(TrustedProxies::new(["10.0.0.0/8".parse::<IpNet>()?]))
///     .headers_on_allow(false)
///     .build()?;
/// assert!(layer.needs_peer_addr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimitBuilder {
    limiter: Arc<dyn KeyLimiter>,
    parts: Vec<KeyPart>,
    default_key: String,
    max_key_len: usize,
    proxies: TrustedProxies,
    bypass: Vec<String>,
    costs: RouteCosts,
    headers_on_allow: bool,
    policy_name: String,
    peer_addr: PeerAddrReader,
}

impl RateLimitBuilder {
    /// What the key is made of (default: the client IP). Several parts are joined by `|`.
    pub fn key(mut self, parts: impl IntoIterator<Item = KeyPart>) -> Self {
        self.parts = parts.into_iter().collect();
        self
    }

    /// The key of a request that does not say who it is (default `ANONYMOUS`).
    pub fn default_key(mut self, key: impl Into<String>) -> Self {
        self.default_key = key.into();
        self
    }

    /// The longest key accepted, in bytes (default 256); longer ones are answered 400 and
    /// never stored.
    pub fn max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// Proxies whose forwarding headers are believed (default: none).
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = proxies;
        self
    }

    /// Keys that are never limited.
    pub fn bypass<I: IntoIterator<Item = T>, T: Into<String>>(mut self, keys: I) -> Self {
        self.bypass = keys.into_iter().map(Into::into).collect();
        self
    }

    /// What each request costs (default: 1 each).
    pub fn costs(mut self, costs: RouteCosts) -> Self {
        self.costs = costs;
        self
    }

    /// Whether admitted responses carry the rate-limit fields too (default true; denials
    /// always do).
    pub fn headers_on_allow(mut self, on: bool) -> Self {
        self.headers_on_allow = on;
        self
    }

    /// Where the peer address is found in a request's extensions (default: a [`PeerAddr`]).
    /// With axum's `into_make_service_with_connect_info::<SocketAddr>()`:
    /// `.peer_addr_with(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))`.
    pub fn peer_addr_with(mut self, read: PeerAddrReader) -> Self {
        self.peer_addr = read;
        self
    }

    /// The policy's name in the `RateLimit-Policy` and `RateLimit` fields (default `default`).
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy_name = name.into();
        self
    }

    /// The layer.
    ///
    /// # Errors
    /// [`BuildError`] for no key part, a bad maximum length, default key or policy name.
    pub fn build(self) -> Result<RateLimitLayer, BuildError> {
        if self.parts.is_empty() {
            return Err(BuildError::NoKeyParts);
        }
        if self.max_key_len == 0 || self.max_key_len > MAX_KEY_LEN {
            return Err(BuildError::MaxKeyLength(self.max_key_len));
        }
        if self.default_key.is_empty() || self.default_key.len() > self.max_key_len {
            return Err(BuildError::DefaultKey(self.default_key));
        }
        if !valid_policy_name(&self.policy_name) {
            return Err(BuildError::PolicyName(self.policy_name));
        }
        Ok(RateLimitLayer {
            policy: Arc::new(Policy {
                id: NEXT_POLICY_ID.fetch_add(1, Ordering::Relaxed),
                limiter: self.limiter,
                keys: KeySource {
                    parts: self.parts,
                    default_key: self.default_key,
                    max_len: self.max_key_len,
                },
                proxies: self.proxies,
                bypass: self.bypass.into_iter().map(String::into_boxed_str).collect(),
                costs: self.costs,
                headers_on_allow: self.headers_on_allow,
                policy_name: self.policy_name.into(),
                peer_addr: self.peer_addr,
            }),
        })
    }
}

/// A tower [`Layer`] that limits requests per client key with a [`KeyLimiter`].
///
/// Each request's key is built from its headers and address ([`KeyPart`]); a bypassed key
/// goes straight through; otherwise the request's cost ([`RouteCosts`]) is checked. A denied
/// request is answered `429 Exceeded quota` with `Retry-After` (whole seconds, rounded up,
/// never 0), `RateLimit-Policy`, `RateLimit` and `X-RateLimit-Limit/-Remaining/-Reset`; an
/// admitted one reaches the inner service and its response gets the same fields (without
/// `Retry-After`) unless turned off. A key longer than the maximum, or not text, is answered
/// `400` and never reaches the limiter. For client-IP keys the server puts a [`PeerAddr`] in
/// the request's extensions.
///
/// Works with any `Clone` `Service<http::Request<B>, Response = http::Response<R>>` whose
/// body `R` can be made from a `&'static str` (axum's `Body`, `http_body_util::Full<Bytes>`...).
/// With a store that answers later ([`CheckFuture::pending`]) the request waits in the
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
#[derive(Clone)]
pub struct RateLimitLayer {
    policy: Arc<Policy>,
}

impl std::fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.policy.keys.parts)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// A builder over this limiter.
    pub fn builder(limiter: impl KeyLimiter) -> RateLimitBuilder {
        Self::builder_shared(Arc::new(limiter))
    }

    /// A builder over a shared limiter (several layers, or a layer rebuilt on a config
    /// reload, can share one store).
    pub fn builder_shared(limiter: Arc<dyn KeyLimiter>) -> RateLimitBuilder {
        RateLimitBuilder {
            limiter,
            parts: vec![KeyPart::ClientIp],
            default_key: "ANONYMOUS".to_string(),
            max_key_len: 256,
            proxies: TrustedProxies::default(),
            bypass: Vec::new(),
            costs: RouteCosts::default(),
            headers_on_allow: true,
            policy_name: "default".to_string(),
            peer_addr: read_peer_addr,
        }
    }

    /// Whether requests must carry a [`PeerAddr`] (the key uses the client IP); a server may
    /// skip inserting it otherwise.
    pub fn needs_peer_addr(&self) -> bool {
        self.policy.keys.needs_ip()
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            policy: Arc::clone(&self.policy),
        }
    }
}

/// The service made by [`RateLimitLayer`] around an inner service.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{RateLimit, RateLimitLayer};
/// use tower_layer::Layer;
/// # #[derive(Clone)] struct Inner;
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse()?).build()?;
/// let service: RateLimit<Inner> = RateLimitLayer::builder(limiter).build()?.layer(Inner);
/// let _copy = service.clone(); // clones share the limiter
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    policy: Arc<Policy>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// One of the layer's own answers.
fn plain<B: From<&'static str>>(status: StatusCode, body: &'static str, headers: HeaderMap) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The headers of the layer's own answers.
fn plain_headers() -> HeaderMap {
    // Room for the rate-limit fields too, so the map is allocated once (see RateFields::write).
    let mut headers = HeaderMap::with_capacity(10);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: From<&'static str>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let kind = match self.policy.decide(&request) {
            Verdict::Pass(fields) => Kind::Inner {
                future: self.inner.call(request),
                fields: fields.map(|f| f.render(self.policy.id, &self.policy.policy_name)),
            },
            Verdict::Deny(fields) => Kind::Ready {
                response: Some(self.policy.denied(fields)),
            },
            Verdict::BadKey(rejection) => Kind::Ready {
                response: Some(Policy::bad_key(rejection)),
            },
            Verdict::Wait(check, key) => {
                // The service made ready by `poll_ready` goes with the request; a fresh clone
                // stays here for the next `poll_ready` (tower's clone-and-replace).
                let fresh = self.inner.clone();
                let ready = std::mem::replace(&mut self.inner, fresh);
                Kind::Checking {
                    check,
                    waiting: Some(Box::new(Waiting {
                        inner: ready,
                        request,
                        key,
                        policy: Arc::clone(&self.policy),
                    })),
                }
            }
        };
        ResponseFuture { kind }
    }
}

/// A request held back while the limiter decides, with what it needs afterwards.
struct Waiting<S, ReqBody> {
    inner: S,
    request: Request<ReqBody>,
    key: Box<str>,
    policy: Arc<Policy>,
}

pin_project! {
    /// The response of [`RateLimit`]: the inner service's (with the rate-limit fields added)
    /// or the limiter's own 429 or 400. Returned by `RateLimit::call`; see
    /// [`RateLimitLayer`] for an example that polls it.
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, ResBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // Boxed: only remote stores wait, and the in-memory future stays small.
        Checking { check: CheckFuture, waiting: Option<Box<Waiting<S, ReqBody>>> },
        Inner { #[pin] future: S::Future, fields: Option<Rendered> },
        Ready { response: Option<Response<ResBody>> },
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<&'static str>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            let next = match kind.as_mut().project() {
                KindProj::Checking { check, waiting } => {
                    let answer = std::task::ready!(Pin::new(check).poll(cx));
                    let Some(waiting) = waiting.take() else {
                        return Poll::Ready(Ok(server_error()));
                    };
                    let Waiting {
                        mut inner,
                        request,
                        key,
                        policy,
                    } = *waiting;
                    match policy.verdict(answer, || policy.limiter.quota(&key)) {
                        Verdict::Pass(fields) => Kind::Inner {
                            future: inner.call(request),
                            fields: fields.map(|f| f.render(policy.id, &policy.policy_name)),
                        },
                        Verdict::Deny(fields) => Kind::Ready {
                            response: Some(policy.denied(fields)),
                        },
                        // A verdict on an answer is never about the key or a wait.
                        Verdict::BadKey(_) | Verdict::Wait(..) => Kind::Ready {
                            response: Some(server_error()),
                        },
                    }
                }
                KindProj::Inner { future, fields } => {
                    let mut response = std::task::ready!(future.poll(cx))?;
                    if let Some(fields) = fields.take() {
                        fields.write(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                // Polled again after completion: a contract breach by the caller; answer 500
                // rather than panic.
                KindProj::Ready { response } => {
                    return Poll::Ready(Ok(response.take().unwrap_or_else(server_error)));
                }
            };
            kind.set(next);
        }
    }
}

fn server_error<B: From<&'static str>>() -> Response<B> {
    let mut r = Response::new(B::from(""));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice::{KeyedLimiter, ManualClock, StaticQuotas, TokenBucket};

    use super::*;

    #[derive(Clone)]
    struct Hello;

    impl Service<Request<()>> for Hello {
        type Response = Response<&'static str>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new("Hello World!")))
        }
    }

    fn service(policy_name: &str, clock: &ManualClock) -> RateLimit<Hello> {
        let quotas = StaticQuotas::from_iter([("alice".to_string(), "6/min burst 2".parse().unwrap())]);
        let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse().unwrap())
            .source(quotas)
            .clock(clock.clone())
            .build()
            .unwrap();
        RateLimitLayer::builder(limiter)
            .key([KeyPart::Header(http::HeaderName::from_static("x-account-id"))])
            .policy_name(policy_name)
            .build()
            .unwrap()
            .layer(Hello)
    }

    fn respond(service: &mut RateLimit<Hello>) -> Response<&'static str> {
        let request = Request::builder()
            .header("x-account-id", "alice")
            .body(())
            .unwrap();
        let future = std::pin::pin!(service.call(request));
        match future.poll(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(Ok(response)) => response,
            _ => unreachable!("answered at once"),
        }
    }

    fn field<'r>(response: &'r Response<&'static str>, name: &str) -> &'r str {
        response.headers()[name].to_str().unwrap()
    }

    #[test]
    fn repeated_denials_carry_their_own_policy_and_current_numbers() {
        let clock = ManualClock::new(0);
        let mut first = service("first", &clock);
        let mut second = service("second", &clock);
        for service in [&mut first, &mut second] {
            for _ in 0..2 {
                assert_eq!(respond(service).status(), StatusCode::OK);
            }
        }
        // Equal numbers under two policies, alternating on one thread: each keeps its name.
        for _ in 0..3 {
            for (service, name) in [(&mut first, "first"), (&mut second, "second")] {
                let denied = respond(service);
                assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(field(&denied, "ratelimit-policy"), format!("\"{name}\";q=2;w=20"));
                assert_eq!(field(&denied, "ratelimit"), format!("\"{name}\";r=0;t=20"));
                assert_eq!(field(&denied, "retry-after"), "10");
                assert_eq!(field(&denied, "content-type"), "text/plain");
                assert_eq!(denied.headers().len(), 7);
            }
        }
        // Time passes: the next denial's numbers move with it.
        clock.advance(Duration::from_secs(4));
        let denied = respond(&mut first);
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(field(&denied, "ratelimit"), "\"first\";r=0;t=16");
        assert_eq!(field(&denied, "retry-after"), "6");
        assert_eq!(field(&denied, "x-ratelimit-reset"), "16");
    }
}
