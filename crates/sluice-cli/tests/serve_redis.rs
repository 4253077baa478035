//! `sluice serve --redis URL`: several servers share each limit through a real `redis-server`.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use common::{Client, Server, TempDir, sluice};
use redis_support::{RedisCluster, RedisServer};

/// One slow quota (no refill during a test) for one account; the failsafe is the same, so the
/// count is exact even before the account's quota is fetched.
fn config(algorithm: &str) -> String {
    format!(
        "
algorithm: {algorithm}
fetch_latency: 0s
failsafe: 5/h
bypass: [admin@example.com]
accounts:
  shared@example.com: 5/h
redis:
  policy: fail_closed
  hosts: 2
  timeout: 2s
"
    )
}

fn start_two(redis: &RedisServer, algorithm: &str) -> (Server, Server, TempDir) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", &config(algorithm));
    let file = file.to_str().unwrap();
    let url = redis.url();
    let a = Server::start(&["--config", file, "--redis", &url]);
    let b = Server::start(&["--config", file, "--redis", &url]);
    (a, b, dir)
}

#[test]
fn two_servers_admit_exactly_the_quota_in_total() {
    let redis = RedisServer::start();
    for algorithm in ["token_bucket", "sliding_window_log", "sliding_window_counter"] {
        redis.cli(&["FLUSHALL"]);
        let (a, b, _dir) = start_two(&redis, algorithm);
        let (mut to_a, mut to_b) = (a.client(), b.client());
        let admitted = alternate(&mut to_a, &mut to_b, algorithm);
        assert_eq!(admitted[0] + admitted[1], 5, "{algorithm}: admitted {admitted:?}");
        assert!(
            admitted[0] > 0 && admitted[1] > 0,
            "{algorithm}: admitted {admitted:?}"
        );
        // The same layer rules as in memory: bypass, and 400 for an over-long key.
        for client in [&mut to_a, &mut to_b] {
            assert_eq!(client.as_account(Some("admin@example.com")).status, 200);
            assert_eq!(client.as_account(Some(&"k".repeat(300))).status, 400);
        }
    }
}

#[test]
fn two_servers_on_a_redis_cluster_admit_exactly_the_quota_in_total() {
    let cluster = RedisCluster::start();
    let dir = TempDir::new();
    // Two of the three nodes: the client finds the third.
    let nodes = cluster.urls()[..2].join(", ");
    let text = format!("{}  cluster: [{nodes}]\n", config("token_bucket"));
    let file = dir.write("sluice.yaml", &text);
    let file = file.to_str().unwrap();
    let (a, b) = (
        Server::start(&["--config", file]),
        Server::start(&["--config", file]),
    );
    let (mut to_a, mut to_b) = (a.client(), b.client());
    let admitted = alternate(&mut to_a, &mut to_b, "cluster");
    assert_eq!(admitted[0] + admitted[1], 5, "admitted {admitted:?}");
    assert!(admitted[0] > 0 && admitted[1] > 0, "admitted {admitted:?}");
    // The limit lives on the cluster: one of its nodes holds the account's key.
    let held: usize = cluster
        .nodes
        .iter()
        .map(|node| node.cli(&["DBSIZE"]).trim().parse::<usize>().unwrap_or(0))
        .sum();
    assert!(held >= 1, "no key on any node");
}

/// Twenty requests for the shared account, alternating between the servers, each answer
/// checked; how many each server admitted.
fn alternate(to_a: &mut Client, to_b: &mut Client, what: &str) -> [usize; 2] {
    let mut admitted = [0; 2];
    for i in 0..20 {
        let client = if i % 2 == 0 { &mut *to_a } else { &mut *to_b };
        let r = client.as_account(Some("shared@example.com"));
        assert!(r.status == 200 || r.status == 429, "{what}: {r:?}");
        if r.status == 200 {
            admitted[i % 2] += 1;
        } else {
            assert_eq!(r.body, "Exceeded quota");
            assert!(r.number("retry-after") >= 1, "{r:?}");
            assert_eq!(
                r.header("ratelimit-policy"),
                Some("\"default\";q=5;w=3600"),
                "{r:?}"
            );
        }
    }
    admitted
}

