//! Seed 004's system over real processes: one rules service (`sluice rules`, SQLite), two
//! `sluice serve` hosts polling it. A rule written through the API is enforced by both, a
//! lowered quota keeps the consumption, a dead service leaves the last rules in force, and a
//! host restarted meanwhile starts from its snapshot.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use common::{Client, RulesService, Server, TempDir, sluice};

const WRITER: &str = "Bearer writer-0123456789abcdef";
const READER: &str = "reader-0123456789abcdef";

const EDGE_5: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

/// A host's config: its check API, and the rules service polled every 100 ms.
fn host_config(dir: &TempDir, url: &str) -> std::path::PathBuf {
    dir.write(
        "sluice.yaml",
        &format!(
            "rules: {{url: \"{url}\", poll: 100ms, token: {READER}, snapshot: rules.json}}\napi: {{listen: 127.0.0.1:0}}\n"
        ),
    )
}

fn start_host(config: &std::path::Path) -> Server {
    Server::start(&["--config", config.to_str().unwrap(), "--threads", "1"])
}

/// One check of `user` in domain `edge`.
fn check(host: &Server, user: &str) -> serde_json::Value {
    let mut client = Client::connect(host.api.expect("api.listen is set"));
    let body =
        format!(r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#);
    let response = client.post_json("/v1/check", &body);
    assert_eq!(response.status, 200, "{response:?}");
    serde_json::from_str(&response.body).unwrap()
}

/// How many times the host's log says `text`.
fn logged(host: &Server, text: &str) -> usize {
    host.stderr().matches(text).count()
}

fn wait_for_count(host: &Server, text: &str, count: usize) {
    common::wait_until(&format!("{count} × {text:?}"), || logged(host, text) >= count);
}

const APPLIED: &str = "rules from the rules service applied";

#[test]
fn two_hosts_follow_the_rules_service_and_keep_its_last_rules_when_it_dies() {
    let store = TempDir::new();
    store.write(
        "tokens",
        &format!("writer write writer-0123456789abcdef\nhosts read {READER}\n"),
    );
    let service = RulesService::start(&store, &["--tokens", "tokens"]);
    let url = format!("http://{}", service.addr);
    let (dir_a, dir_b) = (TempDir::new(), TempDir::new());
    let (config_a, config_b) = (host_config(&dir_a, &url), host_config(&dir_b, &url));
    let mut host_a = start_host(&config_a);
    let host_b = start_host(&config_b);
    // An empty store: nothing limits `edge` yet.
    assert_eq!(check(&host_a, "alice")["statuses"][0]["code"], "OK");
    assert!(check(&host_a, "alice")["statuses"][0]["current_limit"].is_null());

    // A rule created through the API reaches both hosts.
    let mut api = Client::connect(service.addr);
    let created = api.send(
        "PUT",
        "/v1/domains/edge",
        &[("authorization", WRITER), ("if-none-match", "*")],
        EDGE_5,
    );
    assert_eq!(created.status, 201, "{created:?}");
    let etag = created.header("etag").unwrap().to_owned();
    for host in [&host_a, &host_b] {
        wait_for_count(host, APPLIED, 1);
        for left in [4, 3] {
            let verdict = check(host, "alice");
            assert_eq!(verdict["statuses"][0]["limit_remaining"], left, "{verdict}");
        }
    }

    // Lowered to 3/h: alice's two stay taken on each host, so one is left.
    let lowered = api.send(
        "PUT",
        "/v1/domains/edge",
        &[("authorization", WRITER), ("if-match", &etag)],
        &EDGE_5.replace("requests_per_unit: 5", "requests_per_unit: 3"),
    );
    assert_eq!(lowered.status, 200, "{lowered:?}");
    for host in [&host_a, &host_b] {
        wait_for_count(host, APPLIED, 2);
        let verdict = check(host, "alice");
        assert_eq!(verdict["overall_code"], "OK", "{verdict}");
        assert_eq!(
            verdict["statuses"][0]["current_limit"]["quota"], "3/h",
            "{verdict}"
        );
        assert_eq!(verdict["statuses"][0]["limit_remaining"], 0, "{verdict}");
        assert_eq!(check(host, "alice")["overall_code"], "OVER_LIMIT");
    }

    // The service dies: both hosts say so once, however many polls fail, and enforce on.
    drop(service);
    let outage = "rules service: ";
    for host in [&host_a, &host_b] {
        wait_for_count(host, outage, 1);
    }
    // Ten more poll periods of failures.
    std::thread::sleep(std::time::Duration::from_secs(1));
    for host in [&host_a, &host_b] {
        assert_eq!(logged(host, outage), 1, "{}", host.stderr());
        assert_eq!(check(host, "alice")["overall_code"], "OVER_LIMIT");
        let verdict = check(host, "dave");
        assert_eq!(verdict["statuses"][0]["limit_remaining"], 2, "{verdict}");
    }

    // Host A restarts while the service is still down: it starts from its snapshot.
    drop(host_a);
    host_a = start_host(&config_a);
    host_a.wait_for_log("starting from the snapshot");
    let verdict = check(&host_a, "erin");
    assert_eq!(
        verdict["statuses"][0]["current_limit"]["quota"], "3/h",
        "{verdict}"
    );
    assert_eq!(verdict["statuses"][0]["limit_remaining"], 2, "{verdict}");
}

#[test]
fn garbage_from_the_service_is_refused_once_and_the_rules_stay() {
    // A rules service that answers one good snapshot, then garbage.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let good = format!(
        r#"{{"revision":1,"domains":[{{"domain":"edge","revision":1,"rules":{}}}]}}"#,
        serde_json::to_string(EDGE_5).unwrap()
    );
    let fake = std::thread::spawn(move || {
        let mut served = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut request = [0; 4096];
            let _ = stream.read(&mut request);
            let body = if served == 0 {
                good.as_str()
            } else {
                "{\"revision\": \"many\""
            };
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            served += 1;
            if served == 20 {
                break;
            }
        }
    });
    let dir = TempDir::new();
    let host = start_host(&host_config(&dir, &format!("http://{addr}")));
    host.wait_for_log("not a rules snapshot");
    fake.join().unwrap();
    assert_eq!(logged(&host, "not a rules snapshot"), 1, "{}", host.stderr());
    let verdict = check(&host, "alice");
    assert_eq!(
        verdict["statuses"][0]["current_limit"]["quota"], "5/h",
        "{verdict}"
    );
}

