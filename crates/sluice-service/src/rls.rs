//! Envoy's rate-limit service, v3, over gRPC: `ShouldRateLimit` answered by the engine, and
//! the standard health service beside it (and, if asked, RLQS, [`RateLimitService::with_quotas`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Code, Status, codegen::BoxFuture};

use crate::rlqs::{QuotaService, STREAM_RATE_LIMIT_QUOTAS};
use crate::rls_message::{self, MAX_MESSAGE_BYTES};
use crate::{Engine, proto};

/// The gRPC path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The most concurrent streams per HTTP/2 connection.
const MAX_STREAMS: u32 = 1024;

/// `envoy.service.ratelimit.v3.RateLimitService`, answered by an [`Engine`].
///
/// # Example
/// ```no_run
/// use std::sync::Arc;
/// use sluice_descriptors::RuleSet;
/// use sluice_service::{Engine, EngineSettings, RateLimitService};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let rules = RuleSet::load("ratelimit/".as_ref())?;
/// let engine = Arc::new(Engine::new(rules, EngineSettings::default())?);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
/// RateLimitService::new(engine).serve(listener, std::future::pending()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitService {
    engine: Arc<Engine>,
    ready: Option<tokio::sync::watch::Receiver<bool>>,
    request_span: Option<RequestSpan>,
    quotas: Option<QuotaService>,
}

/// Opens the span a request is served in, from its operation's name and its headers (where a
/// caller's trace context, `traceparent`, arrives): what a binary that exports traces installs
/// with [`RateLimitService::traced`]. The decision's span is its child.
///
/// ```
/// use sluice_service::RequestSpan;
/// let open: RequestSpan = |name, _headers| tracing::trace_span!("request", otel.name = name);
/// assert!(open("ShouldRateLimit", &http::HeaderMap::new()).is_disabled());
/// ```
pub type RequestSpan = fn(&str, &http::HeaderMap) -> tracing::Span;

impl RateLimitService {
    /// The service over `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        Self {
            engine,
            ready: None,
            request_span: None,
            quotas: None,
        }
    }

    /// Reports the health service serving only while `ready` holds true (the host's
    /// readiness), instead of always.
    #[must_use]
    pub fn reporting(mut self, ready: tokio::sync::watch::Receiver<bool>) -> Self {
        self.ready = Some(ready);
        self
    }

    /// Serves each call in the span `open` gives for it (the gRPC path as its name, the call's
    /// metadata as its headers), instead of none.
    #[must_use]
    pub fn traced(mut self, open: RequestSpan) -> Self {
        self.request_span = Some(open);
        self
    }

    /// Serves `quotas` (Envoy's RLQS) on the same server too: its streams, its message-size
    /// limit and bounds are its own, and the health service reports it as it reports RLS. Its
    /// streams are not traced ([`RateLimitService::traced`]): each lasts as long as its client.
    /// To end them when the server stops, give it the same stop ([`QuotaService::stopping`]).
    #[must_use]
    pub fn with_quotas(mut self, quotas: QuotaService) -> Self {
        self.quotas = Some(quotas);
        self
    }

    /// Serves the service and `grpc.health.v1.Health` (reporting it serving, or following
    /// [`RateLimitService::reporting`]) on `listener` until `shutdown` completes.
    ///
    /// # Errors
    /// The listener failed.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        self.serve_incoming(incoming, shutdown).await
    }

    /// [`serve`](Self::serve), on the connections `incoming` gives (TLS streams, say).
    ///
    /// # Errors
    /// The connections failed.
    pub async fn serve_incoming<I, IO, IE>(
        self,
        incoming: I,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error>
    where
        I: futures_util::Stream<Item = Result<IO, IE>> + Send,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (reporter, health) = tonic_health::server::health_reporter();
        let quotas = self.quotas.clone();
        let with_quotas = quotas.is_some();
        reporter.set_serving::<Self>().await;
        if with_quotas {
            reporter.set_serving::<QuotaService>().await;
        }
        if let Some(mut ready) = self.ready.clone() {
            // Follows the host's readiness until its sender is gone.
            tokio::spawn(async move {
                loop {
                    let status = if *ready.borrow_and_update() {
                        tonic_health::ServingStatus::Serving
                    } else {
                        tonic_health::ServingStatus::NotServing
                    };
                    reporter
                        .set_service_status(<Self as NamedService>::NAME, status)
                        .await;
                    if with_quotas {
                        let rlqs = <QuotaService as NamedService>::NAME;
                        reporter.set_service_status(rlqs, status).await;
                    }
                    reporter.set_service_status("", status).await;
                    if ready.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
        let mut server = tonic::transport::Server::builder().max_concurrent_streams(MAX_STREAMS);
        if let Some(open) = self.request_span {
            server = server.trace_fn(move |request| match request.uri().path() {
                STREAM_RATE_LIMIT_QUOTAS => tracing::Span::none(),
                path => open(path, request.headers()),
            });
        }
        server
            .add_service(health)
            .add_service(self)
            .add_optional_service(quotas)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Answers one request message.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a request outside the bounds or with a field it cannot read.
    pub async fn should_rate_limit(
        &self,
        request: proto::RateLimitRequest,
    ) -> Result<proto::RateLimitResponse, Status> {
        let answer = rls_message::answer(&self.engine, request).await;
        answer.map_err(|e| Status::invalid_argument(e.to_string()))
    }

    /// The address a listener is bound to, for logs.
    pub fn local_addr(listener: &TcpListener) -> std::io::Result<SocketAddr> {
        listener.local_addr()
    }
}

/// `ShouldRateLimit` as tonic's unary service.
struct ShouldRateLimit(RateLimitService);

impl UnaryService<proto::RateLimitRequest> for ShouldRateLimit {
    type Response = proto::RateLimitResponse;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<tonic::Response<Self::Response>, Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<proto::RateLimitRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            service
                .should_rate_limit(request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

impl NamedService for RateLimitService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

impl<B> tower_service::Service<Request<B>> for RateLimitService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let status = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let method = ShouldRateLimit(self.clone());
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_MESSAGE_BYTES), None);
            Ok(too_large_is_resource_exhausted(grpc.unary(method, request).await))
        })
    }
}

/// gRPC's status codes give `RESOURCE_EXHAUSTED` to a message larger than the receiver's
/// maximum; tonic answers it `OUT_OF_RANGE`, before the method is called. The method answers
/// only `OK` and `INVALID_ARGUMENT`, so an `OUT_OF_RANGE` here is that refusal: answered again
/// with the right code and tonic's message.
fn too_large_is_resource_exhausted(response: Response<Body>) -> Response<Body> {
    match Status::from_header_map(response.headers()) {
        Some(status) if status.code() == Code::OutOfRange => {
            Status::resource_exhausted(status.message()).into_http()
        }
        _ => response,
    }
}
