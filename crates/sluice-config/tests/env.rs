//! Settings from the environment: the table of keys is the config's schema (read off the
//! reader's own list of fields), each key set by its variable changes the settings, and the
//! environment wins over the file.

use std::collections::{BTreeSet, HashMap};

use sluice_config::{ENV_KEYS, env_name, parse_with_env};

/// The fields the reader knows at `section` ("" for the top), from its refusal of an unknown
/// one (`unknown field ..., expected one of `a`, `b``).
fn fields(section: &str) -> Vec<String> {
    let text = if section.is_empty() {
        "zz_unknown: 1\n".to_string()
    } else {
        format!("{section}: {{zz_unknown: 1}}\n")
    };
    let e = parse_with_env(&text, None, &|_| None).unwrap_err();
    let (_, expected) = e.message.split_once("expected").unwrap_or_else(|| panic!("{e}"));
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_key_of_the_schema_has_a_variable_and_no_variable_names_nothing() {
    let sections = [
        "key",
        "redis",
        "rls",
        "api",
        "admin",
        "rules",
        "otlp",
        "metrics",
        "charge_from",
        "upstream",
    ];
    let mut schema = BTreeSet::new();
    for field in fields("") {
        // A section is set key by key; `rules` is a path too, `upstream` a URL.
        if !sections.contains(&field.as_str()) || field == "rules" || field == "upstream" {
            schema.insert(field);
        }
    }
    for section in sections {
        for field in fields(section) {
            schema.insert(format!("{section}.{field}"));
        }
    }
    let table: BTreeSet<String> = ENV_KEYS.iter().map(|k| k.to_string()).collect();
    assert_eq!(table, schema);
    // No two keys share a variable.
    let names: BTreeSet<String> = ENV_KEYS.iter().map(|k| env_name(k)).collect();
    assert_eq!(names.len(), ENV_KEYS.len());
}

/// The settings of `file` with `env` as the environment, as text to compare.
fn settings(file: &str, env: &[(&str, &str)]) -> Result<String, sluice_config::ConfigError> {
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (env_name(k), v.to_string())).collect();
    parse_with_env(file, None, &|name| env.get(name).cloned()).map(|(settings, _)| format!("{settings:?}"))
}

/// The keys a case needs set beside its own.
type Beside<'a> = &'a [(&'a str, &'a str)];

