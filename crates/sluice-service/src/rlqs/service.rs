//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService` over gRPC: each
//! `StreamRateLimitQuotas` stream read by a task of its own against the shared [`Quotas`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Code, Status, Streaming};

use super::proto::{RateLimitQuotaResponse, RateLimitQuotaUsageReports};
use super::quotas::{MAX_QUOTA_MESSAGE_BYTES, QuotaBounds, QuotaError, QuotaStream, Quotas};
use crate::Engine;

/// The gRPC path of `StreamRateLimitQuotas`.
pub const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// How often expired clients are swept ([`Quotas::sweep`]).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// `envoy.service.rate_limit_quota.v3.RateLimitQuotaService`, on an [`Engine`]'s rules: a
/// tonic service, served alone ([`QuotaService::serve`]) or beside others on one server.
///
/// # Example
/// ```no_run
/// use std::sync::Arc;
/// use sluice_descriptors::RuleSet;
/// use sluice_service::rlqs::QuotaService;
/// use sluice_service::{Engine, EngineSettings};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let rules = RuleSet::load("ratelimit/".as_ref())?;
/// let engine = Arc::new(Engine::new(rules, EngineSettings::default())?);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8081").await?;
/// QuotaService::new(engine).serve(listener, std::future::pending()).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct QuotaService {
    quotas: Arc<Quotas>,
    stop: Option<watch::Receiver<bool>>,
}

impl QuotaService {
    /// The service on `engine`'s rules, with the default bounds.
    pub fn new(engine: Arc<Engine>) -> Self {
        Self::bounded(engine, QuotaBounds::default())
    }

    /// The service on `engine`'s rules, within `bounds`.
    pub fn bounded(engine: Arc<Engine>, bounds: QuotaBounds) -> Self {
        Self {
            quotas: Arc::new(Quotas::new(engine, bounds)),
            stop: None,
        }
    }

    /// Ends every stream, open or opened later, once `stop` holds true (or its sender is
    /// gone), as a stream its client closed ends: with `OK`, each client's shares reserved
    /// until their assignments expire. A server's graceful shutdown waits for its streams,
    /// which otherwise last as long as their clients.
    #[must_use]
    pub fn stopping(mut self, stop: watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// The buckets its streams share.
    pub fn quotas(&self) -> &Arc<Quotas> {
        &self.quotas
    }

    /// Serves the service on `listener` until `shutdown` completes.
    ///
    /// # Errors
    /// The listener failed.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(self)
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// Starts the one task that sweeps expired clients, unless it runs already. It holds the
    /// buckets weakly and ends with them.
    fn sweeping(&self) {
        if self.quotas.swept.swap(true, Ordering::AcqRel) {
            return;
        }
        let quotas: Weak<Quotas> = Arc::downgrade(&self.quotas);
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                let Some(quotas) = quotas.upgrade() else {
                    return;
                };
                quotas.sweep(quotas.now());
            }
        });
    }
}

impl NamedService for QuotaService {
    const NAME: &'static str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
}

/// `StreamRateLimitQuotas` as tonic's streaming service.
struct OpenStream(QuotaService);

impl StreamingService<RateLimitQuotaUsageReports> for OpenStream {
    type Response = RateLimitQuotaResponse;
    type ResponseStream = Outbound;
    type Future = std::future::Ready<Result<tonic::Response<Outbound>, Status>>;

    fn call(&mut self, request: tonic::Request<Streaming<RateLimitQuotaUsageReports>>) -> Self::Future {
        self.0.sweeping();
        let quotas = Arc::clone(&self.0.quotas);
        let (stream, pushes) = match quotas.open() {
            Ok(opened) => opened,
            Err(e) => return std::future::ready(Err(status(&e))),
        };
        let (end, ended) = oneshot::channel();
        let stop = self.0.stop.clone();
        tokio::spawn(read(quotas, stream, request.into_inner(), end, stop));
        std::future::ready(Ok(tonic::Response::new(Outbound {
            queue: pushes,
            ended: Some(ended),
        })))
    }
}

/// Reads a stream's messages until it ends, answering each on the stream's queue; a
/// malformed one, or a failed read, ends it with its status (sent through `end`). Once `stop`
/// holds true it stops reading, and the stream ends with `OK`.
async fn read(
    quotas: Arc<Quotas>,
    mut stream: QuotaStream,
    mut inbound: Streaming<RateLimitQuotaUsageReports>,
    end: oneshot::Sender<Status>,
    mut stop: Option<watch::Receiver<bool>>,
) {
    let outbox = stream.outbox.clone();
    loop {
        let next = match stop.as_mut() {
            None => inbound.message().await,
            Some(stop) => tokio::select! {
                next = inbound.message() => next,
                _ = stop.wait_for(|stop| *stop) => return,
            },
        };
        let message = match next {
            Ok(Some(message)) => message,
            Ok(None) => return,
            Err(e) => {
                let _ = end.send(too_large_is_resource_exhausted(e));
                return;
            }
        };
        match stream.report(message, quotas.now()) {
            Ok(answer) if answer.bucket_action.is_empty() => {}
            Ok(answer) => {
                if outbox.send(answer).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                let _ = end.send(status(&e));
                return;
            }
        }
    }
}

fn status(error: &QuotaError) -> Status {
    if error.is_resource_exhausted() {
        Status::resource_exhausted(error.to_string())
    } else {
        Status::invalid_argument(error.to_string())
    }
}

/// gRPC gives `RESOURCE_EXHAUSTED` to a message larger than the receiver's maximum; tonic's
/// reader says `OUT_OF_RANGE`.
fn too_large_is_resource_exhausted(status: Status) -> Status {
    if status.code() == Code::OutOfRange {
        Status::resource_exhausted(status.message())
    } else {
        status
    }
}

/// What a stream sends: its queue (answers and pushes), then its end's status if it ended
/// on an error.
pub struct Outbound {
    queue: mpsc::Receiver<RateLimitQuotaResponse>,
    ended: Option<oneshot::Receiver<Status>>,
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound").finish_non_exhaustive()
    }
}

impl futures_util::Stream for Outbound {
    type Item = Result<RateLimitQuotaResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Poll::Ready(Some(message)) = this.queue.poll_recv(cx) {
            return Poll::Ready(Some(Ok(message)));
        }
        let Some(ended) = this.ended.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(ended).poll(cx) {
            Poll::Ready(Ok(status)) => {
                this.ended = None;
                Poll::Ready(Some(Err(status)))
            }
            // The reader ended without an error: so does the stream.
            Poll::Ready(Err(_)) => {
                this.ended = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<B> tower_service::Service<Request<B>> for QuotaService
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
        if request.uri().path() != STREAM_RATE_LIMIT_QUOTAS {
            let status = Status::unimplemented(format!("no method {}", request.uri().path()));
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let method = OpenStream(self.clone());
        Box::pin(async move {
            let mut grpc = Grpc::new(tonic_prost::ProstCodec::default())
                .apply_max_message_size_config(Some(MAX_QUOTA_MESSAGE_BYTES), None);
            Ok(grpc.streaming(method, request).await)
        })
    }
}