#[test]
fn a_host_with_neither_service_nor_snapshot_says_both_and_exits() {
    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = TempDir::new();
    let config = host_config(&dir, &format!("http://127.0.0.1:{port}"));
    let out = sluice()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rules.url") && stderr.contains("cannot reach") && stderr.contains("rules.json"),
        "{stderr}"
    );
}

#[test]
fn validate_checks_the_rules_service_settings() {
    let dir = TempDir::new();
    for (config, field) in [
        (
            "rules: {url: \"ftp://rules:8083\"}\napi: {listen: 127.0.0.1:0}\n",
            "rules.url",
        ),
        (
            "rules: {url: \"http://rules:8083\", poll: 0s}\napi: {listen: 127.0.0.1:0}\n",
            "rules.poll",
        ),
        (
            "rules: {url: \"http://rules:8083\", every: 1s}\napi: {listen: 127.0.0.1:0}\n",
            "rules",
        ),
    ] {
        let file = dir.write("sluice.yaml", config);
        let out = sluice().arg("validate").arg(&file).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(field),
            "{config}: {stderr}"
        );
    }
    let file = dir.write(
        "sluice.yaml",
        "rules: {url: \"http://rules:8083/base/\", poll: 2s}\napi: {listen: 127.0.0.1:0}\n",
    );
    let out = sluice().arg("validate").arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
