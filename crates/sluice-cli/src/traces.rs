//! Traces over OTLP (`otlp:`): the spans sluice's crates open at [`sluice::TRACE_TARGET`] (a
//! request, its decision, the decision's Redis calls, quota fetches, rules polls) exported in
//! batches to a collector, each request continuing its caller's trace (`traceparent`, in HTTP
//! headers or gRPC metadata). Off, nothing here runs: the logs are set up as they always were
//! and each span costs one level check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use sluice_config::OtlpSettings;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::FilterFn;

/// Whether traces are exported: set once, at start.
static ON: AtomicBool = AtomicBool::new(false);

/// How long one batch may take to reach the collector before it is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest the exporter is given at exit to send what it holds.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether this process exports traces (decides whether the front ends open request spans).
pub(crate) fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The running exporter: flushed at exit.
pub(crate) struct Traces {
    provider: SdkTracerProvider,
}

/// The subscriber layer that hands sluice's spans (and warnings and errors logged inside
/// them) to the exporter.
pub(crate) type ExportLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;

/// Starts the exporter to `settings.endpoint`, inside a tokio runtime (its gRPC channel's
/// worker runs there). Nothing is sent until the first span ends; a collector that is down
/// costs dropped batches, logged by the exporter, never a request.
pub(crate) fn start(settings: &OtlpSettings) -> Result<(Traces, ExportLayer), String> {
    let mut exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(EXPORT_TIMEOUT);
    if settings.endpoint.starts_with("https://") {
        exporter = exporter.with_tls_config(tls_config(settings));
    }
    let exporter = exporter.build().map_err(|e| format!("otlp.endpoint: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("sluice")
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    // A caller's sampling decision stands; traces begun here keep `sample_ratio` of them.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sluice");
    let exported = FilterFn::new(|meta| {
        meta.target() == sluice::TRACE_TARGET || (meta.is_event() && *meta.level() <= tracing::Level::WARN)
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(exported)
        .boxed();
    ON.store(true, Ordering::Relaxed);
    Ok((Traces { provider }, layer))
}

/// The client TLS of an `https://` collector: `client_tls`'s CA (Mozilla's roots without one)
/// and its certificate, if any.
fn tls_config(settings: &OtlpSettings) -> ClientTlsConfig {
    let tls = ClientTlsConfig::new();
    let tls = match &settings.ca_pem {
        Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
        None => tls.with_webpki_roots(),
    };
    match &settings.identity_pem {
        Some((cert, key)) => tls.identity(Identity::from_pem(cert, key)),
        None => tls,
    }
}

impl Traces {
    /// Sends what the exporter holds, within [`FLUSH_TIMEOUT`]. Off the runtime's threads:
    /// the export waits on the gRPC channel this runtime drives.
    pub(crate) async fn flush(self) {
        let provider = self.provider;
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_TIMEOUT)).await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("otlp: the last traces were not all sent: {e}"),
            Err(e) => tracing::warn!("otlp: flushing the traces failed: {e}"),
        }
    }
}

/// W3C trace context's field, named once (a `&str` name is parsed at each lookup).
static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// The span a request is served in, named `name`, continuing the trace its `traceparent`
/// names (if it names one); an unreadable one starts a new trace.
pub(crate) fn request_span(name: &str, headers: &HeaderMap) -> Span {
    let span = tracing::trace_span!(
        target: sluice::TRACE_TARGET,
        "request",
        otel.name = name,
        otel.kind = "server",
    );
    if !span.is_disabled() && headers.contains_key(&TRACEPARENT) {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        // Fails only for a span the exporter does not see, which this is not.
        let _ = span.set_parent(parent);
    }
    span
}

/// Request headers as the propagator reads them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A tower layer that serves each request in its [`request_span`] (the check API's routes).
#[derive(Clone, Copy)]
pub(crate) struct RequestSpans(pub &'static str);

impl<S> tower_layer::Layer<S> for RequestSpans {
    type Service = InSpan<S>;

    fn layer(&self, inner: S) -> InSpan<S> {
        InSpan { inner, name: self.0 }
    }
}

/// A service whose every call runs in its request's span.
#[derive(Clone)]
pub(crate) struct InSpan<S> {
    inner: S,
    name: &'static str,
}

impl<S, B> tower_service::Service<http::Request<B>> for InSpan<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tracing::instrument::Instrumented<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        use tracing::Instrument;
        let span = request_span(self.name, request.headers());
        let future = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        future.instrument(span)
    }
}
