//! The rules service failing the way networks fail, between a host (`sluice serve` polling it)
//! and a real `sluice rules`: hung (the connection accepted, no answer ever), slow (past the
//! host's timeout), answering bytes that are no HTTP, refusing connections. Through each the
//! host decides on its last good rules, its polls do not pile up, `/readyz` says the service
//! does not answer, and a change written meanwhile applies once the service answers again.

mod common;

use std::time::{Duration, Instant};

use common::fault::{Fault, FaultProxy};
use common::{Client, RulesService, Server, TempDir, wait_until};

const WRITER: &str = "Bearer writer-0123456789abcdef";
const READER: &str = "reader-0123456789abcdef";

const POLL: Duration = Duration::from_millis(100);
const TIMEOUT: Duration = Duration::from_millis(300);

fn edge(per_hour: u64) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{unit: hour, requests_per_unit: {per_hour}}}\n"
    )
}

/// The quota the host applies to `user` now, and how long the check took.
fn quota_of(host: &Server, user: &str) -> (String, Duration) {
    let start = Instant::now();
    let mut client = Client::connect(host.api.expect("api.listen"));
    let body =
        format!(r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#);
    let response = client.post_json("/v1/check", &body);
    assert_eq!(response.status, 200, "{response:?}");
    let verdict: serde_json::Value = serde_json::from_str(&response.body).unwrap();
    let quota = verdict["statuses"][0]["current_limit"]["quota"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    (quota, start.elapsed())
}

fn readyz_detail(host: &Server) -> String {
    let response = Client::connect(host.admin.expect("admin.listen")).get("/readyz", &[]);
    assert_eq!(
        response.status, 200,
        "rules service faults never make a host unready: {response:?}"
    );
    response.body
}

#[test]
fn a_host_keeps_its_rules_through_a_hung_slow_garbled_or_dead_rules_service_and_takes_the_next_change() {
    let store = TempDir::new();
    store.write(
        "tokens",
        &format!("writer write writer-0123456789abcdef\nhosts read {READER}\n"),
    );
    let service = RulesService::start(&store, &["--tokens", "tokens"]);
    let proxy = FaultProxy::start(service.addr);
    let dir = TempDir::new();
    let config = dir.write(
        "sluice.yaml",
        &format!(
            "rules: {{url: \"{}\", poll: {}ms, timeout: {}ms, token: {READER}, snapshot: rules.json}}\napi: {{listen: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\n",
            proxy.http_url(),
            POLL.as_millis(),
            TIMEOUT.as_millis()
        ),
    );
    let host = Server::start(&["--config", config.to_str().unwrap(), "--threads", "1"]);

    let mut api = Client::connect(service.addr);
    let created = api.send(
        "PUT",
        "/v1/domains/edge",
        &[("authorization", WRITER), ("if-none-match", "*")],
        &edge(5),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let mut etag = created.header("etag").unwrap().to_owned();
    wait_until("the first rules", || quota_of(&host, "alice").0 == "5/h");

    let mut per_hour = 5;
    for fault in [
        Fault::Stall,
        Fault::Latency(Duration::from_secs(1)),
        Fault::Garbage,
        Fault::Refuse,
    ] {
        proxy.set(fault);
        wait_until(
            &format!("{fault:?}: readyz to say the service does not answer"),
            || readyz_detail(&host).contains("does not answer now"),
        );

        // Polls go one at a time, each ending at the timeout: over 2 s, at most one connection
        // per poll period plus timeout (and the one under way). Piled-up polls would open one
        // every poll period.
        let (before, start) = (proxy.accepted(), Instant::now());
        std::thread::sleep(Duration::from_secs(2));
        let opened = proxy.accepted() - before;
        let cycles = start.elapsed().as_millis() / (POLL + TIMEOUT).as_millis();
        if matches!(fault, Fault::Stall | Fault::Latency(_)) {
            assert!(
                u128::from(opened) <= cycles + 1,
                "{fault:?}: {opened} connections in {:?}",
                start.elapsed()
            );
        }

        // Meanwhile the host decides at once, on the last rules it had.
        let (quota, took) = quota_of(&host, &format!("during-{fault:?}"));
        assert_eq!(quota, format!("{per_hour}/h"), "{fault:?}");
        assert!(took < Duration::from_secs(1), "{fault:?}: a check took {took:?}");

        // A change written while the host cannot see it applies once the service answers.
        per_hour += 1;
        let changed = api.send(
            "PUT",
            "/v1/domains/edge",
            &[("authorization", WRITER), ("if-match", &etag)],
            &edge(per_hour),
        );
        assert_eq!(changed.status, 200, "{changed:?}");
        etag = changed.header("etag").unwrap().to_owned();
        std::thread::sleep(POLL * 3);
        assert_eq!(
            quota_of(&host, "bob").0,
            format!("{}/h", per_hour - 1),
            "{fault:?}"
        );
        proxy.set(Fault::None);
        wait_until(&format!("{fault:?}: the change after recovery"), || {
            quota_of(&host, "bob").0 == format!("{per_hour}/h")
        });
        wait_until("readyz to say the service answers", || {
            !readyz_detail(&host).contains("does not answer now")
        });
    }
    // One warning per outage, not one per failed poll.
    let warnings = host
        .stderr()
        .matches("the running rules stay, polling on")
        .count();
    assert_eq!(warnings, 4, "{}", host.stderr());
}
