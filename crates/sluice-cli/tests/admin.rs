//! The admin listener of `sluice serve`, over real sockets: `/metrics` counts what clients
//! were told, `/v1/top` names the flooded keys, `/readyz` follows Redis under `fail_closed`,
//! and the console's page is served.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use common::{Client, Server, TempDir, wait_until};
use redis_support::RedisServer;

const CONFIG: &str = "
admin: {listen: 127.0.0.1:0}
fetch_latency: 0s
failsafe: 1/h
unknown: 1/h
accounts:
  alice@example.com: 3/h
  bob@example.com: 5/h
";

fn start(config: &str, extra: &[&str]) -> (Server, TempDir) {
    let dir = TempDir::new();
    let file = dir.write("sluice.yaml", config);
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let server = Server::start(&args);
    (server, dir)
}

fn admin(server: &Server) -> Client {
    Client::connect(server.admin.expect("admin.listen is set"))
}

/// The value of the sample of `metric` whose labels contain every one of `labels`.
fn sample(metrics: &str, metric: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .find(|line| line.starts_with(metric) && labels.iter().all(|l| line.contains(l)))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {metric} {labels:?} in:\n{metrics}"))
}

#[test]
fn metrics_count_what_clients_were_told_and_top_names_the_flooded_keys() {
    let (server, _dir) = start(CONFIG, &[]);
    let started = std::time::Instant::now();
    let mut client = server.client();
    let mut denied = std::collections::HashMap::new();
    for (account, requests) in [("alice@example.com", 10), ("bob@example.com", 7)] {
        for _ in 0..requests {
            if client.as_account(Some(account)).status == 429 {
                *denied.entry(account).or_insert(0u64) += 1;
            }
        }
    }
    // A flood of new keys, and one key flooding hardest.
    for i in 0..200 {
        client.as_account(Some(&format!("mallory{i}")));
    }
    for _ in 0..50 {
        client.as_account(Some("mallory"));
    }
    let metrics = admin(&server).get("/metrics", &[]);
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .unwrap()
            .starts_with("application/openmetrics-text"),
        "{metrics:?}"
    );
    let body = &metrics.body;
    for (account, told) in &denied {
        let rule = format!("rule=\"accounts: account={account}\"");
        assert_eq!(
            sample(body, "sluice_decisions_total", &[&rule, "outcome=\"denied\""]),
            *told
        );
    }
    assert_eq!((denied["alice@example.com"], denied["bob@example.com"]), (7, 2));
    let unknown = "rule=\"accounts: account\"";
    assert_eq!(
        sample(body, "sluice_decisions_total", &[unknown, "outcome=\"allowed\""]),
        201
    );
    assert_eq!(
        sample(body, "sluice_decisions_total", &[unknown, "outcome=\"denied\""]),
        49
    );
    assert_eq!(
        sample(body, "sluice_decision_seconds_count", &["front=\"http\""]),
        267
    );
    assert!(sample(body, "sluice_store_entries", &["engine=\"accounts\""]) >= 203);
    assert!(body.ends_with("# EOF\n"), "{body}");

    let top = admin(&server).get("/v1/top?rule=accounts:%20account&n=3", &[]);
    assert_eq!(top.status, 200, "{top:?}");
    let top: serde_json::Value = serde_json::from_str(&top.body).unwrap();
    assert_eq!(top["keys"][0]["key"], "account=mallory", "{top}");
    assert_eq!(top["keys"][0]["denied"], 49, "{top}");
    assert_eq!(admin(&server).get("/v1/top?rule=nothing", &[]).status, 404);
    // Across every rule, each key with the rule that denied it.
    let across = admin(&server).get("/v1/top?n=3", &[]);
    assert_eq!(across.status, 200, "{across:?}");
    let across: serde_json::Value = serde_json::from_str(&across.body).unwrap();
    let first = &across["keys"][0];
    assert_eq!(
        (
            &first["key"],
            &first["denied"],
            &first["rule"],
            &first["engine"],
            &first["domain"]
        ),
        (
            &"account=mallory".into(),
            &49.into(),
            &"accounts: account".into(),
            &"accounts".into(),
            &"accounts".into()
        ),
        "{across}"
    );
    // alice (7 denials) under her own rule, then bob (2).
    assert_eq!(
        across["keys"][1]["rule"], "accounts: account=alice@example.com",
        "{across}"
    );
    assert_eq!(across["keys"][1]["denied"], 7, "{across}");
    assert_eq!(across["keys"].as_array().unwrap().len(), 3, "{across}");
    let narrowed = admin(&server).get("/v1/top?domain=accounts&n=1", &[]);
    assert_eq!(narrowed.status, 200, "{narrowed:?}");
    assert!(narrowed.body.contains("account=mallory"), "{narrowed:?}");
    assert_eq!(admin(&server).get("/v1/top?domain=nowhere", &[]).status, 404);
    assert_eq!(
        admin(&server).get("/v1/top?domain=accounts&rule=x", &[]).status,
        400
    );
    assert_eq!(admin(&server).get("/v1/top?n=many", &[]).status, 400);
    // Near the limit: an admission that left less than a fifth of the capacity. alice's third
    // of 3 and bob's fifth of 5 left nothing (bob's fourth left 1 of 5: a fifth, not less);
    // every one-shot key's first of 1.
    for (rule, near) in [
        ("accounts: account=alice@example.com", 1),
        ("accounts: account=bob@example.com", 1),
        ("accounts: account", 201),
    ] {
        let rule = format!("rule=\"{rule}\"");
        assert_eq!(sample(body, "sluice_near_limit_total", &[&rule]), near, "{rule}");
    }

    let stats = admin(&server).get("/v1/rule-stats", &[]);
    assert_eq!(stats.status, 200, "{stats:?}");
    let stats: serde_json::Value = serde_json::from_str(&stats.body).unwrap();
    let accounts = (stats.as_array().unwrap().iter())
        .find(|rule| rule["rule"] == "accounts: account")
        .unwrap_or_else(|| panic!("no accounts rule in {stats}"));
    assert_eq!(accounts["shadow_mode"], false, "{accounts}");
    assert!(accounts["denied"].as_u64().unwrap() >= 49, "{accounts}");
    // The rules service's snapshot path is not the admin listener's.
    assert_eq!(admin(&server).get("/v1/rules", &[]).status, 404);

    assert_eq!(admin(&server).get("/healthz", &[]).status, 200);
    let ui = admin(&server).get("/ui", &[]);
    assert_eq!(ui.status, 200);
    assert!(ui.body.contains("<canvas id=\"chart\""), "{}", ui.body);
    // Denials are logged, paced (5 a second by default), naming rule and key: alice's first.
    server.wait_for_log("denied rule=accounts: account=alice@example.com key=\"account=alice@example.com\"");
    // 58 denials, of which at most a burst of 5 and 5 a second since are logged.
    let logged = server.stderr().matches(" denied rule=").count();
    let paced = 5 + (5.0 * started.elapsed().as_secs_f64()).ceil() as usize;
    assert!(
        logged >= 1 && logged <= paced.min(58),
        "{logged} denials logged, at most {paced}"
    );
}

