//! Every fuzz target's check, on bounded proptest inputs: arbitrary bytes, and text shaped
//! like what each parser expects so the deeper paths are reached too.

use proptest::prelude::*;
use proptest::sample::select;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

/// Lines joined by `\n`, after some leading choice bytes.
fn with_lines(
    choices: usize,
    line: impl Strategy<Value = String>,
    max_lines: usize,
) -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), choices),
        proptest::collection::vec(line, 0..max_lines),
    )
        .prop_map(|(mut head, lines)| {
            head.extend_from_slice(lines.join("\n").as_bytes());
            head
        })
}

fn hop() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}\\.[0-9]{1,3}(:[0-9]{1,6})?",
        "(10\\.0\\.0\\.[0-9]|192\\.0\\.2\\.[0-9]|198\\.51\\.100\\.[0-9]|::1|::ffff:10\\.1\\.1\\.1)",
        "\\[?2001:db[89]::[0-9a-f]{1,4}\\]?(:[0-9]{1,5}|:_[a-z]{1,3})?",
        "(unknown|UNKNOWN|_[a-z0-9._-]{0,4})(:[0-9]{1,2})?",
        "[ -~]{0,6}",
    ]
}

fn forwarded_element() -> impl Strategy<Value = String> {
    (
        hop(),
        select(vec!["for=", "For=\"", "by=", "proto=https;for=", "for=\"[", ""]),
        select(vec![
            "",
            "\"",
            "]\"",
            ";proto=http",
            ";for=10.0.0.1",
            " ; host=\"a,b\"",
        ]),
    )
        .prop_map(|(hop, before, after)| format!("{before}{hop}{after}"))
}

fn hop_line() -> impl Strategy<Value = String> {
    let separator = select(vec![", ", ",", " , ", ",,", ";"]);
    prop_oneof![
        (proptest::collection::vec(hop(), 0..4), separator.clone()).prop_map(|(h, s)| h.join(s)),
        (proptest::collection::vec(forwarded_element(), 0..4), separator).prop_map(|(h, s)| h.join(s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn quota_bytes(data in bytes(48)) {
        sluice_invariants::quota(&data);
    }

    #[test]
    fn quota_text(
        text in "[ ]?[0-9]{0,21}(\\.[0-9]{0,20})?[ ]?(/[ ]?[0-9]{0,21})?[ ]?(ns|us|µs|ms|s|sec|m|min|h|hr|d|day|days|x)?( burst [0-9]{0,21})?[ ]?"
    ) {
        sluice_invariants::quota(text.as_bytes());
    }

    #[test]
    fn client_ip_bytes(data in bytes(96)) {
        sluice_invariants::client_ip(&data);
    }

    #[test]
    fn client_ip_hops(data in with_lines(3, hop_line(), 4)) {
        sluice_invariants::client_ip(&data);
    }

    #[test]
    fn key_bytes(data in bytes(128)) {
        sluice_invariants::key(&data);
    }

    #[test]
    fn key_headers(data in with_lines(6, (any::<u8>(), prop_oneof![hop_line(), "[ -~]{0,12}", "[a|\\\\ ]{0,6}"]).prop_map(|(tag, v)| format!("{}{v}", char::from(tag % 0x80).escape_default().next().unwrap_or('a'))), 6)) {
        sluice_invariants::key(&data);
    }

    #[test]
    fn route_cost_bytes(data in bytes(64)) {
        sluice_invariants::route_cost(&data);
    }

    #[test]
    fn route_cost_paths(
        choices in proptest::collection::vec(any::<u8>(), 2),
        path in "(/{1,2}(\\.|\\.\\.|%2[eE]|%2[eE]%2[eE]|%[0-9a-fA-F]{2}|%[0-9a-fA-F]?|[a-z]{1,3}|export|caf%[cC]3%[aA]9|\\\\|é|;x=1|))*/?",
    ) {
        let mut data = choices;
        data.extend_from_slice(path.as_bytes());
        sluice_invariants::route_cost(&data);
    }
}

fn yaml_line() -> impl Strategy<Value = String> {
    let field = select(vec![
        "listen",
        "idle_timeout",
        "key",
        "trusted_proxies",
        "client_ip_header",
        "ipv6_prefix",
        "algorithm",
        "burst",
        "failsafe",
        "unknown",
        "fetch_latency",
        "refresh",
        "capacity",
        "headers",
        "bypass",
        "accounts",
        "costs",
        "redis",
    ]);
    let value = prop_oneof![
        "-?[0-9]{1,4}",
        "[0-9]{1,3}(\\.[0-9])?/(s|min|h|10s)( burst [0-9]{1,3})?",
        "[0-9]{1,3}(ms|s|min)",
        "\\{from: \\[(ip|bearer|header:X-A|cookie)(, ip)?\\], max_length: [0-9]{1,4}(, default: [a-z]{0,3})?\\}",
        "\\[(10\\.0\\.0\\.0/8|::1|[0-9./:]{0,12})\\]",
        "(x-forwarded-for|forwarded|x-real-ip|X-Real-IP|via)",
        "(token_bucket|leaky_bucket|fixed_window|sliding_window_log|sliding_window_counter|magic)",
        "\\{a: [0-9]/s, b: [0-9]/min( burst [0-9])?\\}",
        "\\[\\{path: /[a-z%0-9./\\\\]{0,8}, cost: [0-9]( , method: (GET|post|B@D))?\\}\\]",
        "\\{url: redis://h, policy: (fail_open|retry), hosts: [0-9]\\}",
        "(true|false|null|~|\\[\\]|\\{\\})",
        "127\\.0\\.0\\.1:[0-9]{1,5}",
        "[ -~]{0,10}",
    ];
    (field, value).prop_map(|(field, value)| format!("{field}: {value}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn config_bytes(data in bytes(160)) {
        sluice_invariants::config(&data);
    }

    #[test]
    fn config_fields(lines in proptest::collection::vec(yaml_line(), 0..6)) {
        sluice_invariants::config(lines.join("\n").as_bytes());
    }
}

#[test]
fn the_shipped_configs_hold() {
    sluice_invariants::config(sluice_config::DEFAULT_CONFIG.as_bytes());
    sluice_invariants::config(b"");
}

// The network ports: each decoder on arbitrary bytes, and on messages and bodies shaped like
// what the port expects (the small rules table's keys and values, overrides, hits at the
// edges, a rules file's fields), so the answers are reached and not only the refusals.

fn descriptor_key() -> impl Strategy<Value = String> {
    select(vec!["user", "path", "ip", "free", "plan", "x", ""]).prop_map(str::to_owned)
}

fn descriptor_value() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "al",
            "/login",
            "/api",
            "/api/users",
            "/ap",
            "gold",
            "",
            "10.0.0.1"
        ])
        .prop_map(str::to_owned),
        "[ -~]{0,6}",
        (1000usize..1100).prop_map(|n| "v".repeat(n)),
    ]
}

