//! The rate-limit service's counters on Redis: two `sluice serve` processes on one real
//! `redis-server` share every descriptor limit, and a request one process denies consumes
//! nothing, in either process.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use common::{Client, Server, TempDir};
use redis_support::RedisServer;

/// Slow quotas (no refill during a test).
const RULES: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {quota: 5/h}
  - key: path
    value: /login
    rate_limit: {unit: hour, requests_per_unit: 3, name: login}
";

const CONFIG: &str = "
rules: edge.yaml
api: {listen: 127.0.0.1:0}
redis:
  policy: fail_closed
  hosts: 2
  timeout: 2s
";

fn start_two(redis: &RedisServer) -> (Server, Server, TempDir) {
    let dir = TempDir::new();
    dir.write("edge.yaml", RULES);
    let file = dir.write("sluice.yaml", CONFIG);
    let file = file.to_str().unwrap();
    let url = redis.url();
    let a = Server::start(&["--config", file, "--redis", &url]);
    let b = Server::start(&["--config", file, "--redis", &url]);
    (a, b, dir)
}

fn api(server: &Server) -> Client {
    Client::connect(server.api.expect("the config has api.listen"))
}

fn check(client: &mut Client, entries: &[&[(&str, &str)]], peek: bool) -> serde_json::Value {
    let descriptors: Vec<serde_json::Value> = entries
        .iter()
        .map(|entries| {
            let entries: Vec<_> = entries
                .iter()
                .map(|(key, value)| serde_json::json!({"key": key, "value": value}))
                .collect();
            serde_json::json!({ "entries": entries })
        })
        .collect();
    let body = serde_json::json!({"domain": "edge", "descriptors": descriptors}).to_string();
    let path = if peek { "/v1/check?peek=true" } else { "/v1/check" };
    let response = client.post_json(path, &body);
    assert_eq!(response.status, 200, "{response:?}");
    serde_json::from_str(&response.body).unwrap()
}

fn admitted(verdict: &serde_json::Value) -> bool {
    match verdict["overall_code"].as_str() {
        Some("OK") => true,
        Some("OVER_LIMIT") => false,
        other => panic!("unexpected overall_code {other:?} in {verdict}"),
    }
}

#[test]
fn two_servers_share_each_descriptor_limit_exactly() {
    let redis = RedisServer::start();
    let (a, b, _dir) = start_two(&redis);
    let (mut to_a, mut to_b) = (api(&a), api(&b));
    // A key-only rule: each user has 5 in total, whichever server is asked.
    for user in ["alice", "bob"] {
        let mut counts = [0, 0];
        for round in 0..12 {
            let (client, side) = if round % 2 == 0 {
                (&mut to_a, 0)
            } else {
                (&mut to_b, 1)
            };
            if admitted(&check(client, &[&[("user", user)]], false)) {
                counts[side] += 1;
            }
        }
        assert_eq!(counts, [3, 2], "{user}: admitted by each server");
    }
    // The counters are in Redis, under the service's own prefix.
    let keys = redis.cli(&["KEYS", "*"]);
    assert!(keys.contains("sluice:descriptors:"), "keys: {keys}");
}

#[test]
fn a_request_denied_on_one_server_consumes_nothing_on_either() {
    let redis = RedisServer::start();
    let (a, b, _dir) = start_two(&redis);
    let (mut to_a, mut to_b) = (api(&a), api(&b));
    let login: &[(&str, &str)] = &[("path", "/login")];
    let carol: &[(&str, &str)] = &[("user", "carol")];
    // The login limit (3) used up across both servers.
    assert!(admitted(&check(&mut to_a, &[login], false)));
    assert!(admitted(&check(&mut to_b, &[login], false)));
    assert!(admitted(&check(&mut to_a, &[login], false)));
    assert!(!admitted(&check(&mut to_b, &[login], false)));
    // carol's request is denied by its second descriptor, on either server...
    for client in [&mut to_a, &mut to_b] {
        let verdict = check(client, &[carol, login], false);
        assert!(!admitted(&verdict), "{verdict}");
        assert_eq!(verdict["statuses"][0]["code"], "OK", "{verdict}");
        assert_eq!(verdict["statuses"][1]["code"], "OVER_LIMIT", "{verdict}");
        // Decided by a take, which says when one more fits: within the 20 minutes of one unit.
        let retry = verdict["statuses"][1]["retry_after_ms"].as_u64().unwrap_or(0);
        assert!(retry > 0 && retry <= 1_200_000, "{verdict}");
    }
    // ...and carol's own limit is whole on both.
    for client in [&mut to_a, &mut to_b] {
        let verdict = check(client, &[carol], true);
        assert_eq!(verdict["statuses"][0]["limit_remaining"], 5, "{verdict}");
    }
    // Alone, carol is admitted five times in total.
    let admitted_alone = (0..8)
        .filter(|i| {
            let client = if i % 2 == 0 { &mut to_a } else { &mut to_b };
            admitted(&check(client, &[carol], false))
        })
        .count();
    assert_eq!(admitted_alone, 5);
}

#[test]
fn fail_closed_denies_while_redis_is_down_and_counts_again_when_it_returns() {
    let mut redis = RedisServer::start();
    let (a, _b, _dir) = start_two(&redis);
    let mut to_a = api(&a);
    let dave: &[(&str, &str)] = &[("user", "dave")];
    assert!(admitted(&check(&mut to_a, &[dave], false)));
    redis.kill();
    let verdict = check(&mut to_a, &[dave], false);
    assert!(
        !admitted(&verdict),
        "fail_closed admitted while Redis was down: {verdict}"
    );
    // Back, empty (the test's Redis keeps nothing): dave counts from a whole limit again.
    redis.restart();
    common::wait_until("Redis answering again", || {
        admitted(&check(&mut to_a, &[&[("user", "probe")]], true))
    });
    let verdict = check(&mut to_a, &[dave], false);
    assert!(admitted(&verdict), "{verdict}");
    assert_eq!(verdict["statuses"][0]["limit_remaining"], 4, "{verdict}");
}