#[test]
fn each_variable_sets_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("edge.yaml");
    std::fs::write(&rules, "domain: edge\ndescriptors: []\n").unwrap();
    let rules = rules.to_str().unwrap().to_owned();
    let url = [("rules.url", "http://127.0.0.1:9")];
    let redis = [("redis.url", "redis://127.0.0.1:1")];
    let file = [("rules", rules.as_str())];
    // The TLS files are read by the binary; the config only checks they can be read.
    let pem = dir.path().join("any.pem");
    std::fs::write(&pem, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let tls = format!("{{cert: {0}, key: {0}}}", pem.display());
    let tls_ca = format!("{{ca: {}}}", pem.display());
    let admin = [("admin.listen", "127.0.0.1:0")];
    let api = [("rules.url", "http://127.0.0.1:9"), ("api.listen", "127.0.0.1:0")];
    let rls = [("rules.url", "http://127.0.0.1:9"), ("rls.listen", "127.0.0.1:0")];
    let otlp = [("otlp.endpoint", "http://127.0.0.1:4317")];
    let charging = [("charge_from.header", "x-usage"), ("charge_from.max", "5")];
    let upstream = [("upstream", "http://127.0.0.1:3000")];
    // Each key, a value other than its default, and what it needs beside it.
    let cases: Vec<(&str, &str, Beside)> = vec![
        ("listen", "127.0.0.1:9999", &[]),
        ("tls", tls.as_str(), &[]),
        ("client_tls", "{}", &[]),
        ("admin.tls", tls.as_str(), &admin),
        ("api.tls", tls.as_str(), &api),
        ("rls.tls", tls.as_str(), &url),
        ("idle_timeout", "7s", &[]),
        ("drain_delay", "1s", &[]),
        ("shutdown_timeout", "3s", &[]),
        ("max_connections", "77", &[]),
        ("max_header_bytes", "9000", &[]),
        ("max_headers", "50", &[]),
        ("key.from", "[header:X-Who]", &[]),
        ("key.default", "nobody", &[]),
        ("key.max_length", "64", &[]),
        ("trusted_proxies", "[10.0.0.0/8]", &[]),
        ("client_ip_header", "x-real-ip", &[]),
        ("ipv6_prefix", "48", &[]),
        ("algorithm", "fixed_window", &[]),
        ("burst", "5", &[("accounts", "{alice: 1/s}")]),
        ("failsafe", "3/s", &[]),
        ("failsafe_pool", "100/s", &[]),
        ("unknown", "1/s", &[]),
        ("fetch_latency", "1ms", &[]),
        ("fetch_timeout", "2s", &[]),
        ("refresh", "5s", &[]),
        ("capacity", "1000", &[]),
        ("headers", "false", &[]),
        ("bypass", "[x]", &[]),
        ("on_excess", "wait", &[]),
        ("max_wait", "1s", &[("on_excess", "wait")]),
        ("queue_limit", "5", &[("on_excess", "wait")]),
        ("queue_order", "newest_first", &[("on_excess", "wait")]),
        ("max_waiters", "100", &[]),
        ("accounts", "{alice: 1/s}", &[]),
        ("accounts_url", "http://127.0.0.1:9/q/{key}", &[]),
        ("costs", "[{path: /x, cost: 2}]", &[]),
        ("charge_from.header", "x-tokens", &charging),
        ("charge_from.max", "9", &charging),
        ("charge_from.strip", "true", &charging),
        ("upstream", "http://127.0.0.1:3000", &[]),
        ("upstream.url", "http://127.0.0.1:3000", &[]),
        (
            "upstream.routes",
            "[{prefix: /api/, url: 'http://127.0.0.1:3001'}]",
            &[],
        ),
        ("upstream.host", "upstream", &upstream),
        ("upstream.connect_timeout", "1s", &upstream),
        ("upstream.head_timeout", "5s", &upstream),
        ("upstream.idle_timeout", "7s", &upstream),
        ("upstream.max_idle", "0", &upstream),
        ("redis.url", "redis://127.0.0.1:1", &[]),
        ("redis.cluster", "[redis://127.0.0.1:1]", &[]),
        ("redis.policy", "fail_closed", &redis),
        ("redis.hosts", "2", &redis),
        ("redis.timeout", "1s", &redis),
        ("redis.degrade_after", "7", &redis),
        ("redis.prefix", "p", &redis),
        ("redis.tls", &tls_ca, &redis),
        ("rules", rules.as_str(), &[]),
        ("rules.url", "http://127.0.0.1:9", &[]),
        ("rules.poll", "3s", &url),
        ("rules.timeout", "1s", &url),
        ("rules.token", "t0ken", &url),
        ("rules.snapshot", "/tmp/sluice-snapshot.json", &url),
        ("rls.listen", "127.0.0.1:0", &url),
        ("rls.headers", "draft", &url),
        ("rls.shadow", "true", &url),
        ("rls.quota_mode", "true", &url),
        ("rls.dynamic_metadata", "true", &url),
        ("rls.rlqs", "true", &rls),
        ("rls.rlqs_servers", "3", &rls),
        ("api.listen", "127.0.0.1:0", &url),
        ("counting", "independent", &url),
        ("merge_domains", "true", &file),
        ("admin.listen", "127.0.0.1:0", &[]),
        ("denied_log", "3", &[]),
        ("otlp.endpoint", "http://127.0.0.1:4317", &[]),
        ("otlp.sample_ratio", "0.5", &otlp),
        ("otlp.keys", "true", &otlp),
        ("metrics.per_rule", "false", &[]),
    ];
    let covered: BTreeSet<&str> = cases.iter().map(|(key, _, _)| *key).collect();
    assert_eq!(covered, ENV_KEYS.iter().copied().collect::<BTreeSet<_>>());
    for (key, value, beside) in cases {
        let without = settings("{}\n", beside).unwrap_or_else(|e| panic!("{key}: {e}"));
        let mut env = beside.to_vec();
        env.push((key, value));
        let with = settings("{}\n", &env).unwrap_or_else(|e| panic!("{} = {value:?}: {e}", env_name(key)));
        assert_ne!(with, without, "{} changed nothing", env_name(key));
    }
}