fn hits_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        select(vec![
            0u64,
            1,
            2,
            3,
            5,
            100,
            101,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX
        ]),
        any::<u64>(),
    ]
}

fn rls_request() -> impl Strategy<Value = Vec<u8>> {
    use prost::Message;
    use sluice_service::proto::{
        Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest, UInt64Value,
    };
    let entry = (descriptor_key(), descriptor_value()).prop_map(|(key, value)| Entry { key, value });
    let limit = (
        prop_oneof![select(vec![0u32, 1, 2, 3, 100, u32::MAX]), any::<u32>()],
        prop_oneof![0i32..9, any::<i32>()],
    )
        .prop_map(|(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit,
        });
    let descriptor = (
        proptest::collection::vec(entry, 0..4),
        proptest::option::weighted(0.3, limit),
        proptest::option::weighted(0.3, hits_value()),
        proptest::bool::weighted(0.03),
    )
        .prop_map(|(entries, limit, hits, is_negative_hits)| RateLimitDescriptor {
            entries,
            limit,
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits,
        })
        .boxed();
    let domain = select(vec!["edge", "edge", "edge", "", "other"]).prop_map(str::to_owned);
    let count = prop_oneof![8 => 0usize..6, 1 => 60usize..70];
    (
        domain,
        count.prop_flat_map(move |n| proptest::collection::vec(descriptor.clone(), n..=n)),
        prop_oneof![select(vec![0u32, 1, 2, 4, u32::MAX]), any::<u32>()],
        proptest::collection::vec(any::<u8>(), 0..3),
    )
        .prop_map(|(domain, descriptors, hits_addend, tail)| {
            let mut bytes = RateLimitRequest {
                domain,
                descriptors,
                hits_addend,
            }
            .encode_to_vec();
            // Now and then a field of another number or a torn end.
            bytes.extend(tail);
            bytes
        })
}

