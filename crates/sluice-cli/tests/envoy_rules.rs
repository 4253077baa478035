//! envoy ratelimit's config semantics over sockets, on memory and on a real `redis-server`,
//! asked over RLS (an envoy-types gRPC client) and over the check API (HTTP JSON): quota mode
//! (per descriptor and global), shared wildcard thresholds, dynamic metadata, global shadow
//! mode, and domains merged from several files.

mod common;
#[path = "../../sluice-redis/tests/support/mod.rs"]
mod redis_support;

use common::{Client, Server, TempDir, sluice};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use redis_support::RedisServer;
use serde_json::{Value as Json, json};

/// Where the counters are.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Redis,
}

/// How the service is asked.
#[derive(Clone, Copy, Debug)]
enum Front {
    Rls,
    Api,
}

/// One answer, as either front end gives it.
#[derive(Debug)]
struct Answer {
    ok: bool,
    /// Each descriptor's code: true for OK.
    codes: Vec<bool>,
    /// Each descriptor's limit remaining.
    remaining: Vec<u64>,
    /// The dynamic metadata, as JSON.
    metadata: Option<Json>,
    /// The header fields for the client, in order.
    headers: Vec<(String, String)>,
}

/// A server on `files` with `extra` config, on `backend`, and a way to ask it.
struct Service {
    server: Server,
    runtime: tokio::runtime::Runtime,
    _dir: TempDir,
}

impl Service {
    fn start(backend: Backend, redis: &RedisServer, files: &[(&str, &str)], extra: &str) -> Self {
        Self::start_with(backend, redis, files, extra, "")
    }