#[test]
fn the_environment_wins_over_the_file_and_a_bad_value_names_its_variable() {
    let file = "listen: 127.0.0.1:1111\nredis: {url: 'redis://10.0.0.1:6379', timeout: 2s}\n";
    let from_file = settings(file, &[]).unwrap();
    assert!(from_file.contains("127.0.0.1:1111"));
    let both = settings(file, &[("listen", "127.0.0.1:2222"), ("redis.prefix", "env")]).unwrap();
    assert!(
        both.contains("127.0.0.1:2222") && !both.contains("127.0.0.1:1111"),
        "{both}"
    );
    // A key the environment sets beside the file's keys of one section keeps the others.
    assert!(
        both.contains("10.0.0.1:6379") && both.contains("\"env\""),
        "{both}"
    );
    let e = settings(file, &[("idle_timeout", "forever")]).unwrap_err();
    assert_eq!(e.field, "idle_timeout");
    assert!(e.message.contains("SLUICE_IDLE_TIMEOUT"), "{e}");
    let e = settings("{}\n", &[("accounts", "{alice: [")]).unwrap_err();
    assert!(e.message.contains("SLUICE_ACCOUNTS"), "{e}");
}

#[test]
fn a_value_can_come_from_a_file_as_secrets_are_mounted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("url");
    // The line break a file usually ends with is not part of the value.
    std::fs::write(&file, "http://10.1.2.3:9/q/{key}\n").unwrap();
    let env: HashMap<&str, String> =
        [("SLUICE_ACCOUNTS_URL_FILE", file.to_str().unwrap().to_string())].into();
    let (settings, from) = parse_with_env("{}\n", None, &|name| env.get(name).cloned()).unwrap();
    assert!(format!("{settings:?}").contains("10.1.2.3:9"), "{settings:?}");
    assert_eq!(from[0].variable, "SLUICE_ACCOUNTS_URL_FILE");
    // The rules token, the secret it is meant for.
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let env: HashMap<&str, String> = [
        ("SLUICE_RULES_URL", "http://127.0.0.1:9".to_string()),
        ("SLUICE_RULES_TOKEN_FILE", token.to_str().unwrap().to_string()),
    ]
    .into();
    let (settings, from) = parse_with_env("{}\n", None, &|name| env.get(name).cloned()).unwrap();
    assert!(settings.service.is_some());
    assert!(
        from.iter()
            .any(|f| f.path == "rules.token" && f.variable == "SLUICE_RULES_TOKEN_FILE")
    );
    // Both forms at once, or a file that cannot be read: refused by name.
    let both: HashMap<&str, &str> = [("SLUICE_RULES_TOKEN", "a"), ("SLUICE_RULES_TOKEN_FILE", "/x")].into();
    let e = parse_with_env("{}\n", None, &|name| both.get(name).map(|v| v.to_string())).unwrap_err();
    assert!(e.message.contains("give one"), "{e}");
    let missing: HashMap<&str, &str> = [("SLUICE_LISTEN_FILE", "/nonexistent/listen")].into();
    let e = parse_with_env("{}\n", None, &|name| missing.get(name).map(|v| v.to_string())).unwrap_err();
    assert_eq!(e.field, "listen");
    assert!(e.message.contains("SLUICE_LISTEN_FILE"), "{e}");
}

#[test]
fn the_standard_otel_variable_sets_the_collector_unless_sluices_own_does() {
    let read = |env: &[(&str, &str)]| {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (settings, _) = parse_with_env("{}\n", None, &|name| env.get(name).cloned()).unwrap();
        settings.otlp.map(|otlp| otlp.endpoint)
    };
    assert_eq!(read(&[]), None);
    let standard = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317");
    assert_eq!(read(&[standard]).as_deref(), Some("http://collector:4317"));
    // The traces-only variable is more specific than the general one.
    let traces = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317");
    assert_eq!(read(&[standard, traces]).as_deref(), Some("http://traces:4317"));
    let own = ("SLUICE_OTLP_ENDPOINT", "http://own:4317");
    assert_eq!(read(&[standard, own]).as_deref(), Some("http://own:4317"));
    // A bad one names the variable it came from.
    let env: HashMap<String, String> = [(
        "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
        "collector:4317".to_string(),
    )]
    .into();
    let e = parse_with_env("{}\n", None, &|name| env.get(name).cloned()).unwrap_err();
    assert!(e.to_string().contains("otlp.endpoint"), "{e}");
}

