//! What stands behind the rate-limit layer: the demo's `Hello World!`, or with `upstream:`
//! in the config a reverse proxy to the application, its bodies streamed both ways.
//!
//! A request the layer admits is forwarded to the upstream its path routes to, on a pooled
//! keep-alive connection (`pool`), with its hop-by-hop headers removed and the forwarding headers
//! written from the client address sluice saw; the upstream's answer comes back streamed, its
//! own status (a 429 and its `Retry-After` included) untouched. An upstream that cannot be
//! reached is answered 502, one too slow 504, both as problem+json and counted. A request
//! dropped by its client (gone while waiting for capacity or for the upstream) drops the
//! upstream request with it.

mod body;
mod client;
mod exchange;
mod forward;
mod pool;
mod stats;
mod tunnel;
mod wire;

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http::header::HOST;
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use sluice_config::{HostHeader, UpstreamSettings, UpstreamUrl};
use sluice_http::TrustedProxies;
use tokio::time::Instant;

pub use body::{IdleBody, ServeBody};
pub use stats::{Failure, UpstreamSnapshot, UpstreamStats};
pub use tunnel::ConnectionPlace;

use client::{ConnectError, Connector};
use pool::{Pool, SendError};

/// The largest response body answered whole when it came with its head (bytes already read,
/// so no memory is added): it is then written with the head, without the streamed body's
/// machinery.
const WHOLE_AT_ONCE: u64 = 16 * 1024;

/// How long an idle pooled connection is kept: below the keep-alive timeout of common
/// application servers (Node's is 5 s), so sluice does not send a request on a connection
/// the upstream is closing.
const POOL_IDLE: Duration = Duration::from_secs(4);

/// The service behind the layer.
#[derive(Clone)]
pub enum Backend {
    /// The demo: `200 Hello World!`.
    Hello,
    /// A reverse proxy, and the address of the client whose request it is about to serve
    /// (set on the per-request clone of the service, see [`Backend::serving`]).
    Proxy(Arc<Proxy>, Option<IpAddr>),
}

impl Backend {
    /// A reverse proxy through `proxy`.
    pub fn proxy(proxy: Proxy) -> Self {
        Self::Proxy(Arc::new(proxy), None)
    }

    /// Whether this is a proxy.
    pub fn is_proxy(&self) -> bool {
        matches!(self, Self::Proxy(..))
    }

    /// Tells the proxy whose request comes next: the forwarding headers are written from
    /// it. Set on the service's per-request clone, it costs nothing to a request the limit
    /// refuses (unlike an extension put in every request).
    #[inline]
    pub fn serving(&mut self, peer: IpAddr) {
        if let Self::Proxy(_, client) = self {
            *client = Some(peer);
        }
    }
}

/// A reverse proxy to the upstreams of the `upstream:` section.
pub struct Proxy {
    /// Where each path goes.
    upstreams: UpstreamSettings,
    pool: Arc<Pool>,
    keep_host: bool,
    idle_timeout: Duration,
    trusted: TrustedProxies,
    /// How clients reach sluice: `http` or `https`.
    scheme: &'static str,
    stats: Arc<UpstreamStats>,
}

/// What the proxy is built from besides its section.
pub struct ProxyContext<'a> {
    /// Whose forwarding headers are extended rather than replaced.
    pub trusted: TrustedProxies,
    /// Whether clients reach sluice over TLS.
    pub tls: bool,
    /// How `https://` upstreams are spoken to (`client_tls`; Mozilla's roots if `None`).
    pub client_tls: Option<&'a sluice_rules_client::ClientTls>,
    /// The counts, kept across reloads.
    pub stats: Arc<UpstreamStats>,
}

impl Proxy {
    /// The proxy of `settings`.
    ///
    /// # Errors
    /// The default roots could not be loaded for `https://` upstreams (never with the built-in
    /// roots).
    pub fn new(
        settings: &UpstreamSettings,
        context: ProxyContext<'_>,
    ) -> Result<Self, sluice_rules_client::ClientTlsError> {
        let tls = match context.client_tls {
            Some(tls) => Arc::clone(tls.rustls_config()),
            None => Arc::clone(sluice_rules_client::ClientTls::new(None, None)?.rustls_config()),
        };
        let connector = Connector {
            tls,
            timeout: settings.connect_timeout,
        };
        let upstreams = (settings.routes.iter().map(|route| &route.url)).chain(&settings.default);
        let pool = Pool::new(
            upstreams,
            connector,
            settings.max_idle,
            POOL_IDLE,
            settings.head_timeout,
        );
        Ok(Self {
            upstreams: settings.clone(),
            pool,
            keep_host: settings.host == HostHeader::Keep,
            idle_timeout: settings.idle_timeout,
            trusted: context.trusted,
            scheme: if context.tls { "https" } else { "http" },
            stats: context.stats,
        })
    }

