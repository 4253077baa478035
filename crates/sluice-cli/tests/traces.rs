//! Traces over OTLP, to a collector made in the test from the OTLP protobuf definitions
//! (`opentelemetry-proto`'s gRPC server): an RLS decision on a real `redis-server` arrives as
//! a request span continuing the caller's `traceparent`, its decision span, and the decision's
//! Redis call, each the child of the one before; keys appear only when asked; a caller that
//! says "not sampled" is not traced; the check API and the HTTP listener are traced too; an
//! `https://` collector is reached trusting `client_tls.ca`.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Client, Server, TempDir, wait_until};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use redis_support::RedisServer;

/// A collector that keeps every span it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// The collector listening on a port of its own, on a runtime of its own.
struct Receiver {
    addr: SocketAddr,
    collector: Collector,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    fn start() -> Self {
        Self::serving(None)
    }

    /// [`Receiver::start`], over TLS with the certificate `cert` and key `key` (PEM).
    fn start_tls(cert: &str, key: &str) -> Self {
        let identity = tonic::transport::Identity::from_pem(cert, key);
        Self::serving(Some(tonic::transport::ServerTlsConfig::new().identity(identity)))
    }

    fn serving(tls: Option<tonic::transport::ServerTlsConfig>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let collector = Collector::default();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(collector.clone());
        runtime.spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let mut server = tonic::transport::Server::builder();
            if let Some(tls) = tls {
                server = server.tls_config(tls).unwrap();
            }
            server
                .add_service(service)
                .serve_with_incoming(incoming)
                .await
                .unwrap();
        });
        Self {
            addr,
            collector,
            _runtime: runtime,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The spans of trace `trace_id` once `count` have arrived.
    fn trace(&self, trace_id: &[u8], count: usize) -> Vec<Span> {
        let of_trace = || -> Vec<Span> {
            let spans = self.collector.spans.lock().unwrap();
            spans.iter().filter(|s| s.trace_id == trace_id).cloned().collect()
        };
        wait_until(&format!("{count} spans of the trace"), || {
            of_trace().len() >= count
        });
        of_trace()
    }

    fn all(&self) -> Vec<Span> {
        self.collector.spans.lock().unwrap().clone()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(s) => Some(s.clone()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::IntValue(i) => Some(i.to_string()),
        other => Some(format!("{other:?}")),
    }
}

fn named<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} among {names:?}"))
}

const RULES: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

/// A server on the edge rules with `extra` config at the top, exporting to `receiver` every
/// 100 ms.
fn start(receiver: &Receiver, extra: &str, args: &[&str]) -> (Server, TempDir) {
    start_every(receiver, extra, args, "100")
}

/// [`start`], exporting every `delay_ms`.
fn start_every(receiver: &Receiver, extra: &str, args: &[&str], delay_ms: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("rules")).unwrap();
    dir.write("rules/edge.yaml", RULES);
    let config = format!(
        "rules: rules\nrls: {{listen: 127.0.0.1:0}}\napi: {{listen: 127.0.0.1:0}}\naccounts: {{alice: 1/m}}\n{extra}"
    );
    let file = dir.write("sluice.yaml", &config);
    let mut all = vec!["--config", file.to_str().unwrap()];
    all.extend_from_slice(args);
    let endpoint = receiver.endpoint();
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", delay_ms),
    ];
    (Server::start_with_env(&all, &env), dir)
}

fn should_rate_limit(rls: SocketAddr, user: &str, traceparent: &str) -> i32 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = RateLimitServiceClient::connect(format!("http://{rls}"))
            .await
            .unwrap();
        let mut request = tonic::Request::new(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: user.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        });
        request
            .metadata_mut()
            .insert("traceparent", traceparent.parse().unwrap());
        client
            .should_rate_limit(request)
            .await
            .unwrap()
            .into_inner()
            .overall_code
    })
}

