//! Envoy's rate-limit service, v3, over gRPC: `ShouldRateLimit` answered by the engine, and
//! the standard health service beside it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tokio::net::TcpListener;
use tonic::body::Body;
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Status, codegen::BoxFuture};

use crate::proto::{self, Unit};
use crate::request::WireDescriptor;
use crate::{CheckRequest, Code, DescriptorRequest, DescriptorStatus, Engine, RequestError, Verdict};

/// The gRPC path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest request message read: bounds what one call can make the server decode.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

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
}

impl RateLimitService {
    /// The service over `engine`.
    pub fn new(engine: Arc<Engine>) -> Self {
        Self { engine, ready: None }
    }

    /// Reports the health service serving only while `ready` holds true (the host's
    /// readiness), instead of always.
    #[must_use]
    pub fn reporting(mut self, ready: tokio::sync::watch::Receiver<bool>) -> Self {
        self.ready = Some(ready);
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
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter.set_serving::<Self>().await;
        if let Some(mut ready) = self.ready.clone() {
            // Follows the host's readiness until its sender is gone.
            tokio::spawn(async move {
                loop {
                    if *ready.borrow_and_update() {
                        reporter.set_serving::<Self>().await;
                        reporter
                            .set_service_status("", tonic_health::ServingStatus::Serving)
                            .await;
                    } else {
                        reporter.set_not_serving::<Self>().await;
                        reporter
                            .set_service_status("", tonic_health::ServingStatus::NotServing)
                            .await;
                    }
                    if ready.changed().await.is_err() {
                        return;
                    }
                }
            });
        }
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .max_concurrent_streams(MAX_STREAMS)
            .add_service(health)
            .add_service(self)
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
        let request = from_proto(request)?;
        let verdict = (self.engine)
            .check_from(Some(crate::FrontEnd::Rls), &request, false)
            .await;
        let verdict = verdict.map_err(invalid)?;
        Ok(to_proto(verdict))
    }

    /// The address a listener is bound to, for logs.
    pub fn local_addr(listener: &TcpListener) -> std::io::Result<SocketAddr> {
        listener.local_addr()
    }
}

fn invalid(error: RequestError) -> Status {
    Status::invalid_argument(error.to_string())
}

/// The request as the engine reads it: strings moved, not copied.
fn from_proto(request: proto::RateLimitRequest) -> Result<CheckRequest, Status> {
    let hits = Some(u64::from(request.hits_addend));
    CheckRequest::from_wire(request.domain, request.descriptors, hits).map_err(Status::invalid_argument)
}

impl WireDescriptor for proto::RateLimitDescriptor {
    fn into_request(self) -> Result<DescriptorRequest, String> {
        if self.is_negative_hits {
            return Err("is_negative_hits is not supported".to_string());
        }
        let limit = (self.limit.map(override_quota).transpose()).map_err(|e| format!("limit: {e}"))?;
        Ok(DescriptorRequest {
            entries: (self.entries.into_iter())
                .map(|entry| (entry.key, entry.value))
                .collect(),
            hits: self.hits_addend.map(|hits| hits.value),
            limit,
        })
    }
}

/// The quota of a descriptor's `limit` override.
fn override_quota(limit: proto::RateLimitOverride) -> Result<sluice::Quota, String> {
    let unit = Unit::from_number(limit.unit).ok_or_else(|| format!("unit {} is not a unit", limit.unit))?;
    if limit.requests_per_unit == 0 {
        return Ok(sluice::Quota::deny_all());
    }
    sluice::Quota::new(
        u64::from(limit.requests_per_unit),
        std::time::Duration::from_secs(unit.seconds()),
    )
    .map_err(|e| e.to_string())
}

fn to_proto(verdict: Verdict) -> proto::RateLimitResponse {
    proto::RateLimitResponse {
        overall_code: code(verdict.overall),
        statuses: verdict.statuses.iter().map(status).collect(),
        response_headers_to_add: verdict
            .headers
            .into_iter()
            .map(|(key, value)| proto::HeaderValue { key, value })
            .collect(),
        request_headers_to_add: Vec::new(),
    }
}

fn code(code: Code) -> i32 {
    match code {
        Code::Ok => proto::Code::Ok as i32,
        Code::OverLimit => proto::Code::OverLimit as i32,
    }
}

fn status(status: &DescriptorStatus) -> proto::DescriptorStatus {
    proto::DescriptorStatus {
        code: code(status.code),
        current_limit: status.limit.as_ref().map(|limit| {
            let (requests_per_unit, unit) = per_unit(limit.quota);
            proto::RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit,
                unit: unit as i32,
            }
        }),
        limit_remaining: u32::try_from(status.remaining).unwrap_or(u32::MAX),
        duration_until_reset: status.limit.as_ref().map(|_| proto::Duration {
            seconds: i64::try_from(status.reset_after.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(status.reset_after.subsec_nanos()).unwrap_or(0),
        }),
    }
}

/// A quota as requests per one of envoy's units: the shortest unit that holds a whole number
/// of its periods (`1.1/s` is 66 per minute); a quota whose period divides none is given per
/// second, rounded down.
pub(crate) fn per_unit(quota: sluice::Quota) -> (u32, Unit) {
    if quota.is_deny_all() {
        return (0, Unit::Second);
    }
    let (count, period) = (u128::from(quota.count()), u128::from(quota.period_nanos()));
    for unit in Unit::ALL {
        let unit_nanos = u128::from(unit.seconds()) * 1_000_000_000;
        if unit_nanos % period == 0 {
            let per_unit = count * (unit_nanos / period);
            return (u32::try_from(per_unit).unwrap_or(u32::MAX), unit);
        }
    }
    let per_second = count * 1_000_000_000 / period;
    (u32::try_from(per_second).unwrap_or(u32::MAX), Unit::Second)
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
            Ok(grpc.unary(method, request).await)
        })
    }
}