    /// With `extra` inside `rls: {...}` and `top` at the config's top level.
    fn start_with(
        backend: Backend,
        redis: &RedisServer,
        files: &[(&str, &str)],
        extra: &str,
        top: &str,
    ) -> Self {
        let dir = TempDir::new();
        std::fs::create_dir_all(dir.path().join("rules")).unwrap();
        for (name, text) in files {
            dir.write(&format!("rules/{name}"), text);
        }
        let config = format!(
            "{top}rules: rules\nrls: {{listen: 127.0.0.1:0{extra}}}\napi: {{listen: 127.0.0.1:0}}\nadmin: {{listen: 127.0.0.1:0}}\n"
        );
        let file = dir.write("sluice.yaml", &config);
        let file = file.to_str().unwrap();
        let server = match backend {
            Backend::Memory => Server::start(&["--config", file]),
            Backend::Redis => {
                redis.cli(&["FLUSHALL"]);
                Server::start(&["--config", file, "--redis", &redis.url()])
            }
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Self {
            server,
            runtime,
            _dir: dir,
        }
    }

    fn ask(&self, front: Front, domain: &str, descriptors: &[&[(&str, &str)]]) -> Answer {
        match front {
            Front::Rls => self.ask_rls(domain, descriptors),
            Front::Api => self.ask_api(domain, descriptors),
        }
    }

    fn ask_rls(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> Answer {
        let rls = self.server.rls.expect("rls.listen");
        let request = RateLimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .iter()
                        .map(|(key, value)| Entry {
                            key: (*key).into(),
                            value: (*value).into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        };
        let answer = self.runtime.block_on(async {
            let mut client = RateLimitServiceClient::connect(format!("http://{rls}"))
                .await
                .unwrap();
            client.should_rate_limit(request).await.unwrap().into_inner()
        });
        Answer {
            ok: answer.overall_code == 1,
            codes: answer.statuses.iter().map(|s| s.code == 1).collect(),
            remaining: answer
                .statuses
                .iter()
                .map(|s| u64::from(s.limit_remaining))
                .collect(),
            metadata: answer.dynamic_metadata.as_ref().map(struct_json),
            headers: (answer.response_headers_to_add.iter())
                .map(|h| (h.key.clone(), h.value.clone()))
                .collect(),
        }
    }

    fn ask_api(&self, domain: &str, descriptors: &[&[(&str, &str)]]) -> Answer {
        let mut client = Client::connect(self.server.api.expect("api.listen"));
        let descriptors: Vec<Json> = descriptors
            .iter()
            .map(|entries| {
                let entries: Vec<Json> = entries
                    .iter()
                    .map(|(key, value)| json!({"key": key, "value": value}))
                    .collect();
                json!({ "entries": entries })
            })
            .collect();
        let body = json!({"domain": domain, "descriptors": descriptors}).to_string();
        let response = client.post_json("/v1/check", &body);
        assert_eq!(response.status, 200, "{response:?}");
        let verdict: Json = serde_json::from_str(&response.body).unwrap();
        let statuses = verdict["statuses"].as_array().unwrap();
        Answer {
            ok: verdict["overall_code"] == "OK",
            codes: statuses.iter().map(|s| s["code"] == "OK").collect(),
            remaining: statuses
                .iter()
                .map(|s| s["limit_remaining"].as_u64().unwrap())
                .collect(),
            metadata: verdict.get("dynamic_metadata").cloned(),
            headers: (verdict["headers"].as_array().into_iter().flatten())
                .map(|h| {
                    (
                        h["name"].as_str().unwrap().to_owned(),
                        h["value"].as_str().unwrap().to_owned(),
                    )
                })
                .collect(),
        }
    }
}

impl Service {
    /// The `/metrics` lines of the per-value series.
    fn by_value(&self) -> Vec<String> {
        let mut admin = Client::connect(self.server.admin.expect("admin.listen"));
        let metrics = admin.get("/metrics", &[]).body;
        metrics
            .lines()
            .filter(|line| line.contains("decisions_by_value_total{"))
            .map(str::to_owned)
            .collect()
    }
}

/// The count of the per-value sample with `value` and `outcome`, 0 if there is none.
fn by_value(lines: &[String], value: &str, outcome: &str) -> u64 {
    let (value, outcome) = (format!("value=\"{value}\""), format!("outcome=\"{outcome}\""));
    lines
        .iter()
        .find(|line| line.contains(&value) && line.contains(&outcome))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// A protobuf struct as JSON, read through envoy-types' own message types.
fn struct_json(s: &Struct) -> Json {
    Json::Object(s.fields.iter().map(|(k, v)| (k.clone(), value_json(v))).collect())
}

fn value_json(v: &Value) -> Json {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value_json).collect()),
    }
}

/// Runs `check` on a fresh server for every backend and front end.
fn on_every(files: &[(&str, &str)], extra: &str, check: impl Fn(&Service, Front)) {
    on_every_with(files, extra, "", check);
}

/// [`on_every`], with `top` at the config's top level.
fn on_every_with(files: &[(&str, &str)], extra: &str, top: &str, check: impl Fn(&Service, Front)) {
    let redis = RedisServer::start();
    for backend in [Backend::Memory, Backend::Redis] {
        for front in [Front::Rls, Front::Api] {
            let service = Service::start_with(backend, &redis, files, extra, top);
            eprintln!("{backend:?} over {front:?}");
            check(&service, front);
        }
    }
}

/// Hour-long quotas: nothing refills during a test.
const QUOTA_RULES: &str = "
domain: shop
descriptors:
  - key: service
    value: search
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: service
    value: export
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
";

#[test]
fn quota_mode_denies_only_when_every_quota_descriptor_is_over() {
    on_every(&[("shop.yaml", QUOTA_RULES)], "", |service, front| {
        let both: &[&[(&str, &str)]] = &[&[("service", "search")], &[("service", "export")]];
        let first = service.ask(front, "shop", both);
        assert!(first.ok && first.codes == [true, true], "{first:?}");
        // search is over; export still has one: a quota-mode limit over does not deny alone.
        let second = service.ask(front, "shop", both);
        assert!(second.ok, "{second:?}");
        assert_eq!(second.codes, [false, true], "{second:?}");
        // Both over: denied.
        let third = service.ask(front, "shop", both);
        assert!(!third.ok, "{third:?}");
        assert_eq!(third.codes, [false, false]);
        // One quota-mode descriptor alone, over: every quota-mode limit of the request is over.
        let alone = service.ask(front, "shop", &[&[("service", "search")]]);
        assert!(!alone.ok, "{alone:?}");
        // An ordinary limit over denies whatever the quota-mode ones say.
        let user: &[(&str, &str)] = &[("user", "u")];
        for _ in 0..10 {
            assert!(service.ask(front, "shop", &[user]).ok);
        }
        let mixed = service.ask(front, "shop", &[&[("service", "fresh")], user]);
        assert!(!mixed.ok, "{mixed:?}");
    });
}

#[test]
fn global_quota_mode_makes_every_rule_a_quota() {
    let rules = "
domain: shop
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 3}
";
    on_every(&[("shop.yaml", rules)], ", quota_mode: true", |service, front| {
        let both: &[&[(&str, &str)]] = &[&[("a", "x")], &[("b", "x")]];
        assert!(service.ask(front, "shop", both).ok);
        let second = service.ask(front, "shop", both);
        assert!(second.ok && second.codes == [false, true], "{second:?}");
        let third = service.ask(front, "shop", both);
        assert!(third.ok && third.codes == [false, true], "{third:?}");
        let fourth = service.ask(front, "shop", both);
        assert!(!fourth.ok && fourth.codes == [false, false], "{fourth:?}");
    });
}