#[test]
fn an_rls_decision_on_redis_arrives_with_its_redis_call_under_the_callers_trace() {
    let redis = RedisServer::start();
    let receiver = Receiver::start();
    let (server, _dir) = start(&receiver, "", &["--redis", &redis.url()]);
    let rls = server.rls.expect("rls.listen");
    let trace_id = [0x4b_u8; 16];
    let caller = [0x1c_u8; 8];
    let traceparent = format!("00-{}-{}-01", hex(&trace_id), hex(&caller));
    assert_eq!(
        should_rate_limit(rls, "alice", &traceparent),
        1,
        "the first is OK"
    );
    assert_eq!(
        should_rate_limit(rls, "alice", &traceparent),
        2,
        "the second is over"
    );

    let spans = receiver.trace(&trace_id, 6);
    let requests: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name.ends_with("/ShouldRateLimit"))
        .collect();
    let decisions: Vec<&Span> = spans.iter().filter(|s| s.name == "sluice.decision").collect();
    let calls: Vec<&Span> = spans.iter().filter(|s| s.name == "redis EVALSHA").collect();
    assert_eq!(
        (requests.len(), decisions.len(), calls.len()),
        (2, 2, 2),
        "{spans:#?}"
    );
    for request in &requests {
        assert_eq!(
            request.parent_span_id, caller,
            "the request continues the caller's span"
        );
        assert_eq!(request.kind, 2, "server");
        let decision = (decisions.iter())
            .find(|d| d.parent_span_id == request.span_id)
            .expect("a decision under each request");
        let call = (calls.iter())
            .find(|c| c.parent_span_id == decision.span_id)
            .expect("a Redis call under each decision");
        assert_eq!(call.kind, 3, "client");
        assert_eq!(attribute(call, "db.system.name").as_deref(), Some("redis"));
        assert_eq!(attribute(decision, "domain").as_deref(), Some("edge"));
        assert!(
            attribute(decision, "rule").is_some_and(|r| r.contains("user")),
            "{decision:?}"
        );
        // The key is not asked for: no span carries it.
        assert_eq!(attribute(decision, "descriptors"), None);
        assert!(!format!("{spans:?}").contains("alice"));
    }
    let mut outcomes: Vec<String> = (decisions.iter())
        .map(|d| attribute(d, "outcome").unwrap())
        .collect();
    outcomes.sort();
    assert_eq!(outcomes, ["OK", "OVER_LIMIT"]);
}

#[test]
fn keys_when_asked_the_callers_sampling_the_check_api_and_the_http_listener() {
    let receiver = Receiver::start();
    let otlp = format!("otlp: {{keys: true, endpoint: '{}'}}\n", receiver.endpoint());
    let (server, _dir) = start(&receiver, &otlp, &[]);
    let rls = server.rls.expect("rls.listen");

    // A caller that does not sample: nothing of its trace is exported.
    let unsampled = [0x77_u8; 16];
    let traceparent = format!("00-{}-{}-00", hex(&unsampled), hex(&[0x2d; 8]));
    assert_eq!(should_rate_limit(rls, "bob", &traceparent), 1);

    // The check API, continuing a sampled trace, names the keys as asked.
    let checked = [0x5e_u8; 16];
    let mut api = Client::connect(server.api.expect("api.listen"));
    let body = r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "carol"}]}]}"#;
    let traceparent = format!("00-{}-{}-01", hex(&checked), hex(&[0x3e; 8]));
    let response = api.send(
        "POST",
        "/v1/check",
        &[
            ("content-type", "application/json"),
            ("traceparent", &traceparent),
        ],
        body,
    );
    assert_eq!(response.status, 200, "{response:?}");
    let spans = receiver.trace(&checked, 2);
    let request = named(&spans, "POST /v1/check");
    let decision = named(&spans, "sluice.decision");
    assert_eq!(decision.parent_span_id, request.span_id);
    assert_eq!(attribute(decision, "descriptors").as_deref(), Some("user=carol"));

    // The HTTP listener, with a caller's trace it cannot read: a trace of its own.
    let garbled = [("x-account-id", "alice"), ("traceparent", "00-not-a-trace-id-01")];
    let response = server.client().get("/", &garbled);
    assert_eq!(response.status, 200, "{response:?}");
    wait_until("the HTTP request's spans", || {
        receiver
            .all()
            .iter()
            .any(|s| s.name == "GET" && s.parent_span_id.is_empty())
    });
    let spans = receiver.all();
    let get = spans.iter().find(|s| s.name == "GET").unwrap();
    let decision = (spans.iter())
        .find(|s| s.name == "sluice.decision" && s.parent_span_id == get.span_id)
        .expect("the HTTP request's decision");
    assert!(
        attribute(decision, "descriptors").is_some_and(|d| d.contains("alice")),
        "{decision:?}"
    );

    // Still nothing of the unsampled trace, after everything since was exported.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!receiver.all().iter().any(|s| s.trace_id == unsampled));
}

