//! Descriptor rules: envoy's documented matching against a simple model, field-path errors,
//! counter keys that never collide, and loading from a directory.

use proptest::prelude::*;
use sluice_descriptors::{Entry, Limit, LoadError, RuleSet, counter_key, rule_of};

fn quota(text: &str) -> Limit {
    Limit::Quota(text.parse().unwrap())
}

#[test]
fn envoys_documented_example_loads_unchanged_and_matches_as_documented() {
    let rules = RuleSet::from_yaml(
        r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: SECOND
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
    shadow_mode: true
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 100, name: api_paths}
  - key: generic_key
    value: bypass
    rate_limit: {unlimited: true}
  - key: client
    descriptors:
      - key: user
        value: vip
        rate_limit: {unit: hour, requests_per_unit: 1000, name: vip, replaces: [{name: api_paths}]}
        detailed_metric: true
"#,
    )
    .unwrap();
    let find = |entries: &[(&str, &str)]| {
        let entries: Vec<Entry<'_>> = entries.iter().map(|(key, value)| Entry { key, value }).collect();
        rules.find("mongo_cps", &entries).cloned()
    };
    assert_eq!(find(&[("database", "users")]).unwrap().limit, quota("500/s"));
    assert!(
        find(&[("database", "orders")]).is_none(),
        "no key-only default for database"
    );
    let shadow = find(&[("remote_address", "10.0.0.1")]).unwrap();
    assert!(shadow.shadow_mode);
    assert_eq!(
        find(&[("path", "/api/x")]).unwrap().name.as_deref(),
        Some("api_paths")
    );
    assert!(find(&[("path", "/apix")]).is_none());
    assert_eq!(
        find(&[("generic_key", "bypass")]).unwrap().limit,
        Limit::Unlimited
    );
    let vip = find(&[("client", "any"), ("user", "vip")]).unwrap();
    assert_eq!(
        (vip.replaces.clone(), vip.detailed_metric),
        (vec!["api_paths".to_string()], true)
    );
    assert!(find(&[("client", "any")]).is_none());
    assert!(find(&[("client", "any"), ("user", "plain")]).is_none());
    assert_eq!(rules.len(), 6);
}

/// `quota: [..]`: the first is the rule's limit, the others its stacked quotas; any period
/// works (`5/30s`, `100/90min`).
#[test]
fn a_rule_holds_several_quotas() {
    let rules = RuleSet::from_yaml(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: [\"10/s burst 20\", 1000/day, 5/30s, 100/90min]}\n  - key: j\n    rate_limit: {quota: 1/s}\n",
    )
    .unwrap();
    let find = |key: &str| rules.find("d", &[Entry { key, value: "v" }]).unwrap();
    let several = find("k");
    assert_eq!(several.limit, Limit::Quota("10/s burst 20".parse().unwrap()));
    let stacked: Vec<String> = several.stacked.iter().map(ToString::to_string).collect();
    let expected: Vec<String> = ["1000/day", "5/30s", "100/90min"]
        .iter()
        .map(|text| text.parse::<sluice::Quota>().unwrap().to_string())
        .collect();
    assert_eq!(stacked, expected);
    assert!(find("j").stacked.is_empty());
}

#[test]
fn errors_name_the_field() {
    let cases = [
        ("descriptors: []\n", "domain"),
        ("domain: ''\n", "domain"),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            "descriptors[0].rate_limit.unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n  - key: j\n    descriptors:\n      - key: x\n        rate_limit: {quota: fast}\n",
            "descriptors[1].descriptors[0].rate_limit.quota",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {}\n",
            "descriptors[0].rate_limit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second, requests_per_unit: 1}\n",
            "descriptors[0].rate_limit.unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: 1/s, unit: second}\n",
            "descriptors[0].rate_limit.quota",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: 1/s, algorithm: fastest}\n",
            "descriptors[0].rate_limit.algorithm",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
            "descriptors[1]",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: 1/s, replaces: [{name: nobody}]}\n",
            "descriptors[0].rate_limit.replaces[0].name",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {quota: 1/s, name: n}\n  - key: b\n    rate_limit: {quota: 1/s, name: n}\n",
            "descriptors[1].rate_limit.name",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    valu: x\n",
            "descriptors[0].valu",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
            "descriptors[0].rate_limit.requests_per_unit",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: [1/s, often]}\n",
            "descriptors[0].rate_limit.quota[1]",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: []}\n",
            "descriptors[0].rate_limit.quota",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: [1/s, 2/s, 3/s, 4/s, 5/s, 6/s, 7/s, 8/s, 9/s]}\n",
            "descriptors[0].rate_limit.quota",
        ),
        (
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: [1/s, 100/day], unit: second}\n",
            "descriptors[0].rate_limit.quota",
        ),
    ];
    for (text, field) in cases {
        let e = RuleSet::from_yaml(text).unwrap_err();
        assert_eq!(e.field, field, "{text:?}: {e}");
        assert!(!e.to_string().contains('\n'), "one line: {e}");
        assert!(!e.message.starts_with("descriptors"), "the path once: {e}");
    }
    let deep = (0..40).fold(String::from("domain: d\ndescriptors:\n"), |mut text, level| {
        let pad = "  ".repeat(2 * level);
        text.push_str(&format!("{pad}  - key: k{level}\n{pad}    descriptors:\n"));
        text
    });
    let e = RuleSet::from_yaml(&deep).unwrap_err();
    assert!(e.message.contains("deeper than 32"), "{e}");
}