#[test]
fn a_shared_wildcard_counts_every_value_on_one_counter_and_a_plain_one_does_not() {
    let rules = "
domain: files
descriptors:
  - key: path
    value: /shared/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /own/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 1}
";
    on_every(&[("files.yaml", rules)], "", |service, front| {
        let ask = |value: &str| service.ask(front, "files", &[&[("path", value)]]).ok;
        assert!(ask("/shared/a"));
        assert!(ask("/shared/b"));
        assert!(!ask("/shared/c"), "the two before used the shared threshold");
        for value in ["/own/a", "/own/a", "/own/b", "/own/b"] {
            assert!(ask(value), "{value}: each value has its own threshold");
        }
        assert!(!ask("/own/a"));
        // A middle wildcard, shared.
        assert!(ask("/api/users/v1"));
        assert!(!ask("/api/orders/v1"));
    });
}

#[test]
fn dynamic_metadata_carries_the_request_and_the_metadata_of_what_passed() {
    let rules = "
domain: shop
descriptors:
  - key: service
    value: search
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata:
      quota: {name: search, tier: 1}
      owner: team-a
  - key: service
    value: export
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
    metadata:
      quota: {name: export, region: eu}
      owner: team-b
      flags: [1, true, null]
";
    on_every(
        &[("shop.yaml", rules)],
        ", dynamic_metadata: true",
        |service, front| {
            let both: &[&[(&str, &str)]] = &[&[("service", "search")], &[("service", "export")]];
            let first = service.ask(front, "shop", both);
            let metadata = first.metadata.clone().expect("dynamic metadata");
            assert_eq!(metadata["domain"], "shop");
            assert_eq!(
                metadata["descriptors"],
                json!([{"entries": ["service=search"]}, {"entries": ["service=export"]}])
            );
            // Both passed: merged in order, the first's value kept where both have one, maps merged.
            assert_eq!(
                metadata["metadata"],
                json!({"quota": {"name": "search", "tier": 1.0, "region": "eu"}, "owner": "team-a", "flags": [1.0, true, null]})
            );
            // search is over now: only export's metadata.
            let second = service.ask(front, "shop", both);
            assert!(second.ok, "{second:?}");
            assert_eq!(
                second.metadata.expect("dynamic metadata")["metadata"],
                json!({"quota": {"name": "export", "region": "eu"}, "owner": "team-b", "flags": [1.0, true, null]})
            );
        },
    );
}

#[test]
fn global_shadow_mode_answers_ok_while_counting_as_if_enforced() {
    let rules = "
domain: edge
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    on_every(&[("edge.yaml", rules)], ", shadow: true", |service, front| {
        let both: &[&[(&str, &str)]] = &[&[("ip", "10.0.0.1")], &[("user", "alice")]];
        for _ in 0..2 {
            assert!(service.ask(front, "edge", both).ok);
        }
        // Over the ip limit: answered OK, the status says over, and (all-or-nothing, as
        // enforced) the user limit kept what it had.
        for _ in 0..3 {
            let over = service.ask(front, "edge", both);
            assert!(over.ok, "{over:?}");
            assert_eq!(over.codes, [false, true], "{over:?}");
            assert_eq!(over.remaining[1], 3, "{over:?}");
        }
    });
}

