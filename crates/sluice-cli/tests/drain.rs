//! `sluice serve` on SIGTERM, over real sockets: readiness turns 503 and gRPC health
//! NOT_SERVING at once while every listener still accepts for `drain_delay`; then accept stops,
//! a request waiting for capacity is still served, and the process exits 0. A second signal
//! exits at once.

mod common;

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Client, Server, TempDir, wait_until};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn start(config: &str) -> (Server, TempDir) {
    let dir = TempDir::new();
    dir.write(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {quota: 5/h}\n",
    );
    let file = dir.write("sluice.yaml", config);
    let server = Server::start(&["--config", file.to_str().unwrap()]);
    (server, dir)
}

fn kill(server: &Server, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

fn grpc_health(server: &Server, runtime: &tokio::runtime::Runtime) -> ServingStatus {
    let rls = server.rls.expect("rls.listen");
    runtime.block_on(async {
        let channel = tonic::transport::Channel::from_shared(format!("http://{rls}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut health = HealthClient::new(channel);
        let answer = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap()
            .into_inner();
        ServingStatus::try_from(answer.status).unwrap()
    })
}

fn exit_status(server: &mut Server, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "still running after {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn sigterm_turns_readiness_off_at_once_keeps_accepting_for_the_delay_then_exits_cleanly() {
    let (mut server, _dir) = start(
        "drain_delay: 1500ms\nrules: edge.yaml\nrls: {listen: 127.0.0.1:0}\nadmin: {listen: 127.0.0.1:0}\naccounts: {alice: 100/s}\n",
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let admin = server.admin.expect("admin.listen");
    assert_eq!(Client::connect(admin).get("/readyz", &[]).status, 200);
    assert_eq!(grpc_health(&server, &runtime), ServingStatus::Serving);
    let signalled = Instant::now();
    kill(&server, "TERM");
    // Readiness says so at once, on both.
    wait_until("/readyz to turn 503", || {
        Client::connect(admin).get("/readyz", &[]).status == 503
    });
    let readyz = Client::connect(admin).get("/readyz", &[]);
    assert!(readyz.body.contains("\"shutdown\""), "{readyz:?}");
    wait_until("gRPC health to say NOT_SERVING", || {
        grpc_health(&server, &runtime) == ServingStatus::NotServing
    });
    assert!(
        signalled.elapsed() < Duration::from_millis(1000),
        "too slow to say so"
    );
    // New connections are still served during the delay, on the main listener.
    let response = server.client().as_account(Some("alice"));
    assert_eq!(response.status, 200, "{response:?}");
    assert!(signalled.elapsed() < Duration::from_millis(1500));
    // Then accept stops and the process exits 0.
    let status = exit_status(&mut server, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(
        signalled.elapsed() >= Duration::from_millis(1500),
        "left before the delay"
    );
    assert!(
        TcpStream::connect(server.addr).is_err(),
        "still accepting after exit"
    );
    assert!(
        server.stderr().contains("not ready; still accepting"),
        "{}",
        server.stderr()
    );
}

#[test]
fn a_request_waiting_for_capacity_when_accept_stops_is_still_served() {
    let (mut server, _dir) = start(
        "drain_delay: 0s\nadmin: {listen: 127.0.0.1:0}\non_excess: wait\nmax_wait: 10s\naccounts:\n  slow: 1/s burst 1\n",
    );
    let mut first = server.client();
    assert_eq!(first.as_account(Some("slow")).status, 200);
    // The second waits about a second for capacity.
    let mut waiter = server.client();
    waiter.send_as("slow");
    wait_until("the request to wait", || {
        let metrics = Client::connect(server.admin.unwrap()).get("/metrics", &[]).body;
        metrics
            .lines()
            .any(|line| line.starts_with("sluice_waiting_requests") && line.ends_with(" 1"))
    });
    kill(&server, "TERM");
    let response = waiter.response();
    assert_eq!(response.status, 200, "{response:?}");
    let status = exit_status(&mut server, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_second_signal_exits_at_once() {
    let (mut server, _dir) = start("drain_delay: 60s\n");
    kill(&server, "TERM");
    wait_until("the drain to start", || {
        server.stderr().contains("not ready; still accepting")
    });
    let signalled = Instant::now();
    kill(&server, "INT");
    let status = exit_status(&mut server, Duration::from_secs(5));
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(5));
}

#[test]
fn sigint_stops_accepting_at_once() {
    let (mut server, _dir) = start("drain_delay: 60s\n");
    let signalled = Instant::now();
    kill(&server, "INT");
    let status = exit_status(&mut server, Duration::from_secs(10));
    assert!(status.success(), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(10));
}
