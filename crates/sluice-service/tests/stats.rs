//! What the engine counts about its decisions: per rule allowed, denied, shadow-denied,
//! near the limit and hits, kept across a reload while the rule keeps its place; the keys a rule denied most.

use sluice_descriptors::RuleSet;
use sluice_service::{CheckRequest, DescriptorRequest, Engine, EngineSettings, RuleCounts};

const RULES: &str = "
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 1, name: by_ip}
    shadow_mode: true
";

fn request(key: &str, value: &str, hits: Option<u64>) -> CheckRequest {
    CheckRequest {
        domain: "edge".into(),
        descriptors: vec![DescriptorRequest {
            entries: vec![(key.into(), value.into())],
            ..Default::default()
        }],
        hits,
    }
}

fn counts(engine: &Engine, rule: &str) -> RuleCounts {
    engine
        .rule_counts()
        .into_iter()
        .find(|r| r.rule.to_string() == rule)
        .map(|r| r.counts)
        .unwrap_or_else(|| panic!("no rule {rule}"))
}

#[tokio::test]
async fn decisions_are_counted_per_rule_and_kept_across_a_reload() {
    let engine = Engine::new(RuleSet::from_yaml(RULES).unwrap(), EngineSettings::default()).unwrap();
    for _ in 0..3 {
        engine
            .check(&request("user", "alice", None), false)
            .await
            .unwrap();
    }
    engine
        .check(&request("user", "bob", Some(2)), false)
        .await
        .unwrap();
    engine
        .check(&request("user", "carol", Some(3)), false)
        .await
        .unwrap();
    // A peek counts nothing.
    engine.check(&request("user", "alice", None), true).await.unwrap();
    assert_eq!(
        counts(&engine, "edge: user"),
        RuleCounts {
            allowed: 3,
            denied: 2,
            shadow_denied: 0,
            hits: 8,
            // Alice's second and Bob's two hits left nothing of 2: near the limit.
            near_limit: 2,
        }
    );
    for _ in 0..3 {
        engine
            .check(&request("ip", "10.0.0.1", None), false)
            .await
            .unwrap();
    }
    let ip = counts(&engine, "edge: ip");
    assert_eq!((ip.allowed, ip.denied, ip.shadow_denied), (1, 0, 2));

    // Denied most: alice once, carol once (her 3 hits never fit 2/h); shadow denials too.
    let top = engine.top_denied("edge: user", 10).unwrap();
    assert_eq!(top, [("user=alice".to_owned(), 1), ("user=carol".to_owned(), 1)]);
    assert_eq!(
        engine.top_denied("by_ip", 10).unwrap(),
        [("ip=10.0.0.1".to_owned(), 2)]
    );
    assert!(engine.top_denied("edge: nothing", 10).is_none());
    // Across every rule: each key with the rule that denied it, most first.
    let across: Vec<(String, String, Option<String>, u64)> = engine
        .top_denied_across(None, 10)
        .unwrap()
        .into_iter()
        .map(|top| (top.key, top.rule.to_string(), top.name, top.denied))
        .collect();
    assert_eq!(
        across,
        [
            ("ip=10.0.0.1".into(), "edge: ip".into(), Some("by_ip".into()), 2),
            ("user=alice".into(), "edge: user".into(), None, 1),
            ("user=carol".into(), "edge: user".into(), None, 1),
        ]
    );
    assert_eq!(engine.top_denied_across(Some("edge"), 1).unwrap().len(), 1);
    assert!(engine.top_denied_across(Some("elsewhere"), 10).is_none());

    // A reload keeps the counts of rules that keep their place, whatever their limit.
    engine
        .reload(RuleSet::from_yaml(&RULES.replace("requests_per_unit: 2", "requests_per_unit: 5")).unwrap())
        .unwrap();
    assert_eq!(counts(&engine, "edge: user").denied, 2);
    engine
        .check(&request("user", "alice", None), false)
        .await
        .unwrap();
    assert_eq!(counts(&engine, "edge: user").allowed, 4);
    assert!(engine.retired_counts().is_empty(), "no rule was dropped");

    // A reload that drops a rule keeps its decisions in its domain's retired sum, so a sum per
    // domain never goes down; a later reload carries them on.
    let without_ip = RULES.split("  - key: ip").next().unwrap().to_owned();
    engine.reload(RuleSet::from_yaml(&without_ip).unwrap()).unwrap();
    engine.reload(RuleSet::from_yaml(&without_ip).unwrap()).unwrap();
    let retired = engine.retired_counts();
    assert_eq!(retired.len(), 1, "{retired:?}");
    assert_eq!(
        (
            retired[0].0.as_str(),
            retired[0].1.allowed,
            retired[0].1.shadow_denied
        ),
        ("edge", 1, 2)
    );
}