/// The upstream of `file` with `env` as the environment.
fn upstream(file: &str, env: &[(&str, &str)]) -> sluice_config::UpstreamSettings {
    let env: HashMap<String, String> = env.iter().map(|(k, v)| (env_name(k), v.to_string())).collect();
    let (settings, _) = parse_with_env(file, None, &|name| env.get(name).cloned()).unwrap();
    settings.upstream.expect("an upstream")
}

#[test]
fn a_variable_setting_a_key_of_the_upstream_shorthand_keeps_its_url() {
    use std::time::Duration;
    let file = "upstream: http://a:1\n";
    let s = upstream(file, &[("upstream.head_timeout", "5s")]);
    assert_eq!(s.default.unwrap().to_string(), "http://a:1");
    assert_eq!(s.head_timeout, Duration::from_secs(5));
    // As if the file had given the map.
    let env = [
        ("upstream.routes", "[{prefix: /api/, url: 'http://b:2'}]"),
        ("upstream.max_idle", "3"),
    ];
    assert_eq!(
        upstream(file, &env),
        upstream("upstream: {url: 'http://a:1'}\n", &env)
    );
    // The shorthand from the environment, and keys beside it.
    let s = upstream(
        "{}\n",
        &[("upstream", "https://c"), ("upstream.host", "upstream")],
    );
    assert_eq!(s.default.unwrap().to_string(), "https://c:443");
    assert_eq!(s.host, sluice_config::HostHeader::Upstream);
    // `SLUICE_UPSTREAM_URL` replaces the shorthand's URL; `SLUICE_UPSTREAM` the whole section.
    let s = upstream(file, &[("upstream.url", "http://d:4")]);
    assert_eq!(s.default.unwrap().to_string(), "http://d:4");
    let map = "upstream: {url: 'http://a:1', head_timeout: 9s, routes: [{prefix: /x, url: 'http://x'}]}\n";
    let s = upstream(map, &[("upstream", "http://e:5")]);
    assert_eq!(s.default.unwrap().to_string(), "http://e:5");
    assert_eq!((s.head_timeout, s.routes.len()), (Duration::from_secs(60), 0));
    // A key of the file's map kept beside the one the environment sets.
    let s = upstream(map, &[("upstream.idle_timeout", "2s")]);
    assert_eq!(
        (s.head_timeout, s.idle_timeout, s.routes.len()),
        (Duration::from_secs(9), Duration::from_secs(2), 1)
    );
    // `rules: PATH` is no shorthand: a key of `rules` set by a variable replaces the path.
    let e = settings("rules: limits.yaml\n", &[("rules.poll", "3s")]).unwrap_err();
    assert_eq!(e.field, "rules");
    assert!(e.message.contains("missing field `url`"), "{e}");
}

#[test]
fn a_bad_upstream_value_names_the_variable_that_gave_it() {
    let e = settings("upstream: http://a:1\n", &[("upstream.connect_timeout", "0s")]).unwrap_err();
    assert_eq!(e.field, "upstream.connect_timeout");
    assert!(e.message.contains("SLUICE_UPSTREAM_CONNECT_TIMEOUT"), "{e}");
    // The file's own mistake is not blamed on a variable.
    let e = settings("upstream: http://a:1/app\n", &[("upstream.max_idle", "1")]).unwrap_err();
    assert_eq!(e.field, "upstream.url");
    assert!(!e.message.contains("SLUICE_"), "{e}");
    // Inside a list set whole, by the variable that set it rather than the section's.
    let env = [
        ("upstream", "http://a:1"),
        ("upstream.routes", "[{prefix: api, url: 'http://b'}]"),
    ];
    let e = settings("{}\n", &env).unwrap_err();
    assert_eq!(e.field, "upstream.routes[0].prefix");
    assert!(e.message.contains("(from SLUICE_UPSTREAM_ROUTES)"), "{e}");
    let e = settings("{}\n", &[("upstream", "ftp://a")]).unwrap_err();
    assert_eq!(e.field, "upstream.url");
    assert!(e.message.contains("(from SLUICE_UPSTREAM)"), "{e}");
    let e = settings("{}\n", &[("costs", "[{path: api, cost: 2}]")]).unwrap_err();
    assert_eq!(e.field, "costs[0].path");
    assert!(e.message.contains("(from SLUICE_COSTS)"), "{e}");
}