#[test]
fn merged_domains_answer_from_every_file() {
    let redis = RedisServer::start();
    for backend in [Backend::Memory, Backend::Redis] {
        for front in [Front::Rls, Front::Api] {
            let service = Service::start_with(
                backend,
                &redis,
                &[("a.yaml", IP), ("b.yaml", USER)],
                "",
                "merge_domains: true\n",
            );
            let ask = |key: &str| service.ask(front, "edge", &[&[(key, "v")]]).ok;
            assert!(ask("ip"), "{backend:?} {front:?}");
            assert!(!ask("ip"), "{backend:?} {front:?}: a.yaml's 1/h");
            assert!(ask("user") && ask("user"));
            assert!(!ask("user"), "{backend:?} {front:?}: b.yaml's 2/h");
        }
    }
}

const IP: &str =
    "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
const USER: &str =
    "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/// `sluice serve` on `config` and the rules `files`: its stderr, once it has exited (failed).
fn refused(files: &[(&str, &str)], config: &str) -> String {
    let dir = TempDir::new();
    std::fs::create_dir_all(dir.path().join("rules")).unwrap();
    for (name, text) in files {
        dir.write(&format!("rules/{name}"), text);
    }
    let file = dir.write("sluice.yaml", config);
    let output = sluice()
        .args(["serve", "--config", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!output.status.success(), "started on {files:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn two_files_of_one_domain_are_refused_unless_merged_and_a_key_both_give_always() {
    let config = "rules: rules\napi: {listen: 127.0.0.1:0}\n";
    let stderr = refused(&[("a.yaml", IP), ("b.yaml", USER)], config);
    assert!(
        stderr.contains("a.yaml") && stderr.contains("b.yaml") && stderr.contains("'edge'"),
        "{stderr}"
    );
    let merging = "rules: rules\nmerge_domains: true\napi: {listen: 127.0.0.1:0}\n";
    let stderr = refused(&[("a.yaml", IP), ("b.yaml", IP)], merging);
    assert!(
        stderr.contains("b.yaml") && stderr.contains("a.yaml") && stderr.contains("already given"),
        "{stderr}"
    );
    // A rules service keeps one document per domain: nothing to merge.
    let stderr = refused(&[], "rules: {url: http://127.0.0.1:9}\nmerge_domains: true\n");
    assert!(stderr.contains("merge_domains"), "{stderr}");
}

#[test]
fn value_to_metric_and_detailed_metric_name_the_series_by_the_requests_values() {
    let rules = "
domain: api
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: team
    value_to_metric: true
    descriptors:
      - key: path
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: route
    value: /v1/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
";
    on_every(&[("api.yaml", rules)], "", |service, front| {
        let ask = |entries: &[(&str, &str)]| service.ask(front, "api", &[entries]).ok;
        assert!(ask(&[("user", "alice"), ("path", "/a")]));
        assert!(!ask(&[("user", "alice"), ("path", "/a")]));
        assert!(ask(&[("user", "bob"), ("path", "/a")]));
        assert!(ask(&[("team", "red"), ("path", "/x")]));
        assert!(ask(&[("route", "/v1/users"), ("method", "GET")]));
        assert!(ask(&[("route", "/v1/orders"), ("method", "GET")]));
        assert!(ask(&[("plain", "p")]));
        let lines = service.by_value();
        // value_to_metric on the user level: the user's value; the path level is a key alone.
        assert_eq!(by_value(&lines, "user_alice.path", "allowed"), 1, "{lines:#?}");
        assert_eq!(by_value(&lines, "user_alice.path", "denied"), 1, "{lines:#?}");
        assert_eq!(by_value(&lines, "user_bob.path", "allowed"), 1, "{lines:#?}");
        // detailed_metric names every value.
        assert_eq!(by_value(&lines, "team_red.path_/x", "allowed"), 1, "{lines:#?}");
        // A shared wildcard is named by the wildcard, whatever value_to_metric and
        // detailed_metric say.
        assert_eq!(
            by_value(&lines, "route_/v1/*.method_GET", "allowed"),
            2,
            "{lines:#?}"
        );
        assert!(!lines.iter().any(|line| line.contains("plain")), "{lines:#?}");
    });
}

#[test]
fn a_rule_keeps_at_most_its_bound_of_value_series() {
    let rules = "domain: api\ndescriptors:\n  - key: user\n    value_to_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";
    let redis = RedisServer::start();
    let service = Service::start(Backend::Memory, &redis, &[("api.yaml", rules)], "");
    for i in 0..sluice_service::MAX_LABELS + 40 {
        let user = format!("u{i}");
        assert!(service.ask(Front::Api, "api", &[&[("user", user.as_str())]]).ok);
    }
    let lines = service.by_value();
    let allowed = lines
        .iter()
        .filter(|line| line.contains("outcome=\"allowed\""))
        .count();
    assert_eq!(allowed, sluice_service::MAX_LABELS);
}

/// envoy ratelimit's service on hour-long fixed windows, as far as its answer's fields go:
/// every descriptor counted on its own (over the limit included), each status's remaining,
/// and the three fields of the status it picks.
struct EnvoyModel {
    limits: Vec<(&'static str, u64, bool)>,
    used: std::collections::HashMap<&'static str, u64>,
}

impl EnvoyModel {
    /// `(limit, remaining)` of the fields, and the overall answer.
    fn ask(&mut self, keys: &[&'static str]) -> (bool, Option<(u64, u64)>) {
        let (mut chosen, mut least) = (None, u64::from(u32::MAX));
        let (mut ordinary_over, mut quota, mut quota_over) = (false, 0, 0);
        for key in keys {
            let (_, limit, quota_mode) = *self.limits.iter().find(|(k, _, _)| k == key).unwrap();
            let used = self.used.entry(key).or_default();
            *used += 1;
            let over = *used > limit;
            let remaining = limit.saturating_sub(*used);
            if remaining < least {
                (chosen, least) = (Some((limit, remaining)), remaining);
            }
            quota += u32::from(quota_mode);
            if over && quota_mode {
                quota_over += 1;
            } else if over {
                ordinary_over = true;
                (chosen, least) = (Some((limit, 0)), 0);
            }
        }
        let denied = ordinary_over || (quota > 0 && quota == quota_over);
        (!denied, chosen)
    }
}

#[test]
fn envoy_fields_name_and_count_as_envoy_ratelimit_writes_them() {
    let rules = "
domain: edge
descriptors:
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: q
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
";
    let script: [&[&'static str]; 9] = [
        &["a", "b"],
        &["b"],
        &["a", "b", "q"],
        &["q"],
        &["q", "b"],
        &["a", "b"],
        &["b", "a"],
        &["q", "a"],
        &["b"],
    ];
    // Counted as envoy's service counts: each descriptor on its own.
    let top = "counting: independent\n";
    on_every_with(
        &[("edge.yaml", rules)],
        ", headers: envoy",
        top,
        |service, front| {
            let mut model = EnvoyModel {
                limits: vec![("a", 3, false), ("b", 5, false), ("q", 2, true)],
                used: Default::default(),
            };
            for keys in script {
                let descriptors: Vec<[(&str, &str); 1]> = keys.iter().map(|k| [(*k, "v")]).collect();
                let descriptors: Vec<&[(&str, &str)]> = descriptors.iter().map(|d| &d[..]).collect();
                let answer = service.ask(front, "edge", &descriptors);
                let (ok, fields) = model.ask(keys);
                assert_eq!(answer.ok, ok, "{keys:?}: {answer:?}");
                let (limit, remaining) = fields.unwrap();
                let names: Vec<&str> = answer.headers.iter().map(|(n, _)| n.as_str()).collect();
                assert_eq!(
                    names,
                    ["RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"],
                    "{keys:?}"
                );
                assert_eq!(answer.headers[0].1, limit.to_string(), "{keys:?}: {answer:?}");
                assert_eq!(answer.headers[1].1, remaining.to_string(), "{keys:?}: {answer:?}");
                let reset: u64 = answer.headers[2].1.parse().unwrap();
                assert!((1..=3600).contains(&reset), "{keys:?}: {answer:?}");
            }
        },
    );
}