#[test]
fn the_spans_held_at_sigterm_are_sent_before_the_process_exits() {
    let receiver = Receiver::start();
    // Batches every 10 minutes: only the flush at exit can send these.
    let (mut server, _dir) = start_every(&receiver, "drain_delay: 0s\n", &[], "600000");
    let trace_id = [0x9a_u8; 16];
    let traceparent = format!("00-{}-{}-01", hex(&trace_id), hex(&[0x01; 8]));
    assert_eq!(should_rate_limit(server.rls.unwrap(), "dave", &traceparent), 1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(receiver.all().is_empty(), "nothing sent before the exit");
    assert!(server.signal("TERM").success());
    let spans = receiver.trace(&trace_id, 2);
    named(&spans, "sluice.decision");
}

#[test]
fn a_collector_that_is_down_costs_no_request_and_does_not_hold_the_exit() {
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("rules")).unwrap();
    dir.write("rules/edge.yaml", RULES);
    let config = format!(
        "rules: rules\nrls: {{listen: 127.0.0.1:0}}\ndrain_delay: 0s\notlp: {{endpoint: 'http://{closed}'}}\n"
    );
    let file = dir.write("sluice.yaml", &config);
    let mut server = Server::start_with_env(
        &["--config", file.to_str().unwrap()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "50")],
    );
    let rls = server.rls.unwrap();
    for i in 0..20 {
        let traceparent = format!("00-{}-{}-01", hex(&[0x33; 16]), hex(&[0x44; 8]));
        assert_eq!(
            should_rate_limit(rls, &format!("user{i}"), &traceparent),
            1,
            "request {i}"
        );
    }
    let stopping = std::time::Instant::now();
    assert!(server.signal("TERM").success(), "{}", server.stderr());
    // The flush at exit gives up within its 5 s.
    assert!(
        stopping.elapsed() < Duration::from_secs(8),
        "{:?}",
        stopping.elapsed()
    );
    let log = server.stderr();
    assert!(!log.contains("panicked"), "{log}");
    // The operator is told the spans are lost.
    assert!(
        log.contains("ERROR") && log.to_lowercase().contains("export"),
        "{log}"
    );
}

#[test]
fn an_https_collector_is_reached_trusting_client_tls_ca() {
    let ca = common::certs::Ca::new();
    let (cert, key) = ca.issue(&["localhost"], rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let receiver = Receiver::start_tls(&cert, &key);
    let dir = TempDir::new();
    let ca_file = dir.write("ca.pem", &ca.pem());
    std::fs::create_dir_all(dir.path().join("rules")).unwrap();
    dir.write("rules/edge.yaml", RULES);
    let config = format!(
        "rules: rules\nrls: {{listen: 127.0.0.1:0}}\nclient_tls: {{ca: {}}}\notlp: {{endpoint: 'https://localhost:{}'}}\n",
        ca_file.display(),
        receiver.addr.port()
    );
    let file = dir.write("sluice.yaml", &config);
    let server = Server::start_with_env(
        &["--config", file.to_str().unwrap()],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let trace_id = [0x7e_u8; 16];
    let traceparent = format!("00-{}-{}-01", hex(&trace_id), hex(&[0x05; 8]));
    assert_eq!(should_rate_limit(server.rls.unwrap(), "erin", &traceparent), 1);
    let spans = receiver.trace(&trace_id, 2);
    named(&spans, "sluice.decision");
}

#[test]
fn a_bad_endpoint_is_refused_naming_its_variable() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", "otlp: {endpoint: 'collector:4317'}\n");
    let output = common::sluice()
        .args(["validate", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("otlp.endpoint") && stderr.contains("http://"),
        "{stderr}"
    );
}