fn check_body() -> impl Strategy<Value = Vec<u8>> {
    let entry = (descriptor_key(), descriptor_value())
        .prop_map(|(key, value)| serde_json::json!({"key": key, "value": value}));
    let limit = prop_oneof![
        select(vec![
            "2/min",
            "0/s",
            "1/s burst 3",
            "18446744073709551615/ns",
            "1.5/h",
            "x"
        ])
        .prop_map(str::to_owned),
        "[0-9]{1,3}/(s|min|h)( burst [0-9]{1,2})?",
    ];
    let descriptor = (
        proptest::collection::vec(entry, 0..4),
        proptest::option::weighted(0.3, limit),
        proptest::option::weighted(0.3, hits_value()),
    )
        .prop_map(|(entries, limit, hits)| {
            let mut d = serde_json::json!({"entries": entries});
            if let Some(limit) = limit {
                d["limit"] = limit.into();
            }
            if let Some(hits) = hits {
                d["hits"] = hits.into();
            }
            d
        });
    (
        select(vec!["edge", "edge", "", "other"]),
        proptest::collection::vec(descriptor, 0..6),
        proptest::option::weighted(0.3, hits_value()),
        any::<bool>(),
        select(vec!["", "", "", ", \"extra\": 1", ", \"hits\": -1"]),
    )
        .prop_map(|(domain, descriptors, hits, peek, extra)| {
            let mut body = serde_json::json!({"domain": domain, "descriptors": descriptors, "peek": peek});
            if let Some(hits) = hits {
                body["hits"] = hits.into();
            }
            let mut text = body.to_string();
            text.pop();
            format!("{text}{extra}}}").into_bytes()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn rls_bytes(data in bytes(160)) {
        sluice_invariants::rls(&data);
    }

    #[test]
    fn rls_requests(data in rls_request()) {
        sluice_invariants::rls(&data);
    }

    #[test]
    fn check_api_bytes(data in bytes(160)) {
        sluice_invariants::check_api(&data);
    }

    #[test]
    fn check_api_bodies(data in check_body()) {
        sluice_invariants::check_api(&data);
    }
}

/// A YAML scalar as a rules file might hold one, including those a YAML reader may take for
/// another type (numbers, booleans, null) and the separators of a rule's place.
fn yaml_scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "k",
            "ip",
            "/api*",
            "a*b",
            "*",
            "v",
            "1e3",
            "0x10",
            "010",
            "1.0",
            "-0",
            ".nan",
            "yes",
            "on",
            "~",
            "null",
            "\"quoted\"",
            "'x''y'",
            "\"a\\u001fb\"",
            "\"\\\\\"",
            "&a k",
            "*a",
            "!!str 5",
            "[]",
            "{}",
        ])
        .prop_map(str::to_owned),
        "[a-z*/]{1,5}",
    ]
}

fn rate_limit() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        (
            select(vec![
                "second",
                "minute",
                "hour",
                "day",
                "week",
                "month",
                "year",
                "fortnight"
            ]),
            0u64..5
        )
            .prop_map(|(unit, n)| format!("unit: {unit}, requests_per_unit: {n}")),
        select(vec![
            "1/s",
            "1.5/min burst 3",
            "0/s",
            "18446744073709551615/ns burst 1",
            "x"
        ])
        .prop_map(|q| format!("quota: \"{q}\"")),
        Just("unlimited: true".to_owned()),
        Just("requests_per_unit: 4294967296, unit: second".to_owned()),
    ];
    (
        field,
        proptest::option::weighted(0.4, select(vec!["a", "b", "per_user"])),
        proptest::option::weighted(0.2, select(vec!["a", "b", "per_user", "none"])),
        proptest::option::weighted(
            0.3,
            select(vec!["token_bucket", "fixed_window", "sliding_window_log", "gcra"]),
        ),
    )
        .prop_map(|(field, name, replaces, algorithm)| {
            let mut text = format!("{{{field}");
            if let Some(name) = name {
                text.push_str(&format!(", name: {name}"));
            }
            if let Some(replaced) = replaces {
                text.push_str(&format!(", replaces: [{{name: {replaced}}}]"));
            }
            if let Some(algorithm) = algorithm {
                text.push_str(&format!(", algorithm: {algorithm}"));
            }
            text.push('}');
            text
        })
}