#[test]
fn a_directory_gives_one_domain_per_file_and_refuses_a_domain_twice() {
    let dir = tempfile::tempdir().unwrap();
    let rule = |domain: &str| {
        format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{quota: 1/s}}\n")
    };
    std::fs::write(dir.path().join("a.yaml"), rule("a")).unwrap();
    std::fs::create_dir(dir.path().join("more")).unwrap();
    std::fs::write(dir.path().join("more/b.yml"), rule("b")).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not rules").unwrap();
    let rules = RuleSet::load(dir.path()).unwrap();
    assert!(rules.domain("a").is_some() && rules.domain("b").is_some());
    assert_eq!(rules.len(), 2);

    std::fs::write(dir.path().join("c.yaml"), rule("a")).unwrap();
    let e = RuleSet::load(dir.path()).unwrap_err();
    assert!(
        matches!(&e, LoadError::DuplicateDomain { domain, .. } if domain == "a"),
        "{e}"
    );
    std::fs::write(
        dir.path().join("c.yaml"),
        "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: sec, requests_per_unit: 1}\n",
    )
    .unwrap();
    let e = RuleSet::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("c.yaml: descriptors[0].rate_limit.unit"), "{e}");
}

/// A rule of the model: its path of (key, value as written), and whether it has a limit.
#[derive(Debug, Clone)]
struct ModelRule {
    path: Vec<(String, Option<String>)>,
    limited: bool,
}

/// The limit of the model's rule at `index`: each rule its own (`index + 1` per second), so a
/// match is told by its limit.
fn model_quota(index: usize) -> String {
    format!("{}/s", index + 1)
}

/// Whether `value` matches `pattern`, each `*` any run of bytes: by backtracking, the plainest
/// way to say it.
fn glob(pattern: &[u8], value: &[u8]) -> bool {
    match pattern.split_first() {
        None => value.is_empty(),
        Some((b'*', rest)) => (0..=value.len()).any(|skip| glob(rest, &value[skip..])),
        Some((c, rest)) => value.first() == Some(c) && glob(rest, &value[1..]),
    }
}

/// Envoy's walk, by linear search over every rule's path.
fn model_find(rules: &[ModelRule], entries: &[(String, String)]) -> Option<usize> {
    let mut prefix: Vec<(String, Option<String>)> = Vec::new();
    for (depth, (key, value)) in entries.iter().enumerate() {
        let at_level = |candidate: &(String, Option<String>)| {
            rules.iter().any(|rule| {
                rule.path.len() > depth && rule.path[..depth] == prefix[..] && rule.path[depth] == *candidate
            })
        };
        let exact = (key.clone(), Some(value.clone()));
        // The first wildcard in the file's order (the order the rules first give each step).
        let wildcard = rules
            .iter()
            .filter(|rule| rule.path.len() > depth && rule.path[..depth] == prefix[..])
            .find_map(|rule| {
                let (k, v) = &rule.path[depth];
                let pattern = v.as_ref().filter(|v| v.contains('*'))?;
                (k == key && glob(pattern.as_bytes(), value.as_bytes())).then(|| rule.path[depth].clone())
            });
        let step = if at_level(&exact) {
            exact
        } else if let Some(w) = wildcard {
            w
        } else if at_level(&(key.clone(), None)) {
            (key.clone(), None)
        } else {
            return None;
        };
        prefix.push(step);
    }
    rules.iter().position(|rule| rule.limited && rule.path == prefix)
}

