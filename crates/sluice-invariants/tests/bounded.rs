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