/// A rules file's descriptors, nested a few levels, as YAML at `indent`.
fn yaml_descriptors(depth: u32) -> BoxedStrategy<String> {
    let one = || {
        (
            yaml_scalar(),
            proptest::option::weighted(0.6, yaml_scalar()),
            proptest::option::weighted(0.7, rate_limit()),
            descriptor_flag(),
        )
    };
    let leaf = one().prop_map(|(key, value, limit, flag)| descriptor_yaml(&key, value, limit, flag, &[]));
    let leaves = proptest::collection::vec(leaf, 0..4)
        .prop_map(|d| d.concat())
        .boxed();
    if depth == 0 {
        return leaves;
    }
    let inner = yaml_descriptors(depth - 1);
    let node =
        (one(), proptest::collection::vec(inner, 0..2)).prop_map(|((key, value, limit, flag), children)| {
            descriptor_yaml(&key, value, limit, flag, &children)
        });
    proptest::collection::vec(node, 0..4)
        .prop_map(|d| d.concat())
        .boxed()
}

/// One of envoy ratelimit's descriptor flags (or none), as a line of YAML.
fn descriptor_flag() -> impl Strategy<Value = &'static str> {
    select(vec![
        "",
        "",
        "",
        "",
        "shadow_mode: true",
        "quota_mode: true",
        "share_threshold: true",
        "value_to_metric: true",
        "detailed_metric: true",
        "metadata: {a: [1, {b: x}], 2: null}",
        "metadata: [not, a, map]",
        "metadata: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: {a: 1}}}}}}}}}}}}}}}}}",
    ])
}

fn descriptor_yaml(
    key: &str,
    value: Option<String>,
    limit: Option<String>,
    flag: &str,
    children: &[String],
) -> String {
    let mut text = format!("- key: {key}\n");
    if let Some(value) = value {
        text.push_str(&format!("  value: {value}\n"));
    }
    if let Some(limit) = limit {
        text.push_str(&format!("  rate_limit: {limit}\n"));
    }
    if !flag.is_empty() {
        text.push_str(&format!("  {flag}\n"));
    }
    let children = children.concat();
    if !children.is_empty() {
        text.push_str("  descriptors:\n");
        for line in children.lines() {
            text.push_str(&format!("    {line}\n"));
        }
    }
    text
}

fn rules_file(domain: &'static str) -> impl Strategy<Value = String> {
    (
        select(vec![domain, domain, domain, "other", "\"\""]),
        yaml_descriptors(2),
    )
        .prop_map(|(domain, descriptors)| {
            let mut text = format!("domain: {domain}\ndescriptors:\n");
            for line in descriptors.lines() {
                text.push_str(&format!("  {line}\n"));
            }
            text
        })
}

fn pointer() -> impl Strategy<Value = String> {
    let token = select(vec![
        "descriptors",
        "0",
        "1",
        "2",
        "-",
        "01",
        "rate_limit",
        "requests_per_unit",
        "unit",
        "quota",
        "name",
        "replaces",
        "value",
        "key",
        "domain",
        "x",
        "a~1b",
        "~0",
        "",
    ]);
    proptest::collection::vec(token, 0..6).prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect())
}

fn patch_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::json;
    prop_oneof![
        select(vec![
            json!(30),
            json!(0),
            json!(-1),
            json!(4294967296u64),
            json!(1.5),
            json!("hour"),
            json!("1/s burst 2"),
            json!("1e3"),
            json!(null),
            json!(true),
            json!([]),
            json!({}),
            json!({"key": "ip"}),
            json!({"key": "ip", "rate_limit": {"unit": "second", "requests_per_unit": 1}}),
            json!([{"name": "per_user"}]),
            json!({"key": "a", "descriptors": [{"key": "b", "descriptors": [{"key": "c"}]}]}),
        ]),
        "[ -~]{0,8}".prop_map(serde_json::Value::from),
    ]
}