/// On Redis as in memory: the keys denied most across every rule, and the admissions near
/// the limit, counted from the store's answers.
#[test]
fn top_across_rules_and_near_limit_on_redis() {
    let redis = RedisServer::start();
    let (server, _dir) = start(CONFIG, &["--redis", &redis.url()]);
    let mut client = server.client();
    // alice: 3 an hour; the third admission leaves nothing, the next two are denied.
    let told: Vec<u16> = (0..5)
        .map(|_| client.as_account(Some("alice@example.com")).status)
        .collect();
    assert_eq!(told, [200, 200, 200, 429, 429]);
    let top = admin(&server).get("/v1/top?n=1", &[]);
    assert_eq!(top.status, 200, "{top:?}");
    let top: serde_json::Value = serde_json::from_str(&top.body).unwrap();
    assert_eq!(top["keys"][0]["key"], "account=alice@example.com", "{top}");
    assert_eq!(
        top["keys"][0]["rule"], "accounts: account=alice@example.com",
        "{top}"
    );
    assert_eq!(top["keys"][0]["denied"], 2, "{top}");
    let body = admin(&server).get("/metrics", &[]).body;
    let rule = "rule=\"accounts: account=alice@example.com\"";
    assert_eq!(sample(&body, "sluice_near_limit_total", &[rule]), 1);
}

/// `metrics: {per_rule: false}` sums every rule of a domain into one series per outcome (and
/// drops the per-value series); a reload back to the default brings the rules' series back.
#[test]
fn decisions_are_counted_per_domain_when_asked() {
    let per_domain = format!("{CONFIG}metrics: {{per_rule: false}}\n");
    let (server, dir) = start(&per_domain, &[]);
    let mut client = server.client();
    for account in [
        "alice@example.com",
        "alice@example.com",
        "alice@example.com",
        "alice@example.com",
        "bob@example.com",
        "eve",
    ] {
        client.as_account(Some(account));
    }
    let body = admin(&server).get("/metrics", &[]).body;
    let domain = "domain=\"accounts\"";
    assert_eq!(
        sample(&body, "sluice_decisions_total", &[domain, "outcome=\"allowed\""]),
        5
    );
    assert_eq!(
        sample(&body, "sluice_decisions_total", &[domain, "outcome=\"denied\""]),
        1
    );
    assert_eq!(sample(&body, "sluice_hits_total", &[domain]), 6);
    // alice's third, and eve's first of 1.
    assert_eq!(sample(&body, "sluice_near_limit_total", &[domain]), 2);
    let per_rule_lines = (body.lines())
        .filter(|line| line.starts_with("sluice_") && line.contains("rule=\""))
        .collect::<Vec<_>>();
    assert!(per_rule_lines.is_empty(), "{per_rule_lines:?}");
    assert!(!body.contains("decisions_by_value"), "{body}");

    dir.write("sluice.yaml", CONFIG);
    let rule = "rule=\"accounts: account=alice@example.com\"";
    wait_until("the rules' series back after the reload", || {
        let body = admin(&server).get("/metrics", &[]).body;
        body.lines()
            .any(|line| line.starts_with("sluice_decisions_total") && line.contains(rule))
    });
}