    /// Forwards `request` and answers with the upstream's response, or with the error that
    /// stands for it.
    async fn forward(
        self: Arc<Self>,
        peer: Option<IpAddr>,
        mut request: Request<Incoming>,
    ) -> Response<ServeBody> {
        if request.method() == Method::CONNECT {
            return own_problem(
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "CONNECT is not proxied",
            );
        }
        let Some(target) = self.upstreams.upstream_for(request.uri().path()) else {
            return own_problem(StatusCode::NOT_FOUND, "No route", "no upstream serves this path");
        };
        let version = request.version();
        let upgrade = match forward::strip_hop_by_hop(request.headers_mut(), version) {
            Ok(upgrade) => upgrade,
            Err(refusal) => return refused(refusal),
        };
        let client_side = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut request));
        let place = request.extensions_mut().remove::<ConnectionPlace>();
        let (mut parts, body) = request.into_parts();
        let added = peer.and_then(|peer| {
            let client = forward::Client {
                peer,
                trusted: self.trusted.trusts(peer),
                scheme: self.scheme,
            };
            forward::write_forwarding(&mut parts.headers, &client)
        });
        if let Err(refusal) =
            forward::set_host(&mut parts.headers, parts.uri.authority(), self.keep_host, version)
        {
            return refused(refusal);
        }
        if let Some(upgrade) = &upgrade {
            forward::keep_upgrade(&mut parts.headers, upgrade.clone());
        }
        if !parts.headers.contains_key(HOST) {
            // Only an HTTP/1.0 or HTTP/2 client's request (or `host: upstream`) comes without one.
            let host = HeaderValue::from_str(target.authority.as_str());
            parts.headers.extend(host.ok().map(|host| (HOST, host)));
        }
        // Origin form (`/path?query`), as a request to a server (not to a proxy) is written.
        let path = (parts.uri.path_and_query().cloned()).unwrap_or_else(|| PathAndQuery::from_static("/"));
        parts.uri = http::Uri::from(path);
        parts.version = Version::HTTP_11;
        let outgoing = IdleBody::new(body, self.idle_timeout);
        let added = added.as_ref().map_or(&[][..], |added| &added[..]);

        let started = Instant::now();
        let mut response = match self.pool.send(target, &parts, outgoing, added).await {
            Ok(response) => response,
            Err(e) => return self.failed(target, &e),
        };
        self.stats.timed(started.elapsed());
        let switching = forward::upgraded(response.status());
        // The upstream's hop-by-hop fields were left out as its head was read.
        let upstream_upgrade = if switching {
            response.body_mut().offered_upgrade()
        } else {
            None
        };
        // The upstream must switch to a protocol the client offered.
        let upstream_upgrade = upstream_upgrade.filter(|chosen| {
            upgrade
                .as_ref()
                .is_some_and(|offered| forward::offers(offered, chosen))
        });
        match (switching, client_side, upstream_upgrade) {
            (false, ..) => {}
            (true, Some(client_side), Some(protocol)) => {
                forward::keep_upgrade(response.headers_mut(), protocol);
                let (parts, body) = response.into_parts();
                let Some(upstream_side) = body.upgrade() else {
                    self.stats.failed(Failure::Broken);
                    let detail = format!(
                        "{}: switched protocols before the request was sent",
                        target.authority
                    );
                    return self.own_answer(StatusCode::BAD_GATEWAY, "Bad gateway", &detail);
                };
                tunnel::spawn(client_side, upstream_side, place, self.idle_timeout);
                self.stats.answered(StatusCode::SWITCHING_PROTOCOLS);
                return Response::from_parts(parts, ServeBody::from(Bytes::new()));
            }
            (true, ..) => {
                self.stats.failed(Failure::Broken);
                let detail = format!(
                    "{}: switched protocols unasked, or to one not offered",
                    target.authority
                );
                return self.own_answer(StatusCode::BAD_GATEWAY, "Bad gateway", &detail);
            }
        }
        self.stats.answered(response.status());
        // The client's own version: an HTTP/1.0 upstream's answer goes out as 1.1 to a 1.1
        // client.
        *response.version_mut() = version;
        let (parts, mut body) = response.into_parts();
        let body = match body.take_whole(WHOLE_AT_ONCE) {
            Some(whole) => {
                // Its connection goes back to the pool now, not when the answer is written.
                drop(body);
                ServeBody::from(whole)
            }
            None => ServeBody::upstream(body, self.idle_timeout),
        };
        Response::from_parts(parts, body)
    }

    /// The answer to a request the upstream did not take: 502, 504 for a connect or head timeout, 408
    /// when the client's own body stalled.
    fn failed(&self, target: &UpstreamUrl, error: &SendError) -> Response<ServeBody> {
        let (failure, status, title, cause) = match error {
            SendError::Exchange(e) if find::<body::IdleTimeout>(e).is_some() => {
                let detail = format!("the request body paused longer than {:?}", self.idle_timeout);
                return self.own_answer(StatusCode::REQUEST_TIMEOUT, "Request timeout", &detail);
            }
            SendError::Connect(e @ ConnectError::TimedOut(_)) => (
                Failure::ConnectTimeout,
                StatusCode::GATEWAY_TIMEOUT,
                "Gateway timeout",
                e.to_string(),
            ),
            SendError::HeadTimeout(_) => (
                Failure::HeadTimeout,
                StatusCode::GATEWAY_TIMEOUT,
                "Gateway timeout",
                error.to_string(),
            ),
            SendError::Connect(e) => (
                Failure::Connect,
                StatusCode::BAD_GATEWAY,
                "Bad gateway",
                e.to_string(),
            ),
            SendError::Exchange(e) => (
                Failure::Broken,
                StatusCode::BAD_GATEWAY,
                "Bad gateway",
                describe(e),
            ),
        };
        self.stats.failed(failure);
        tracing::debug!(upstream = %target.authority, "upstream failed: {cause}");
        self.own_answer(status, title, &format!("{}: {cause}", target.authority))
    }

    /// An answer made here, counted with the upstream's.
    fn own_answer(&self, status: StatusCode, title: &str, detail: &str) -> Response<ServeBody> {
        self.stats.answered(status);
        own_problem(status, title, detail)
    }
}