fn patch_body() -> impl Strategy<Value = Vec<u8>> {
    let op = (
        select(vec!["add", "remove", "replace", "move", "copy", "test", "fly"]),
        pointer(),
        pointer(),
        patch_value(),
    )
        .prop_map(|(op, path, from, value)| {
            serde_json::json!({"op": op, "path": path, "from": from, "value": value})
        })
        .prop_map(|mut op| {
            // Only the fields each operation has (the others are refused as unknown).
            let keep: &[&str] = match op["op"].as_str() {
                Some("remove") => &["op", "path"],
                Some("move" | "copy") => &["op", "path", "from"],
                _ => &["op", "path", "value"],
            };
            if let Some(map) = op.as_object_mut() {
                map.retain(|k, _| keep.contains(&k.as_str()));
            }
            op
        });
    // Copies of the whole document into itself, which double it each time.
    // (Past the size bound in `regressions.rs`: here few enough to stay quick.)
    let doubling = (1usize..10).prop_map(|n| {
        let copy = serde_json::json!({"op": "copy", "from": "", "path": "/descriptors/-"});
        vec![copy; n]
    });
    prop_oneof![
        4 => proptest::collection::vec(op, 0..6),
        1 => doubling,
    ]
    .prop_map(|ops| serde_json::to_vec(&ops).unwrap_or_default())
}

fn snapshot_json() -> impl Strategy<Value = Vec<u8>> {
    let domain = (select(vec!["edge", "api", "edge"]), rules_file("edge"), any::<u64>())
        .prop_map(|(domain, rules, revision)| serde_json::json!({"domain": domain, "revision": revision, "rules": rules}));
    (
        proptest::collection::vec(domain, 0..3),
        any::<u64>(),
        select(vec!["", "", " ", "x", ",", "}"]),
    )
        .prop_map(|(domains, revision, tail)| {
            let mut json = serde_json::json!({"revision": revision, "domains": domains})
                .to_string()
                .into_bytes();
            json.extend_from_slice(tail.as_bytes());
            json
        })
}

fn http_answer() -> impl Strategy<Value = Vec<u8>> {
    let status = select(vec![
        "200 OK",
        "304 Not Modified",
        "401 No",
        "403 No",
        "500 Oops",
        "204 No Content",
        "999 X",
        "2000 X",
    ]);
    let framing = select(vec![
        "content-length: 0\r\n",
        "content-length: 30\r\n",
        "content-length: 99999999999999999999\r\n",
        "content-length: 2\r\ncontent-length: 3\r\n",
        "transfer-encoding: chunked\r\n",
        "transfer-encoding: gzip\r\n",
        "",
    ]);
    let body = prop_oneof![
        snapshot_json(),
        select(vec![
            b"5\r\nhello\r\n0\r\n\r\n".to_vec(),
            b"ffffffffffffffff\r\n".to_vec(),
            b"<html>".to_vec()
        ]),
        bytes(40),
    ];
    (
        select(vec!["HTTP/1.1", "HTTP/1.0", "HTTP/2", "http/1.1"]),
        status,
        framing,
        body,
    )
        .prop_map(|(version, status, framing, body)| {
            [format!("{version} {status}\r\n{framing}\r\n").into_bytes(), body].concat()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn descriptor_rules_bytes(data in bytes(160)) {
        sluice_invariants::descriptor_rules(&data);
    }

    #[test]
    fn descriptor_rules_files(text in rules_file("edge")) {
        sluice_invariants::descriptor_rules(text.as_bytes());
    }

    #[test]
    fn snapshot_bytes(data in bytes(160)) {
        sluice_invariants::snapshot(&data);
    }

    #[test]
    fn snapshot_bodies(data in snapshot_json()) {
        sluice_invariants::snapshot(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn rules_document_bytes(data in bytes(160)) {
        sluice_invariants::rules_document(&data);
    }

    #[test]
    fn rules_document_files(choice in any::<u8>(), text in rules_file("edge")) {
        let mut data = vec![choice & !1];
        data.extend_from_slice(text.as_bytes());
        sluice_invariants::rules_document(&data);
    }

    #[test]
    fn rules_patch_bytes(data in bytes(160)) {
        sluice_invariants::rules_patch(&data);
    }

    #[test]
    fn rules_patch_operations(data in patch_body()) {
        sluice_invariants::rules_patch(&data);
    }

    #[test]
    fn rules_answer_bytes(data in bytes(160)) {
        sluice_invariants::rules_answer(&data);
    }

    #[test]
    fn rules_answer_bodies(how in 1u8..4, held in any::<u8>(), body in snapshot_json()) {
        let mut data = vec![how, held];
        data.extend_from_slice(&body);
        sluice_invariants::rules_answer(&data);
    }

    #[test]
    fn rules_answer_heads(held in any::<u8>(), answer in http_answer()) {
        let mut data = vec![0, held];
        data.extend_from_slice(&answer);
        sluice_invariants::rules_answer(&data);
    }
}