#[test]
fn readiness_follows_redis_under_fail_closed() {
    let mut redis = RedisServer::start();
    let config = format!("{CONFIG}redis: {{policy: fail_closed, timeout: 300ms}}\n");
    let (server, _dir) = start(&config, &["--redis", &redis.url()]);
    let ready = |server: &Server| admin(server).get("/readyz", &[]);
    let first = ready(&server);
    assert_eq!(first.status, 200, "{first:?}");
    assert!(first.body.contains("\"name\":\"redis\""), "{}", first.body);

    redis.kill();
    // One probe after Redis is gone says so, naming the check.
    let down = ready(&server);
    assert_eq!(down.status, 503, "{down:?}");
    assert!(down.body.contains("fail_closed"), "{}", down.body);

    redis.restart();
    wait_until("ready again", || ready(&server).status == 200);
}

#[test]
fn the_rules_service_is_reached_through_the_admin_listener_with_the_callers_token() {
    let store = TempDir::new();
    store.write(
        "tokens",
        "writer write writer-0123456789abcdef\nhosts read reader-0123456789abcdef\n",
    );
    let rules = common::RulesService::start(&store, &["--tokens", "tokens"]);
    let config = format!(
        "admin: {{listen: 127.0.0.1:0}}\napi: {{listen: 127.0.0.1:0}}\nrules: {{url: \"http://{}\", poll: 100ms, token: reader-0123456789abcdef, snapshot: rules.json}}\n",
        rules.addr
    );
    let (server, _dir) = start(&config, &[]);
    let edge =
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    // Without the caller's token nothing is written: the host's own token is not lent.
    let refused = admin(&server).send("PUT", "/rules/domains/edge", &[("if-none-match", "*")], edge);
    assert_eq!(refused.status, 401, "{refused:?}");
    assert_eq!(refused.header("www-authenticate"), Some("Bearer"));
    let writer = ("authorization", "Bearer writer-0123456789abcdef");
    let created = admin(&server).send(
        "PUT",
        "/rules/domains/edge",
        &[writer, ("if-none-match", "*")],
        edge,
    );
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(created.header("etag"), Some("\"1\""));
    let listed = admin(&server).get("/rules/domains?prefix=ed", &[writer]);
    assert!(listed.body.contains("\"edge\""), "{listed:?}");
    // The host polls it in.
    server.wait_for_log("rules from the rules service applied");
    let metrics = admin(&server).get("/metrics", &[]).body;
    assert_eq!(sample(&metrics, "sluice_rules_revision", &[]), 1);

    // A host that reads files has nothing to forward to.
    let (plain, _dir) = start(CONFIG, &[]);
    assert_eq!(admin(&plain).get("/rules/domains", &[]).status, 404);
}

#[test]
fn the_failsafe_pools_use_is_shown_while_quotas_are_fetched() {
    // Quotas take an hour to fetch: every new key stays on the failsafe quota and the pool.
    let config = "admin: {listen: 127.0.0.1:0}\nfetch_latency: 1h\nfetch_timeout: 2h\nfailsafe: 10/min\nfailsafe_pool: 100/min\n";
    let (server, _dir) = start(config, &[]);
    let mut client = server.client();
    for i in 0..3 {
        assert_eq!(
            client.as_account(Some(&format!("new{i}@example.com"))).status,
            200
        );
    }
    let metrics = admin(&server).get("/metrics", &[]).body;
    assert_eq!(
        sample(&metrics, "sluice_failsafe_pool_used", &["engine=\"accounts\""]),
        3
    );
    assert_eq!(
        sample(
            &metrics,
            "sluice_failsafe_pool_capacity",
            &["engine=\"accounts\""]
        ),
        100
    );
    assert_eq!(
        sample(
            &metrics,
            "sluice_quota_fetches_in_flight",
            &["engine=\"accounts\""]
        ),
        3
    );
}