#[test]
fn a_bad_or_unreachable_redis_url_is_one_line_and_a_failure() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", &config("token_bucket"));
    // Nothing listens on a port just released.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("redis://{}", free.local_addr().unwrap());
    drop(free);
    for (url, says) in [
        ("localhost:6379", "--redis: invalid Redis URL"),
        (closed.as_str(), "--redis: cannot reach Redis"),
    ] {
        let out = sluice()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .args(["--redis", url])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("sluice: ") && last.contains(says),
            "{url}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{url}: never said it was listening");
    }
}

#[test]
fn validate_checks_the_redis_section() {
    let dir = TempDir::new();
    let cases = [
        (
            "redis:\n  url: redis://127.0.0.1:6379\n  policy: retry\n",
            "redis.policy",
        ),
        ("redis:\n  url: 127.0.0.1:6379\n", "redis.url"),
        ("redis:\n  hosts: 0\n", "redis.hosts"),
        (
            "redis:\n  cluster: [redis://127.0.0.1:7000, 127.0.0.1:7001]\n",
            "redis.cluster[1]",
        ),
        (
            "algorithm: leaky_bucket\nredis:\n  url: redis://127.0.0.1\n",
            "redis",
        ),
    ];
    for (text, field) in cases {
        let file = dir.write("bad.yaml", text);
        let out = sluice().arg("validate").arg(&file).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?}");
        assert!(stderr.contains(&format!(": {field}: ")), "{text:?}: {stderr}");
    }
    let good = dir.write("good.yaml", &config("token_bucket"));
    let out = sluice().arg("validate").arg(&good).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_redis_section_without_a_url_needs_the_flag() {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", &config("token_bucket"));
    let out = sluice()
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("sluice: redis.url: not set"), "{stderr}");
}

#[test]
fn the_configured_policy_answers_while_redis_is_down_and_redis_decides_again_after() {
    let mut redis = RedisServer::start();
    let dir = TempDir::new();
    let text = config("token_bucket")
        .replace("fail_closed", "fail_open")
        .replace("timeout: 2s", "timeout: 200ms");
    let file = dir.write("sluice.yaml", &text);
    let server = Server::start(&["--config", file.to_str().unwrap(), "--redis", &redis.url()]);
    let mut client = server.client();
    let account = Some("shared@example.com");
    let statuses: Vec<u16> = (0..6).map(|_| client.as_account(account).status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);

    redis.kill();
    // fail_open: admitted while Redis does not answer, and the server stays up.
    for _ in 0..3 {
        assert_eq!(client.as_account(account).status, 200);
    }

    // Restarted empty: once the server probes it again, Redis counts afresh and denies the sixth.
    redis.restart();
    common::wait_until("a denial decided by Redis again", || {
        client.as_account(account).status == 429
    });
    assert!(
        !redis.cli(&["KEYS", "*"]).trim().is_empty(),
        "Redis holds the count again"
    );
}

#[test]
fn a_reload_that_changes_the_limiter_keeps_the_counts_in_redis() {
    let redis = RedisServer::start();
    let dir = TempDir::new();
    let text = config("token_bucket");
    let file = dir.write("sluice.yaml", &text);
    let server = Server::start(&["--config", file.to_str().unwrap(), "--redis", &redis.url()]);
    let mut client = server.client();
    let account = Some("shared@example.com");
    let statuses: Vec<u16> = (0..6).map(|_| client.as_account(account).status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);

    // A new limiter (other capacity and timeout) on the same Redis keys.
    dir.write(
        "sluice.yaml",
        &format!("{}capacity: 5000\n", text.replace("timeout: 2s", "timeout: 3s")),
    );
    server.wait_for_log("limiter settings changed (capacity, redis): counts kept in Redis");
    assert_eq!(client.as_account(account).status, 429);
}