/// A problem+json answer.
fn own_problem(status: StatusCode, title: &str, detail: &str) -> Response<ServeBody> {
    sluice_http::problem(status, title, detail).map(|text| ServeBody::from(Bytes::from(text)))
}

/// The answer to a request the proxy does not forward.
fn refused(refusal: forward::Refusal) -> Response<ServeBody> {
    let status = refusal.status();
    own_problem(
        status,
        status.canonical_reason().unwrap_or("Refused"),
        refusal.detail(),
    )
}

/// The first error of type `E` in `error`'s chain.
fn find<'a, E: std::error::Error + 'static>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a E> {
    let mut at = Some(error);
    while let Some(error) = at {
        if let Some(found) = error.downcast_ref::<E>() {
            return Some(found);
        }
        at = error.source();
    }
    None
}

/// `error` and its causes, `: `-joined.
fn describe(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut at = error.source();
    while let Some(cause) = at {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        at = cause.source();
    }
    text
}

impl tower_service::Service<Request<Incoming>> for Backend {
    type Response = Response<ServeBody>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn call(&mut self, request: Request<Incoming>) -> Answer {
        match self {
            Backend::Hello => Answer::Now(ready(Ok(Response::new(ServeBody::from("Hello World!"))))),
            Backend::Proxy(proxy, peer) => {
                Answer::Forwarded(Box::pin(Arc::clone(proxy).forward(*peer, request)))
            }
        }
    }
}

/// The backend's answer: at once (the demo), or the upstream's.
pub enum Answer {
    /// Made at once.
    Now(Ready<Result<Response<ServeBody>, Infallible>>),
    /// Forwarded: boxed, as the exchange's state is large.
    Forwarded(Pin<Box<dyn Future<Output = Response<ServeBody>> + Send>>),
}

impl Future for Answer {
    type Output = Result<Response<ServeBody>, Infallible>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Answer::Now(ready) => Pin::new(ready).poll(cx),
            Answer::Forwarded(future) => future.as_mut().poll(cx).map(Ok),
        }
    }
}
