//! TLS on `sluice serve`'s listeners, over real sockets with certificates made at test time:
//! the main listener, the admin listener under mTLS with an allowed name, and the check API;
//! plaintext refused where TLS is on; a certificate rotated under load with no failed request;
//! a bad new pair keeping the running one.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::certs::Ca;
use common::{RulesService, Server, TempDir, wait_until};
use rcgen::ExtendedKeyUsagePurpose;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// A TLS client of `ca`'s servers, with a client certificate if given.
fn client_config(ca: &Ca, identity: Option<&(String, String)>) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    Arc::new(config)
}

/// One HTTP/1.1 request over TLS on a new connection: the status, or why there is none; and
/// the server certificate seen.
fn request(
    addr: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    head: &str,
) -> Result<(u16, Vec<u8>), String> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::clone(config), name).map_err(|e| e.to_string())?;
    let mut tcp = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut tcp);
    tls.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) => {}
        // A server that closes without close_notify: what was read is the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !answer.is_empty() => {}
        Err(e) => return Err(e.to_string()),
    }
    let seen = (conn.peer_certificates().and_then(|c| c.first()))
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&answer);
    let status = (text.strip_prefix("HTTP/1.1 ").and_then(|rest| rest.get(..3)))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {text:?}"))?;
    Ok((status, seen))
}

fn get(path: &str, account: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nX-Account-ID: {account}\r\nConnection: close\r\n\r\n")
}

/// Whether a plaintext request gets an HTTP answer.
fn plaintext_answered(addr: SocketAddr) -> bool {
    let Ok(mut tcp) = TcpStream::connect(addr) else {
        return false;
    };
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = tcp.write_all(get("/", "alice").as_bytes());
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer);
    answer.starts_with(b"HTTP/1.1 ")
}

