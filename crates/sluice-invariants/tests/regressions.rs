//! Inputs the fuzz targets once failed on, kept so they never fail again. Each names the
//! target and what was wrong.

/// `config`: a YAML key with line breaks (here a flow mapping's key, whose carriage returns
/// YAML folds into line feeds) was echoed raw into the error's field path, so the one-line
/// error the binary prints spanned several lines. Control characters are now escaped.
#[test]
fn config_error_for_a_key_with_line_breaks_is_one_line() {
    sluice_invariants::config(b"{p\r\rs");
    sluice_invariants::config(
        b"key:\n  from: [bearer, ip, header:Client-Id]\n  max_length: 64\n\
          trusted_proxies: [10.0.0.0/8, \"::1\"]\nclient_ip_header: forwarded\n\
          ipv6_prefix: 56\ncosts:\n  - {p\r\r\r\r\r\r\r\rath: /a, cost: 1}\n",
    );
}

/// `quota`: a duration with more zero decimals than a `u64` power of ten holds
/// (`0.000…0min`, exactly 0) was refused as finer than a nanosecond; so was
/// `1.000000000000000000000s`. Durations now drop a fraction's trailing zeros first.
#[test]
fn durations_with_many_zero_decimals_are_read() {
    sluice_invariants::quota(b"0.000000000000000000000000min");
    sluice_invariants::quota(b"1.000000000000000000000s");
}