fn yaml(rules: &[ModelRule]) -> String {
    // Build the tree from the paths, then print it. A node: its step, the quota of the rule
    // ending there if it has one, its children.
    type Step = (String, Option<String>);
    #[derive(Default)]
    struct Tree(Vec<(Step, Option<String>, Tree)>);
    let mut tree = Tree::default();
    for (index, rule) in rules.iter().enumerate() {
        let mut level = &mut tree;
        for (i, step) in rule.path.iter().enumerate() {
            let at = match level.0.iter().position(|(s, _, _)| s == step) {
                Some(at) => at,
                None => {
                    level.0.push((step.clone(), None, Tree::default()));
                    level.0.len() - 1
                }
            };
            if i + 1 == rule.path.len() && rule.limited {
                level.0[at].1 = Some(model_quota(index));
            }
            level = &mut level.0[at].2;
        }
    }
    fn print(tree: &Tree, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        for ((key, value), quota, children) in &tree.0 {
            out.push_str(&format!("{pad}- key: \"{key}\"\n"));
            if let Some(value) = value {
                out.push_str(&format!("{pad}  value: \"{value}\"\n"));
            }
            if let Some(quota) = quota {
                out.push_str(&format!("{pad}  rate_limit: {{quota: {quota}}}\n"));
            }
            if !children.0.is_empty() {
                out.push_str(&format!("{pad}  descriptors:\n"));
                print(children, indent + 4, out);
            }
        }
    }
    let mut out = String::from("domain: d\ndescriptors:\n");
    print(&tree, 2, &mut out);
    out
}