/// A directory holding a new CA (`ca.pem`) and a server certificate it issued for localhost
/// and 127.0.0.1 (`cert.pem`, `key.pem`).
fn certificates() -> (TempDir, Ca) {
    let dir = TempDir::new();
    let ca = Ca::new();
    let (cert, key) = ca.issue(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    dir.write("cert.pem", &cert);
    dir.write("key.pem", &key);
    dir.write("ca.pem", &ca.pem());
    (dir, ca)
}

/// `sluice rules` over TLS in `dir` ([`certificates`]), asking clients for a certificate from
/// the CA naming host-1.example.
fn rules_service_over_mtls(dir: &TempDir) -> RulesService {
    let args = [
        "--db",
        "rules.db",
        "--tls-cert",
        "cert.pem",
        "--tls-key",
        "key.pem",
        "--tls-client-ca",
        "ca.pem",
        "--tls-allow",
        "host-1.example",
    ];
    RulesService::start(dir, &args)
}

struct Setup {
    dir: TempDir,
    ca: Ca,
    server: Server,
}

fn start() -> Setup {
    let (dir, ca) = certificates();
    dir.write(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {quota: 100/h}\n",
    );
    let config = "
tls: {cert: cert.pem, key: key.pem}
accounts: {alice: 100000/s}
admin: {listen: 127.0.0.1:0, tls: {cert: cert.pem, key: key.pem, client_ca: ca.pem, allow: [ops.example]}}
rules: edge.yaml
api: {listen: 127.0.0.1:0, tls: {cert: cert.pem, key: key.pem}}
";
    let file = dir.write("sluice.yaml", config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    assert!(
        server.first_line.starts_with("listening on https://"),
        "{}",
        server.first_line
    );
    Setup { dir, ca, server }
}

#[test]
fn every_listener_speaks_tls_and_refuses_plaintext() {
    let Setup { server, ca, .. } = start();
    let client = client_config(&ca, None);
    let (status, _) = request(server.addr, &client, &get("/", "alice")).unwrap();
    assert_eq!(status, 200);
    let api = server.api.unwrap();
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let post = format!(
        "POST /v1/check HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, _) = request(api, &client, &post).unwrap();
    assert_eq!(status, 200);
    for addr in [server.addr, api, server.admin.unwrap()] {
        assert!(!plaintext_answered(addr), "{addr} answered plaintext");
    }
}

#[test]
fn the_admin_listener_asks_for_a_client_certificate_from_its_ca_and_an_allowed_name() {
    let Setup { server, ca, .. } = start();
    let admin = server.admin.unwrap();
    let ops = ca.issue(&["ops.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let (status, _) = request(admin, &client_config(&ca, Some(&ops)), &get("/healthz", "x")).unwrap();
    assert_eq!(status, 200);
    // No certificate; one from another CA; one from the CA for a name not allowed.
    let anonymous = request(admin, &client_config(&ca, None), &get("/healthz", "x"));
    assert!(anonymous.is_err(), "{anonymous:?}");
    let stranger = Ca::new().issue(&["ops.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let strange = request(admin, &client_config(&ca, Some(&stranger)), &get("/healthz", "x"));
    assert!(strange.is_err(), "{strange:?}");
    let other = ca.issue(&["dev.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let refused = request(admin, &client_config(&ca, Some(&other)), &get("/healthz", "x"));
    assert!(refused.is_err(), "{refused:?}");
    // The main listener asks for none.
    let (status, _) = request(server.addr, &client_config(&ca, None), &get("/", "alice")).unwrap();
    assert_eq!(status, 200);
}

#[test]
fn a_rotated_certificate_is_taken_under_load_without_a_failed_request_and_a_bad_one_is_not() {
    let Setup { server, ca, dir } = start();
    let client = client_config(&ca, None);
    let (_, first) = request(server.addr, &client, &get("/", "alice")).unwrap();
    let (stop, failed, served) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (stop, failed, served, client, addr) = (
                stop.clone(),
                failed.clone(),
                served.clone(),
                client.clone(),
                server.addr,
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match request(addr, &client, &get("/", "alice")) {
                        Ok((200, _)) => served.fetch_add(1, Ordering::Relaxed),
                        other => {
                            eprintln!("failed: {other:?}");
                            failed.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            })
        })
        .collect();
    // Swap the pair as a deploy does: each file written whole, then renamed into place.
    let (cert, key) = ca.issue(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    dir.write("key.pem", &key);
    dir.write("cert.pem", &cert);
    let rotated = CertificateDer::from_pem_slice(cert.as_bytes()).unwrap().to_vec();
    wait_until("the new certificate to be served", || {
        request(server.addr, &client, &get("/", "alice")).is_ok_and(|(_, seen)| seen == rotated)
    });
    // A broken certificate file: the running pair stays.
    dir.write("cert.pem", "not a certificate");
    wait_until("the refusal to be logged", || {
        server.stderr().contains("TLS certificate not reloaded")
    });
    let (status, seen) = request(server.addr, &client, &get("/", "alice")).unwrap();
    assert_eq!((status, seen == rotated), (200, true));
    stop.store(true, Ordering::Relaxed);
    for thread in load {
        thread.join().unwrap();
    }
    assert_ne!(first, rotated);
    assert!(served.load(Ordering::Relaxed) > 10, "{served:?}");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during the rotation"
    );
}

#[test]
fn the_rls_port_speaks_grpc_over_tls() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use tonic::transport::{Certificate, Channel, ClientTlsConfig};

    let (dir, ca) = certificates();
    dir.write(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {quota: 1/h}\n",
    );
    let file = dir.write(
        "sluice.yaml",
        "rules: edge.yaml\nrls: {listen: 127.0.0.1:0, tls: {cert: cert.pem, key: key.pem}}\n",
    );
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let rls = server.rls.unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "u".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let codes = runtime.block_on(async {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.pem()))
            .domain_name("localhost");
        let channel = Channel::from_shared(format!("https://{rls}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = RateLimitServiceClient::new(channel);
        let mut codes = Vec::new();
        for _ in 0..2 {
            let answer = client
                .should_rate_limit(request.clone())
                .await
                .unwrap()
                .into_inner();
            codes.push(answer.overall_code);
        }
        codes
    });
    assert_eq!(codes, [1, 2], "OK, then OVER_LIMIT");
    // A plaintext gRPC client gets no answer.
    let plaintext: Result<(), String> = runtime.block_on(async {
        let channel = (Channel::from_shared(format!("http://{rls}"))
            .unwrap()
            .connect()
            .await)
            .map_err(|e| e.to_string())?;
        let answer = RateLimitServiceClient::new(channel)
            .should_rate_limit(request.clone())
            .await;
        answer.map(|_| ()).map_err(|e| e.to_string())
    });
    assert!(plaintext.is_err(), "a plaintext client was answered");
}

#[test]
fn the_rules_service_serves_https_and_under_mtls_asks_for_a_client_certificate() {
    let (dir, ca) = certificates();
    let rules = rules_service_over_mtls(&dir);
    let host = ca.issue(&["host-1.example"], ExtendedKeyUsagePurpose::ClientAuth);
    let (status, _) = request(
        rules.addr,
        &client_config(&ca, Some(&host)),
        &get("/v1/rules", "x"),
    )
    .unwrap();
    assert_eq!(status, 200);
    let other = ca.issue(&["host-2.example"], ExtendedKeyUsagePurpose::ClientAuth);
    assert!(
        request(
            rules.addr,
            &client_config(&ca, Some(&other)),
            &get("/v1/rules", "x")
        )
        .is_err()
    );
    assert!(request(rules.addr, &client_config(&ca, None), &get("/v1/rules", "x")).is_err());
    assert!(!plaintext_answered(rules.addr));
}

#[test]
fn a_host_polls_a_rules_service_over_mtls() {
    let (dir, ca) = certificates();
    let rules = rules_service_over_mtls(&dir);
    let host = ca.issue(&["host-1.example"], ExtendedKeyUsagePurpose::ClientAuth);
    dir.write("host.pem", &host.0);
    dir.write("host.key", &host.1);
    let rules_file = "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {quota: 1/h}\n";
    let put = format!(
        "PUT /v1/domains/edge HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{rules_file}",
        rules_file.len()
    );
    let (status, _) = request(rules.addr, &client_config(&ca, Some(&host)), &put).unwrap();
    assert_eq!(status, 201);
    // The host trusts the CA and presents its certificate; it starts from what it polled.
    let config = format!(
        "client_tls: {{ca: ca.pem, cert: host.pem, key: host.key}}\nrules: {{url: 'https://127.0.0.1:{}', poll: 1s}}\napi: {{listen: 127.0.0.1:0}}\n",
        rules.addr.port()
    );
    let file = dir.write("sluice.yaml", &config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    let mut api = common::Client::connect(server.api.unwrap());
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    let first = api.post_json("/v1/check", body);
    assert!(first.body.contains("\"OK\""), "{first:?}");
    let second = api.post_json("/v1/check", body);
    assert!(
        second.body.contains("OVER_LIMIT"),
        "the polled 1/h rule applies: {second:?}"
    );
    // Without the client certificate the host cannot start from the service (no snapshot).
    let refused = format!(
        "client_tls: {{ca: ca.pem}}\nrules: {{url: 'https://127.0.0.1:{}', snapshot: none.json}}\napi: {{listen: 127.0.0.1:0}}\n",
        rules.addr.port()
    );
    let file = dir.write("refused.yaml", &refused);
    let out = common::sluice()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("rules.url"), "{stderr}");
}

/// A `redis-server` that speaks TLS only, on a free port, with `dir`'s `cert.pem`, `key.pem`
/// and `ca.pem`; clients must present a certificate from the CA when `mtls`.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
}

impl TlsRedis {
    fn start(dir: &TempDir, mtls: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let path = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                &path("cert.pem"),
                "--tls-key-file",
                &path("key.pem"),
            ])
            .args(["--tls-ca-cert-file", &path("ca.pem")])
            .args(["--tls-auth-clients", if mtls { "yes" } else { "no" }])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/ensure-redis.sh installs it)");
        wait_until("redis-server to listen", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Self { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn limits_are_shared_through_a_redis_that_speaks_tls_only() {
    let (dir, ca) = certificates();
    let client = ca.issue(&["sluice.example"], ExtendedKeyUsagePurpose::ClientAuth);
    dir.write("client.pem", &client.0);
    dir.write("client.key", &client.1);
    let redis = TlsRedis::start(&dir, true);
    let config = format!(
        "accounts: {{carol: 3/h}}\nredis: {{url: 'rediss://127.0.0.1:{}', policy: fail_closed, timeout: 2s, tls: {{ca: ca.pem, cert: client.pem, key: client.key}}}}\n",
        redis.port
    );
    let file = dir.write("sluice.yaml", &config);
    // Two servers on the one Redis: three requests in all pass.
    let servers = [
        Server::start(&["--config", file.to_str().unwrap()]),
        Server::start(&["--config", file.to_str().unwrap()]),
    ];
    let mut admitted = 0;
    for i in 0..6 {
        let status = servers[i % 2].client().as_account(Some("carol")).status;
        assert!(matches!(status, 200 | 429), "{status}");
        admitted += usize::from(status == 200);
    }
    assert_eq!(admitted, 3);
    // Without the client certificate the Redis refuses the connection, and the start fails.
    let refused = format!(
        "accounts: {{carol: 3/h}}\nredis: {{url: 'rediss://127.0.0.1:{}', tls: {{ca: ca.pem}}}}\n",
        redis.port
    );
    let file = dir.write("refused.yaml", &refused);
    let out = common::sluice()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "started without a client certificate");
}

/// A TLS acceptor for `cert`/`key` (PEM), offering `http/1.1`.
fn acceptor(cert: &str, key: &str) -> tokio_rustls::TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[test]
fn the_proxy_speaks_https_to_its_upstream_and_http2_to_clients_that_ask_by_alpn() {
    let (dir, ca) = certificates();
    let (cert, key) = ca.issue(&["localhost"], ExtendedKeyUsagePurpose::ServerAuth);
    let upstream = common::upstream::Upstream::start_tls("secure", acceptor(&cert, &key));
    let config = dir.write(
        "proxy.yaml",
        &format!(
            "tls: {{cert: cert.pem, key: key.pem}}\nclient_tls: {{ca: ca.pem}}\naccounts: {{tester: 1000/s}}\n\
             upstream: 'https://localhost:{}'\n",
            upstream.addr.port()
        ),
    );
    let server = Server::start(&["--config", config.to_str().unwrap()]);

    // HTTP/2 by ALPN, to the same HTTP/1.1 upstream over TLS.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use http_body_util::BodyExt;
        let connect = |alpn: &[&[u8]]| {
            let mut config = (*client_config(&ca, None)).clone();
            config.alpn_protocols = alpn.iter().map(|name| name.to_vec()).collect();
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            async move {
                let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
                let name = ServerName::try_from("localhost").unwrap();
                connector.connect(name, tcp).await.unwrap()
            }
        };
        let request = || {
            http::Request::get("https://localhost/headers")
                .header("host", "localhost")
                .header("x-account-id", "tester")
                .body(http_body_util::Empty::<bytes::Bytes>::new())
                .unwrap()
        };

        // HTTP/1.1: no ALPN asked.
        let tls = connect(&[]).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), None);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(connection);
        let answer = sender.send_request(request()).await.unwrap();
        assert_eq!(answer.status().as_u16(), 200);
        assert_eq!(answer.headers()["x-upstream"], "secure");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("\nx-forwarded-proto: https\n"),
            "the client came over TLS: {text}"
        );

        // HTTP/2 by ALPN, to the same HTTP/1.1 upstream over TLS.
        let tls = connect(&[b"h2", b"http/1.1"]).await;
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tls),
        )
        .await
        .unwrap();
        tokio::spawn(connection);
        let mut h2_request = request();
        h2_request.headers_mut().remove("host");
        let answer = sender.send_request(h2_request).await.unwrap();
        assert_eq!(
            (answer.version(), answer.status().as_u16()),
            (http::Version::HTTP_2, 200)
        );
        assert_eq!(answer.headers()["x-upstream"], "secure");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with("GET /headers HTTP/1.1\n"), "{text}");
    });
}