/// `rules_patch`: a JSON Patch could nest the rules without bound: each `copy` of a deep value
/// and `move` of it below its own deepest point doubles the depth, so nine pairs of
/// operations nest the document fifty thousand levels deep, whose YAML writer (or its drop)
/// then runs out of stack and takes the rules service down. Likewise a few `copy`s of the
/// whole document into itself doubled it each time, without bound. A patched document now
/// nests at most 128 levels and grows no larger than a rules file.
#[test]
fn a_patch_cannot_nest_or_grow_the_rules_without_bound() {
    let mut operations = vec![format!(
        r#"{{"op": "add", "path": "/a", "value": {}{}}}"#,
        "[".repeat(100),
        "]".repeat(100)
    )];
    // From /a to its innermost (empty) array.
    let mut inner = "/0".repeat(99);
    for _ in 0..9 {
        operations.push(r#"{"op": "copy", "from": "/a", "path": "/c"}"#.to_string());
        operations.push(format!(
            r#"{{"op": "move", "from": "/c", "path": "/a{inner}/-"}}"#
        ));
        inner = format!("{inner}/0{inner}");
    }
    sluice_invariants::rules_patch(format!("[{}]", operations.join(",")).as_bytes());

    let doubling = vec![r#"{"op": "copy", "from": "", "path": "/descriptors/-"}"#; 40];
    sluice_invariants::rules_patch(format!("[{}]", doubling.join(",")).as_bytes());
}

/// `rules_document`: `descriptors:` with nothing after it was read as no descriptors, but
/// `descriptors: null`, the same YAML value, was refused; a JSON Patch writes the document
/// back with the second, so every patch of such rules failed as invalid. Both now read as
/// no descriptors (and `replaces` likewise).
#[test]
fn an_empty_descriptors_field_survives_a_patch() {
    sluice_invariants::rules_document(b"\x00domain: edge\ndescriptors:\n");
    sluice_invariants::rules_document(b"\x00domain: edge\ndescriptors: null\n");
    sluice_invariants::descriptor_rules(b"domain: d\ndescriptors:\n  - key: k\n    descriptors: ~\n");
}

/// `rules_document`: a text field holding what YAML takes for a number (`value: 1e3`) is
/// the text "1e3" to the rules, but a JSON Patch read the file as a document, where it is the
/// number 1000.0, and wrote it back as `1000.0`: any patch, even an empty one, silently moved
/// the rule to another value. Such rules are now refused for patching (409, naming the rule)
/// until the value is quoted.
#[test]
fn a_patch_never_changes_a_value_yaml_reads_as_a_number() {
    sluice_invariants::rules_document(
        b"\x00domain: edge\ndescriptors:\n  - key: v\n    value: 1e3\n    rate_limit: {unit: second, requests_per_unit: 0}\n",
    );
    sluice_invariants::rules_document(b"\x00domain: edge\ndescriptors:\n  - key: 0x10\n    value: '0x10'\n    rate_limit: {unlimited: true}\n");
}

/// `descriptor_rules`: a rules file whose top level holds a field with an empty name (here
/// through an anchor, `&qdomain: ...`) was refused with an empty field, so the error read
/// `: unknown field ...` and named no place. It now names the line and column.
#[test]
fn a_nameless_field_is_refused_by_its_place() {
    sluice_invariants::descriptor_rules(b"&qdomain: dddomain:-domain:-0b");
    sluice_invariants::descriptor_rules(b": 1\ndomain: d\n");
}

/// `rls`: after a descriptor that denies, all-or-nothing counting only looks at the rest, so
/// a later descriptor whose hits its limit can never hold is answered OK, not OVER_LIMIT (by
/// design; the check expected otherwise and now holds the never-fitting promise only up to the
/// first denial). Three hits on `/login` (1/s), then `/api/x` (2/h, shadow).
#[test]
fn after_a_denial_the_rest_are_only_looked_at() {
    sluice_invariants::rls(
        b"\x0a\x04edge\x12\x10\x0a\x0e\x0a\x04path\x12\x06/login\x12\x10\x0a\x0e\x0a\x04path\x12\x06/api/x\x12\x1c\x0a\x0e\x0a\x02ip\x12\x0810.0.0.1\x0a\x0a\x0a\x04path\x12\x02/a\x18\x03",
    );
}

/// `rls`, `check_api`: an override the rule's algorithm cannot hold exactly (63067937 per
/// second on a token bucket) is not refused as an unreadable override is: its counter stays on
/// the failsafe quota, so it is denied and reported as that quota (0 per second here). Open:
/// the checks hold that it is denied, not admitted.
#[test]
fn an_override_the_algorithm_cannot_hold_is_denied() {
    // user=al with the override 63067937 per second.
    let mut message = b"\x0a\x04edge\x12\x15\x0a\x0a\x0a\x04user\x12\x02al\x12\x07\x08".to_vec();
    message.extend_from_slice(&[0xa1, 0xae, 0x89, 0x1e, 0x10, 0x01]);
    sluice_invariants::rls(&message);
    sluice_invariants::check_api(
        br#"{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "al"}], "limit": "63067937/s"}]}"#,
    );
}

/// `check_api`: a body refused as JSON (here, a request followed by three 0xff bytes) was read a
/// second time only to name the field at fault, but that reading stops at the end of the
/// request, found nothing wrong, and the request was decided. The refusal now stands.
#[test]
fn a_body_with_trailing_bytes_is_refused() {
    sluice_invariants::check_api(
        b"{\"domain\": \"edge\", \"descriptors\": [{\"entries\": [{\"key\": \"user\", \"value\": \"al\"}], \"limit\": \"2/min\", \"hits\": 3}, {\"entries\": [{\"key\": \"path\", \"value\": \"/api/x\"}]}], \"peek\": true}\xff\xff\xff",
    );
}

/// `rules_document`: rules holding a YAML tag (`descriptors: !-`) are taken by the rules
/// reader, but a JSON Patch could not read them as a document and answered 500, "never for
/// rules this store wrote". Such rules are now refused for patching as rules a document does
/// not hold (409).
#[test]
fn a_tag_the_rules_take_is_refused_for_patching_not_a_server_error() {
    sluice_invariants::rules_document(b"\x00domain: edge\ndescriptors:\n !-   ");
}

#[test]
fn envoys_newer_descriptor_fields_load_and_keep_their_meaning() {
    // The fuzz seed that carries every one of them: accepted, then checked.
    let seed = include_str!("../../../fuzz/seeds/descriptor_rules/seed-3");
    let domain = sluice_descriptors::parse_domain(seed).expect("the seed is a valid rules file");
    assert_eq!(domain.rules().count(), 2);
    sluice_invariants::descriptor_rules(seed.as_bytes());
}