fn step() -> impl Strategy<Value = (String, Option<String>)> {
    (
        prop::sample::select(vec!["a", "b"]),
        prop::option::of(prop::sample::select(vec![
            "x", "y", "xy", "x*", "xy*", "*", "x*z", "*y", "x*y*z", "**",
        ])),
    )
        .prop_map(|(k, v)| (k.to_string(), v.map(str::to_string)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn find_agrees_with_the_model(
        paths in prop::collection::vec((prop::collection::vec(step(), 1..4), any::<bool>()), 1..12),
        requests in prop::collection::vec(
            prop::collection::vec((prop::sample::select(vec!["a", "b"]), prop::sample::select(vec!["x", "y", "xy", "xyz", "z", "", "xz", "xyyz", "x*", "*"])), 1..4),
            1..20,
        ),
    ) {
        let mut rules: Vec<ModelRule> = Vec::new();
        for (path, limited) in paths {
            match rules.iter_mut().find(|r| r.path == path) {
                Some(rule) => rule.limited |= limited,
                None => rules.push(ModelRule { path, limited }),
            }
        }
        let set = RuleSet::from_yaml(&yaml(&rules)).unwrap();
        for request in requests {
            let owned: Vec<(String, String)> = request.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let entries: Vec<Entry<'_>> = owned.iter().map(|(key, value)| Entry { key, value }).collect();
            // The rule matched, told by its limit (every rule's is its own), not only whether one did.
            let found = set.find("d", &entries).map(|rule| rule.limit);
            let expected = model_find(&rules, &owned).map(|index| quota(&model_quota(index)));
            prop_assert_eq!(found, expected, "{:?} in\n{}", owned, yaml(&rules));
        }
    }

    #[test]
    fn counter_keys_never_collide_and_name_their_rule(
        a in prop::collection::vec(("[a-c\\\\\u{1c}\u{1e}\u{1f}]{0,3}", "[a-c\\\\\u{1c}\u{1e}\u{1f}]{0,3}"), 1..3),
        b in prop::collection::vec(("[a-c\\\\\u{1c}\u{1e}\u{1f}]{0,3}", "[a-c\\\\\u{1c}\u{1e}\u{1f}]{0,3}"), 1..3),
    ) {
        let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {quota: 1/s}\n").unwrap();
        let rule = rules.rules().next().unwrap();
        fn entries(pairs: &[(String, String)]) -> Vec<Entry<'_>> {
            pairs.iter().map(|(key, value)| Entry { key, value }).collect()
        }
        let (ka, kb) = (counter_key(rule, &entries(&a)), counter_key(rule, &entries(&b)));
        prop_assert_eq!(ka == kb, a == b);
        let named = rule_of(&ka);
        prop_assert_eq!(named.as_ref(), Some(&rule.id));
    }
}

#[test]
fn a_rule_exact_at_every_level_has_one_counter_and_one_under_a_key_only_level_has_many() {
    let rules = RuleSet::from_yaml(
        "domain: d
descriptors:
  - key: plan
    value: gold
    rate_limit: {quota: 1/s}
    descriptors:
      - key: path
        value: /a
        rate_limit: {quota: 2/s}
  - key: user
    descriptors:
      - key: path
        value: /a
        rate_limit: {quota: 3/s}
  - key: region
    value: eu*
    rate_limit: {quota: 4/s}
",
    )
    .unwrap();
    let key = |pairs: &[(&str, &str)]| {
        let entries: Vec<Entry<'_>> = pairs.iter().map(|(key, value)| Entry { key, value }).collect();
        let rule = rules.find("d", &entries).unwrap();
        (rule.exact, counter_key(rule, &entries))
    };
    let (gold_exact, gold) = key(&[("plan", "gold")]);
    let (nested_exact, nested) = key(&[("plan", "gold"), ("path", "/a")]);
    assert!(gold_exact && nested_exact);
    assert_ne!(gold, nested);
    // Under a key-only level, each user's /a has its own counter.
    let (alice_exact, alice) = key(&[("user", "alice"), ("path", "/a")]);
    let (_, bob) = key(&[("user", "bob"), ("path", "/a")]);
    assert!(!alice_exact);
    assert_ne!(alice, bob);
    // A prefix rule counts each matching value apart.
    let (prefix_exact, eu1) = key(&[("region", "eu-1")]);
    let (_, eu2) = key(&[("region", "eu-2")]);
    assert!(!prefix_exact);
    assert_ne!(eu1, eu2);
    for counter in [&gold, &nested, &alice, &eu1] {
        assert!(rule_of(counter).is_some(), "{counter:?}");
    }
}

#[test]
fn flow_nesting_is_bounded_before_the_yaml_reader_sees_it() {
    use sluice_descriptors::{MAX_DEPTH, MAX_FLOW_NESTING, parse_domain};
    // Deep flow nesting costs the YAML reader time quadratic in its depth: refused at once.
    let deep = format!("domain: d\ndescriptors: {}", "[".repeat(100_000));
    let e = parse_domain(&deep).unwrap_err();
    assert_eq!(e.field, format!("line 2 column {}", 13 + MAX_FLOW_NESTING + 1));
    assert!(e.message.contains("nested deeper than"), "{e}");
    let metadata = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {}1{}\n",
        "{a: ".repeat(MAX_FLOW_NESTING),
        "}".repeat(MAX_FLOW_NESTING)
    );
    assert!(
        parse_domain(&metadata)
            .unwrap_err()
            .message
            .contains("nested deeper than")
    );
    // Brackets in quoted text and comments are text.
    let quoted = format!(
        "domain: d # {}\ndescriptors:\n  - key: k\n    value: '{}'\n    metadata: {{a: \"{}\\\"\", b: 'it''s {}'}}\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n",
        "[".repeat(300),
        "{".repeat(300),
        "[".repeat(300),
        "{".repeat(300)
    );
    let loaded = parse_domain(&quoted).unwrap();
    assert_eq!(loaded.rules().count(), 1);
    // A line of a block scalar that looks like a quote hides no nesting after it.
    let hidden = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata:\n      t: |\n        '\n      u: {}\n",
        "[".repeat(MAX_FLOW_NESTING + 1)
    );
    assert!(
        parse_domain(&hidden)
            .unwrap_err()
            .message
            .contains("nested deeper than")
    );
    // Descriptors written in flow style at the deepest level still load.
    let mut flow = String::from("{key: k, rate_limit: {unit: second, requests_per_unit: 1}}");
    for _ in 1..MAX_DEPTH {
        flow = format!("{{key: k, descriptors: [{flow}]}}");
    }
    let deepest = format!("domain: d\ndescriptors: [{flow}]\n");
    assert_eq!(parse_domain(&deepest).unwrap().rules().count(), 1);
}

#[test]
fn flags_read_yaml_1_1_words_as_envoys_reader_does() {
    let rules = RuleSet::from_yaml(
        "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: yes\n    quota_mode: On\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    shadow_mode: off\n    rate_limit: {unlimited: Y}\n",
    )
    .unwrap();
    let a = rules.find("d", &[Entry { key: "a", value: "x" }]).unwrap();
    assert!(a.shadow_mode && a.quota_mode);
    let b = rules.find("d", &[Entry { key: "b", value: "x" }]).unwrap();
    assert!(!b.shadow_mode && b.limit == Limit::Unlimited);
    let e = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n").unwrap_err();
    assert_eq!(e.field, "descriptors[0].shadow_mode");
    assert!(e.message.contains("maybe"), "{e}");
}
