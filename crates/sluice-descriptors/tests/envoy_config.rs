//! envoy ratelimit's config tests (its `test/config/config_test.go` with the YAML files it
//! loads, and the two files of `examples/ratelimit/config/`), each written again as sluice's
//! own test data: the same features and the same lookups, with keys, values and numbers of our
//! own. Every case names the envoy file or test it stands for.
//!
//! Where envoy names a stats key, sluice has two things: a rule's place ([`RuleId`], shown as
//! `domain: key=value > key`), which is envoy's key for a rule without `detailed_metric` or
//! `value_to_metric`, and [`metric_label`], envoy's key for a rule with them. Where envoy's
//! cache key shares a counter (`share_threshold`), sluice's [`counter_key`] does.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use sluice::Quota;
use sluice_descriptors::{
    Entry, Limit, LoadError, LoadOptions, MAX_METADATA_DEPTH, MAX_METADATA_ITEMS, Metadata, Rule, RuleSet,
    RulesError, counter_key, metric_label, rule_of,
};

const SECOND: u64 = 1;
const MINUTE: u64 = 60;
const HOUR: u64 = 3_600;
const DAY: u64 = 86_400;

/// The rules of one file's text, which must load.
fn rules(yaml: &str) -> RuleSet {
    RuleSet::from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\nin\n{yaml}"))
}

/// The error of one file's text, which must be refused.
fn refused(yaml: &str) -> RulesError {
    match RuleSet::from_yaml(yaml) {
        Ok(rules) => panic!("loaded {} rules from\n{yaml}", rules.len()),
        Err(e) => e,
    }
}

/// A request descriptor's entries.
fn entries<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<Entry<'a>> {
    pairs.iter().map(|&(key, value)| Entry { key, value }).collect()
}

/// The rule one request descriptor finds in `domain`.
fn find<'r>(rules: &'r RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Option<&'r Rule> {
    rules.find(domain, &entries(pairs))
}

/// What envoy's tests check of the limit `GetLimit` returns.
#[derive(Debug, Clone, PartialEq)]
struct Found {
    limit: Limit,
    name: Option<String>,
    shadow_mode: bool,
    quota_mode: bool,
}

impl Found {
    fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    fn shadow(mut self) -> Self {
        self.shadow_mode = true;
        self
    }

    fn quota_mode(mut self) -> Self {
        self.quota_mode = true;
        self
    }
}

/// `count` requests per `seconds`, unnamed, neither shadow nor quota mode.
fn per(count: u64, seconds: u64) -> Found {
    let limit = if count == 0 {
        Quota::deny_all()
    } else {
        Quota::new(count, Duration::from_secs(seconds)).unwrap()
    };
    plain(Limit::Quota(limit))
}

fn unlimited() -> Found {
    plain(Limit::Unlimited)
}

fn plain(limit: Limit) -> Found {
    Found {
        limit,
        name: None,
        shadow_mode: false,
        quota_mode: false,
    }
}

/// The limit, name and modes of the rule a request finds, as envoy's tests compare them.
fn found(rules: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Option<Found> {
    find(rules, domain, pairs).map(|rule| Found {
        limit: rule.limit,
        name: rule.name.clone(),
        shadow_mode: rule.shadow_mode,
        quota_mode: rule.quota_mode,
    })
}

/// The place of the rule a request finds, as it reads (`domain: key=value > key`).
fn place(rules: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> String {
    find(rules, domain, pairs)
        .unwrap_or_else(|| panic!("no rule for {pairs:?}"))
        .id
        .to_string()
}

/// The counter key of a request under the rule it finds.
fn counter(rules: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> String {
    let entries = entries(pairs);
    let rule = rules
        .find(domain, &entries)
        .unwrap_or_else(|| panic!("no rule for {pairs:?}"));
    let key = counter_key(rule, &entries);
    assert_eq!(rule_of(&key).as_ref(), Some(&rule.id), "{pairs:?}");
    key
}

/// The metric label of a request under the rule it finds.
fn label(rules: &RuleSet, domain: &str, pairs: &[(&str, &str)]) -> Option<String> {
    let entries = entries(pairs);
    let rule = rules
        .find(domain, &entries)
        .unwrap_or_else(|| panic!("no rule for {pairs:?}"));
    metric_label(rule, &entries)
}

/// A metadata map of `(key, value)` pairs.
fn map(pairs: &[(&str, Metadata)]) -> Metadata {
    Metadata::Map(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect())
}

fn text(value: &str) -> Metadata {
    Metadata::String(value.to_owned())
}

/// Writes `files` (name, text) into a new directory.
fn directory(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

fn merged(path: &Path) -> Result<RuleSet, LoadError> {
    RuleSet::load_with(path, LoadOptions { merge_domains: true })
}

// ---------------------------------------------------------------------------------------------
// 1. The files envoy loads: found as envoy finds them.
// ---------------------------------------------------------------------------------------------

/// envoy's `test/config/basic_config.yaml`, in other words.
const BASIC: &str = "
# Top level key and value with no limit of its own, two nested limits.
domain: shop
descriptors:
  - key: tenant
    value: acme
    descriptors:
      # A key alone: the default of its level.
      - key: user
        rate_limit:
          unit: second
          requests_per_unit: 7
      # A value of it: overrides the default.
      - key: user
        value: admin
        rate_limit:
          unit: second
          requests_per_unit: 70

  # A default at the top, and a value overriding it.
  - key: region
    rate_limit:
      unit: minute
      requests_per_unit: 25
  - key: region
    value: eu
    rate_limit:
      unit: minute
      requests_per_unit: 35
  # A value with no limit: let through.
  - key: region
    value: internal

  - key: client
    rate_limit:
      unit: hour
      requests_per_unit: 2

  - key: api_key
    rate_limit:
      name: api_key_daily
      unit: day
      requests_per_unit: 3

  - key: plan
    value: gold
    rate_limit:
      unit: day
      requests_per_unit: 12
    descriptors:
      - key: feature
        value: export
        rate_limit:
          unit: day
          requests_per_unit: 24

  - key: health
    rate_limit:
      unlimited: true

  - key: campaign
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 45
";

/// envoy's `TestBasicConfig` on `basic_config.yaml`.
#[test]
fn basic_config_finds_envoys_limits() {
    let r = rules(BASIC);
    assert_eq!(r.domains().count(), 1);
    assert!(found(&r, "no_such_domain", &[("region", "eu")]).is_none());
    assert!(found(&r, "shop", &[]).is_none());
    // A value with no limit and no key-only default at its level.
    assert!(found(&r, "shop", &[("tenant", "other")]).is_none());
    // A node without a rate_limit of its own only leads to its nested descriptors.
    assert!(found(&r, "shop", &[("tenant", "acme")]).is_none());
    // A request deeper than the rules.
    assert!(found(&r, "shop", &[("region", "eu"), ("sub", "x")]).is_none());
    // A nested value the rules do not give, with no default beside it.
    assert!(found(&r, "shop", &[("plan", "gold"), ("feature", "import")]).is_none());

    // The nested default, and the nested override.
    assert_eq!(
        found(&r, "shop", &[("tenant", "acme"), ("user", "bob")]),
        Some(per(7, SECOND))
    );
    assert_eq!(
        found(&r, "shop", &[("tenant", "acme"), ("user", "admin")]),
        Some(per(70, SECOND))
    );
    // The top default, and the top override.
    assert_eq!(found(&r, "shop", &[("region", "us")]), Some(per(25, MINUTE)));
    assert_eq!(found(&r, "shop", &[("region", "eu")]), Some(per(35, MINUTE)));
    // A value listed without a limit is let through, though its key has a default.
    assert!(found(&r, "shop", &[("region", "internal")]).is_none());
    assert_eq!(found(&r, "shop", &[("client", "any")]), Some(per(2, HOUR)));
    assert_eq!(
        found(&r, "shop", &[("api_key", "k-1")]),
        Some(per(3, DAY).named("api_key_daily"))
    );
    assert_eq!(found(&r, "shop", &[("plan", "gold")]), Some(per(12, DAY)));
    assert_eq!(
        found(&r, "shop", &[("plan", "gold"), ("feature", "export")]),
        Some(per(24, DAY))
    );
    assert_eq!(found(&r, "shop", &[("health", "probe")]), Some(unlimited()));
    assert_eq!(
        found(&r, "shop", &[("campaign", "spring")]),
        Some(per(45, MINUTE))
    );

    // envoy's stats keys of rules without detailed_metric: the place, as written.
    assert_eq!(
        place(&r, "shop", &[("tenant", "acme"), ("user", "bob")]),
        "shop: tenant=acme > user"
    );
    assert_eq!(
        place(&r, "shop", &[("tenant", "acme"), ("user", "admin")]),
        "shop: tenant=acme > user=admin"
    );
    assert_eq!(place(&r, "shop", &[("region", "us")]), "shop: region");
    assert_eq!(label(&r, "shop", &[("region", "us")]), None);
    // detailed_metric: each value its own series (`key7_unspecified_value`, `key7_another_value`).
    assert_eq!(
        label(&r, "shop", &[("campaign", "spring")]).as_deref(),
        Some("campaign_spring")
    );
    assert_eq!(
        label(&r, "shop", &[("campaign", "summer")]).as_deref(),
        Some("campaign_summer")
    );
    // `TestConfigLimitOverride`: under a key-only level each value counts apart.
    assert_ne!(
        counter(&r, "shop", &[("tenant", "acme"), ("user", "bob")]),
        counter(&r, "shop", &[("tenant", "acme"), ("user", "carol")])
    );
    assert_eq!(r.len(), 10);
}

/// envoy's `test/config/shadowmode_config.yaml` and `TestShadowModeConfig`.
#[test]
fn shadowmode_config_marks_only_its_rules() {
    let r = rules(
        "
domain: shadows
descriptors:
  - key: org
    value: beta
    descriptors:
      - key: member
        rate_limit:
          unit: second
          requests_per_unit: 4
      - key: member
        value: owner
        rate_limit:
          unit: second
          requests_per_unit: 40
        shadow_mode: true
  - key: ip
    rate_limit:
      unit: minute
      requests_per_unit: 15
    shadow_mode: true
  - key: ip
    value: 10.0.0.1
    rate_limit:
      unit: minute
      requests_per_unit: 150
",
    );
    assert_eq!(
        found(&r, "shadows", &[("org", "beta"), ("member", "m")]),
        Some(per(4, SECOND))
    );
    assert_eq!(
        found(&r, "shadows", &[("org", "beta"), ("member", "owner")]),
        Some(per(40, SECOND).shadow())
    );
    assert_eq!(
        found(&r, "shadows", &[("ip", "10.0.0.9")]),
        Some(per(15, MINUTE).shadow())
    );
    assert_eq!(
        found(&r, "shadows", &[("ip", "10.0.0.1")]),
        Some(per(150, MINUTE))
    );
}

/// envoy's `merge_domain_key1.yaml` and `merge_domain_key2.yaml`, and `TestDomainMerge`.
#[test]
fn merged_domain_files_give_both_files_rules() {
    let first = "# Merged with second.yaml.
domain: tiers
descriptors:
  - key: tier
    value: free
    rate_limit:
      unit: minute
      requests_per_unit: 10
";
    let second = "# Merged with first.yaml.
domain: tiers
descriptors:
  - key: tier
    value: paid
    rate_limit:
      unit: minute
      requests_per_unit: 20
";
    let dir = directory(&[("first.yaml", first), ("second.yaml", second)]);
    let r = merged(dir.path()).unwrap();
    assert_eq!(r.domains().count(), 1);
    assert!(found(&r, "other", &[("tier", "free")]).is_none());
    assert!(found(&r, "tiers", &[]).is_none());
    assert_eq!(found(&r, "tiers", &[("tier", "free")]), Some(per(10, MINUTE)));
    assert_eq!(found(&r, "tiers", &[("tier", "paid")]), Some(per(20, MINUTE)));
    assert!(found(&r, "tiers", &[("tier", "trial")]).is_none());
    // Merging off, the same two files give one domain twice.
    let e = RuleSet::load(dir.path()).unwrap_err();
    assert!(
        matches!(&e, LoadError::DuplicateDomain { domain, .. } if domain == "tiers"),
        "{e}"
    );
}

/// envoy's `test/config/wildcard.yaml`, in other words.
const WILDCARDS: &str = "
domain: wild
descriptors:
  - key: bucket
    value: logs*
    rate_limit:
      unit: minute
      requests_per_unit: 21
  - key: exact
    value: logs
    rate_limit:
      unit: minute
      requests_per_unit: 22
  - key: any
    rate_limit:
      unit: minute
      requests_per_unit: 23
  - key: middle
    value: img*png
    rate_limit:
      unit: minute
      requests_per_unit: 24
  - key: many
    value: v*api*json
    rate_limit:
      unit: minute
      requests_per_unit: 11
  - key: zone
    value: west
    descriptors:
      - key: bucket
        value: tmp*
        rate_limit:
          unit: minute
          requests_per_unit: 25
";

/// envoy's `TestWildcardConfig` on `wildcard.yaml`.
#[test]
fn wildcard_config_matches_trailing_middle_and_many_stars() {
    let r = rules(WILDCARDS);
    let d = "wild";
    // A key alone: every value finds one rule, named by the key.
    assert_eq!(found(&r, d, &[("any", "a1")]), Some(per(23, MINUTE)));
    assert_eq!(place(&r, d, &[("any", "a1")]), place(&r, d, &[("any", "a2")]));
    assert_eq!(place(&r, d, &[("any", "a1")]), "wild: any");
    // A trailing wildcard: both values find it, named by the wildcard.
    assert_eq!(found(&r, d, &[("bucket", "logs1")]), Some(per(21, MINUTE)));
    assert_eq!(place(&r, d, &[("bucket", "logs1")]), "wild: bucket=logs*");
    assert_eq!(place(&r, d, &[("bucket", "logs2")]), "wild: bucket=logs*");
    // A nested wildcard.
    assert_eq!(
        found(&r, d, &[("zone", "west"), ("bucket", "tmp2")]),
        Some(per(25, MINUTE))
    );
    assert_eq!(
        place(&r, d, &[("zone", "west"), ("bucket", "tmp2")]),
        "wild: zone=west > bucket=tmp*"
    );
    // No match, and no eager match of an exact value.
    assert!(found(&r, d, &[("bucket", "data")]).is_none());
    assert!(found(&r, d, &[("exact", "logs1")]).is_none());
    assert_eq!(found(&r, d, &[("exact", "logs")]), Some(per(22, MINUTE)));
    // A middle wildcard: prefix and suffix, the star matching any run, none included.
    for value in ["img1png", "img123png", "imgpng"] {
        assert_eq!(
            found(&r, d, &[("middle", value)]),
            Some(per(24, MINUTE)),
            "{value}"
        );
        assert_eq!(place(&r, d, &[("middle", value)]), "wild: middle=img*png");
    }
    for value in ["imga", "ximgpng", "img", "png"] {
        assert!(found(&r, d, &[("middle", value)]).is_none(), "{value}");
    }
    // Several stars: the parts in order.
    for value in ["v1api2json", "vapijson", "v-api-api-json"] {
        assert_eq!(found(&r, d, &[("many", value)]), Some(per(11, MINUTE)), "{value}");
        assert_eq!(place(&r, d, &[("many", value)]), "wild: many=v*api*json");
    }
    for value in ["v1json", "api2json", "v1jsonapi", "vapijson2"] {
        assert!(found(&r, d, &[("many", value)]).is_none(), "{value}");
    }
    // A request value written as the wildcard is finds that node exactly.
    assert_eq!(found(&r, d, &[("bucket", "logs*")]), Some(per(21, MINUTE)));
    // Without share_threshold each value matching a wildcard counts apart (envoy's cache key
    // holds the request's value).
    assert_ne!(
        counter(&r, d, &[("bucket", "logs1")]),
        counter(&r, d, &[("bucket", "logs2")])
    );
    assert_ne!(
        counter(&r, d, &[("middle", "img1png")]),
        counter(&r, d, &[("middle", "img2png")])
    );
}

/// envoy's wildcards are tried in the file's order after the exact values: the first match wins.
#[test]
fn overlapping_wildcards_take_the_first_in_file_order_after_exact_values() {
    let r = rules(
        "
domain: order
descriptors:
  - key: path
    value: /a*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /ab*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /abc
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 4}
",
    );
    assert_eq!(found(&r, "order", &[("path", "/abd")]), Some(per(1, SECOND)));
    assert_eq!(found(&r, "order", &[("path", "/abc")]), Some(per(3, SECOND)));
    assert_eq!(found(&r, "order", &[("path", "/zzz")]), Some(per(4, SECOND)));
    // The second wildcard is found only by its own text.
    assert_eq!(found(&r, "order", &[("path", "/ab*")]), Some(per(2, SECOND)));
}

/// envoy's `test/config/share_threshold.yaml`, in other words.
const SHARED: &str = "
domain: shared
descriptors:
  - key: doc
    value: docs/*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 101
  - key: team
    value: core
    descriptors:
      - key: doc
        value: drafts/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 201
  # One key at two levels, both shared.
  - key: doc
    value: top/*
    share_threshold: true
    descriptors:
      - key: doc
        value: drafts/*
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 301
  # With value_to_metric.
  - key: route
    value: v1/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: verb
        rate_limit:
          unit: minute
          requests_per_unit: 61
  # With detailed_metric below it.
  - key: backend
    value: be/*
    share_threshold: true
    descriptors:
      - key: call
        detailed_metric: true
        rate_limit:
          unit: minute
          requests_per_unit: 81
  # A shared wildcard above one that is not.
  - key: dir
    value: dir/*
    share_threshold: true
    descriptors:
      - key: name
        value: name/*
        share_threshold: false
        descriptors:
          - key: ext
            rate_limit:
              unit: minute
              requests_per_unit: 121
  # Two shared wildcards above a key alone.
  - key: account
    value: acct/*
    share_threshold: true
    descriptors:
      - key: object
        value: obj/*
        share_threshold: true
        descriptors:
          - key: op
            rate_limit:
              unit: minute
              requests_per_unit: 151
  # An exact value before a shared wildcard that also matches it.
  - key: item
    value: sku1
    rate_limit:
      unit: minute
      requests_per_unit: 51
  - key: item
    value: sku*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 102
  # A middle wildcard.
  - key: endpoint
    value: /v*beta
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 103
  # Several stars.
  - key: rpc
    value: pkg*svc*call
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 52
  # A middle wildcard with value_to_metric.
  - key: hook
    value: /hook*v3
    share_threshold: true
    value_to_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 82
  # Nested middle wildcards.
  - key: org
    value: o*live
    share_threshold: true
    descriptors:
      - key: bucket
        value: b*v9
        share_threshold: true
        rate_limit:
          unit: minute
          requests_per_unit: 62
";

/// envoy's `TestShareThreshold` on `share_threshold.yaml`: the rules found, and the levels that
/// share (envoy's `ShareThresholdKeyPattern`).
#[test]
fn share_threshold_config_finds_envoys_rules_and_shared_levels() {
    let r = rules(SHARED);
    let d = "shared";
    let shared = |pairs: &[(&str, &str)]| find(&r, d, pairs).unwrap().shared_levels;
    for value in ["docs/a.pdf", "docs/b.csv", "docs/c.txt"] {
        assert_eq!(found(&r, d, &[("doc", value)]), Some(per(101, MINUTE)), "{value}");
        assert_eq!(shared(&[("doc", value)]), 0b1);
        assert_eq!(place(&r, d, &[("doc", value)]), "shared: doc=docs/*");
    }
    assert_eq!(
        found(&r, d, &[("team", "core"), ("doc", "drafts/1")]),
        Some(per(201, MINUTE))
    );
    assert_eq!(shared(&[("team", "core"), ("doc", "drafts/1")]), 0b10);
    assert_eq!(
        place(&r, d, &[("team", "core"), ("doc", "drafts/1")]),
        "shared: team=core > doc=drafts/*"
    );
    assert_eq!(
        found(&r, d, &[("doc", "top/1"), ("doc", "drafts/1")]),
        Some(per(301, MINUTE))
    );
    assert_eq!(shared(&[("doc", "top/1"), ("doc", "drafts/1")]), 0b11);
    assert_eq!(
        found(&r, d, &[("route", "v1/users"), ("verb", "GET")]),
        Some(per(61, MINUTE))
    );
    assert_eq!(shared(&[("route", "v1/users"), ("verb", "GET")]), 0b1);
    let backend = find(&r, d, &[("backend", "be/users"), ("call", "get")]).unwrap();
    assert!(backend.detailed_metric);
    assert_eq!(backend.shared_levels, 0b1);
    assert_eq!(
        found(&r, d, &[("dir", "dir/a"), ("name", "name/x"), ("ext", "pdf")]),
        Some(per(121, MINUTE))
    );
    assert_eq!(
        shared(&[("dir", "dir/a"), ("name", "name/x"), ("ext", "pdf")]),
        0b001
    );
    assert_eq!(
        found(
            &r,
            d,
            &[("account", "acct/1"), ("object", "obj/1"), ("op", "read")]
        ),
        Some(per(151, MINUTE))
    );
    assert_eq!(
        shared(&[("account", "acct/1"), ("object", "obj/1"), ("op", "read")]),
        0b011
    );
    // The exact value keeps its own limit and shares nothing.
    assert_eq!(found(&r, d, &[("item", "sku1")]), Some(per(51, MINUTE)));
    assert_eq!(shared(&[("item", "sku1")]), 0);
    for value in ["sku2", "sku23", "sku123"] {
        assert_eq!(
            found(&r, d, &[("item", value)]),
            Some(per(102, MINUTE)),
            "{value}"
        );
        assert_eq!(shared(&[("item", value)]), 0b1);
    }
    for value in ["/v1beta", "/v-2-beta", "/vbeta"] {
        assert_eq!(
            found(&r, d, &[("endpoint", value)]),
            Some(per(103, MINUTE)),
            "{value}"
        );
    }
    assert!(found(&r, d, &[("endpoint", "/v1/stable")]).is_none());
    for value in ["pkgAsvcBcall", "pkgXXsvcYYcall", "pkgsvccall"] {
        assert_eq!(found(&r, d, &[("rpc", value)]), Some(per(52, MINUTE)), "{value}");
    }
    assert!(found(&r, d, &[("rpc", "pkgABCcall")]).is_none());
    assert_eq!(found(&r, d, &[("hook", "/hook-a-v3")]), Some(per(82, MINUTE)));
    assert_eq!(
        found(&r, d, &[("org", "o1live"), ("bucket", "bAv9")]),
        Some(per(62, MINUTE))
    );
    assert_eq!(shared(&[("org", "o1live"), ("bucket", "bAv9")]), 0b11);
}

/// envoy's `test/config/metadata.yaml` and `TestMetadata`.
#[test]
fn metadata_config_gives_each_rule_its_metadata() {
    let r = rules(
        "
domain: meta
descriptors:
  - key: app
    value: web
    descriptors:
      - key: session
        rate_limit:
          unit: second
          requests_per_unit: 6
        metadata:
          owner: frontend
      - key: session
        value: bot
        rate_limit:
          unit: second
          requests_per_unit: 60
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 30
    metadata:
      billing:
        plan: enterprise
",
    );
    assert!(found(&r, "meta", &[]).is_none());
    let session = find(&r, "meta", &[("app", "web"), ("session", "s-1")]).unwrap();
    assert_eq!(session.limit, per(6, SECOND).limit);
    assert_eq!(
        session.metadata.as_deref(),
        Some(&map(&[("owner", text("frontend"))]))
    );
    let bot = find(&r, "meta", &[("app", "web"), ("session", "bot")]).unwrap();
    assert_eq!(bot.limit, per(60, SECOND).limit);
    assert_eq!(bot.metadata, None);
    let tenant = find(&r, "meta", &[("tenant", "t-1")]).unwrap();
    assert_eq!(tenant.limit, per(30, MINUTE).limit);
    assert_eq!(
        tenant.metadata.as_deref(),
        Some(&map(&[("billing", map(&[("plan", text("enterprise"))]))]))
    );
}

// ---------------------------------------------------------------------------------------------
// 2. The files envoy refuses: refused, the error naming the field.
// ---------------------------------------------------------------------------------------------

/// Each of envoy's refused files (`TestEmptyDomain`, `TestEmptyKey`, `TestDuplicateKey`,
/// `TestBadLimitUnit`, `TestReplacesSelf`, `TestReplacesEmpty`, `TestBadYaml`,
/// `TestMisspelledKey`, `TestNonStringKey`, `TestNonMapList`,
/// `TestUnlimitedWithRateLimitUnit`, and share_threshold on a value without `*`): the field,
/// and a word of the message.
#[test]
fn envoys_refused_files_are_refused_naming_the_field() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "empty_domain.yaml: no domain at all",
            "descriptors:\n",
            "domain",
            "is missing",
        ),
        (
            "empty_domain.yaml: an empty domain",
            "domain: ''\ndescriptors:\n",
            "domain",
            "empty",
        ),
        (
            "empty_key.yaml: no key",
            "domain: d\ndescriptors:\n  - value: v1\n",
            "descriptors[0].key",
            "is missing",
        ),
        (
            "empty_key.yaml: an empty key, nested",
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: ''\n        value: v\n",
            "descriptors[0].descriptors[0].key",
            "empty",
        ),
        (
            "duplicate_key.yaml",
            "domain: d\ndescriptors:\n  - key: color\n    value: red\n\n  - key: color\n    value: red\n",
            "descriptors[1]",
            "twice",
        ),
        (
            "duplicate_key.yaml: a key alone twice, nested",
            "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: s\n      - key: s\n",
            "descriptors[0].descriptors[1]",
            "twice",
        ),
        (
            "bad_limit_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 9\n",
            "descriptors[0].rate_limit.unit",
            "fortnight",
        ),
        (
            "replaces_self.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: s\n        rate_limit:\n          name: me\n          replaces:\n            - name: me\n          unit: second\n          requests_per_unit: 3\n",
            "descriptors[0].descriptors[0].rate_limit.replaces[0].name",
            "itself",
        ),
        (
            "replaces_self.yaml: among other names",
            "domain: d\ndescriptors:\n  - key: o\n    rate_limit: {name: other, unit: second, requests_per_unit: 1}\n  - key: k\n    rate_limit:\n      name: me\n      replaces: [{name: other}, {name: me}]\n      unit: second\n      requests_per_unit: 3\n",
            "descriptors[1].rate_limit.replaces[1].name",
            "itself",
        ),
        (
            "replaces_empty.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: s\n        rate_limit:\n          name: me\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 3\n",
            "descriptors[0].descriptors[0].rate_limit.replaces[0].name",
            "empty",
        ),
        ("bad_yaml.yaml", "'''\n", "line 2 column 1", "end of stream"),
        (
            "misspelled_key.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    ratelimit:\n      unit: day\n      requests_per_unit: 4\n",
            "descriptors[0].ratelimit",
            "unknown field `ratelimit`",
        ),
        (
            "misspelled_key2.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: day\n      requestsperunit: 4\n",
            "descriptors[0].rate_limit.requestsperunit",
            "unknown field `requestsperunit`",
        ),
        (
            "non_string_key.yaml",
            "0.5: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit:\n      unit: day\n      requests_per_unit: 4\n",
            "0.5",
            "unknown field `0.5`",
        ),
        (
            "non_string_key.yaml: beside a domain",
            "domain: d\n12: d\ndescriptors: []\n",
            "12",
            "unknown field `12`",
        ),
        (
            "non_map_list.yaml",
            "domain: d\ndescriptors:\n  - x\n  - y\n  - z\n",
            "descriptors[0]",
            "invalid type: string \"x\"",
        ),
        (
            "non_map_list.yaml: nested",
            "domain: d\ndescriptors:\n  - key: k\n    descriptors: [1, 2]\n",
            "descriptors[0].descriptors[0]",
            "invalid type: integer",
        ),
        (
            "unlimited_with_unit.yaml",
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 8\n",
            "descriptors[0].rate_limit.unlimited",
            "unlimited",
        ),
        (
            "share_threshold.yaml's rule: an exact value",
            "domain: d\ndescriptors:\n  - key: k\n    value: plain\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
            "descriptors[0].share_threshold",
            "wildcard",
        ),
        (
            "share_threshold.yaml's rule: a key alone, nested",
            "domain: d\ndescriptors:\n  - key: p\n    value: p*\n    share_threshold: true\n    descriptors:\n      - key: k\n        share_threshold: true\n        rate_limit: {unit: minute, requests_per_unit: 1}\n",
            "descriptors[0].descriptors[0].share_threshold",
            "wildcard",
        ),
    ];
    for (envoy_case, yaml, field, word) in cases {
        let e = refused(yaml);
        assert_eq!(e.field, *field, "{envoy_case}: {e}");
        assert!(e.message.contains(word), "{envoy_case}: {e} (wanted {word:?})");
        assert!(!e.to_string().contains('\n'), "{envoy_case}: one line: {e}");
    }
}

/// envoy's `duplicate_domain.yaml` loaded after `basic_config.yaml` (`TestDuplicateDomain`):
/// with merging off, two files of one domain are refused, naming both.
#[test]
fn duplicate_domain_in_two_files_is_refused_naming_both() {
    let second = "domain: shop\ndescriptors:\n";
    let dir = directory(&[("a_basic.yaml", BASIC), ("b_duplicate.yaml", second)]);
    let e = RuleSet::load(dir.path()).unwrap_err();
    match &e {
        LoadError::DuplicateDomain {
            domain,
            first,
            second,
        } => {
            assert_eq!(domain, "shop");
            assert_eq!(first, &dir.path().join("a_basic.yaml"));
            assert_eq!(second, &dir.path().join("b_duplicate.yaml"));
        }
        other => panic!("not a duplicate domain: {other}"),
    }
    assert!(e.to_string().contains("already given"), "{e}");
    // Two domains of one name built in code are refused as well.
    let twice = RuleSet::from_domains(vec![
        sluice_descriptors::parse_domain(BASIC).unwrap(),
        sluice_descriptors::parse_domain(second).unwrap(),
    ])
    .unwrap_err();
    assert_eq!(twice.field, "domain");
    assert!(twice.message.contains("twice"), "{twice}");
}

/// envoy's `merge_domain_key1.yaml` loaded twice with merging on (`TestDuplicateKeyDomainMerge`):
/// one top-level key and value given by two files is refused; the error is the second file's and
/// names the first.
#[test]
fn duplicate_key_across_merged_files_is_refused_naming_both_files() {
    let file = "domain: tiers\ndescriptors:\n  - key: tier\n    value: free\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";
    let other = "domain: tiers\ndescriptors:\n  - key: zone\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: tier\n    value: free\n";
    let dir = directory(&[("one.yaml", file), ("two.yaml", other)]);
    let e = merged(dir.path()).unwrap_err();
    let LoadError::Rules { path, error } = &e else {
        panic!("not a rules error: {e}");
    };
    assert_eq!(path, &dir.path().join("two.yaml"));
    assert_eq!(error.field, "descriptors[1]");
    assert!(error.message.contains("already given"), "{e}");
    let first = dir.path().join("one.yaml");
    assert!(error.message.contains(&first.display().to_string()), "{e}");
    assert!(error.message.contains("descriptors[0]"), "{e}");
    // The same file twice is refused too, as the second file's.
    let dir = directory(&[("one.yaml", file), ("two.yaml", file)]);
    assert!(
        matches!(merged(dir.path()), Err(LoadError::Rules { path, .. }) if path == dir.path().join("two.yaml"))
    );
    // A key alone and that key with a value are two descriptors, in two files as in one.
    let apart =
        "domain: tiers\ndescriptors:\n  - key: tier\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    let dir = directory(&[("one.yaml", file), ("two.yaml", apart)]);
    let r = merged(dir.path()).unwrap();
    assert_eq!(found(&r, "tiers", &[("tier", "free")]), Some(per(10, MINUTE)));
    assert_eq!(found(&r, "tiers", &[("tier", "paid")]), Some(per(1, MINUTE)));
}

// ---------------------------------------------------------------------------------------------
// 3. envoy's example files.
// ---------------------------------------------------------------------------------------------

/// envoy's `examples/ratelimit/config/example.yaml`, in other words: a leading `---`,
/// `replaces` with several names, a limit of 0, shadow mode, unlimited, detailed_metric,
/// quota_mode and metadata with a nested map.
const EXAMPLE: &str = r#"---
domain: demo
descriptors:
  - key: kind
    value: billing
    rate_limit:
      replaces:
        - name: alice_limit
        - name: decoy
      unit: minute
      requests_per_unit: 5
  - key: from
    value: gateway
    descriptors:
      - key: to
        value: alice
        rate_limit:
          replaces:
            - name: alice_limit
          unit: minute
          requests_per_unit: 3
      - key: to
        value: stub
        rate_limit:
          unit: minute
          requests_per_unit: 1
      - key: to
        value: escape
        rate_limit:
          replaces:
            - name: blocked
          unit: minute
          requests_per_unit: 3
      - key: to
        value: decoy
        rate_limit:
          name: decoy
          unit: minute
          requests_per_unit: 3
  - key: outer
    rate_limit:
      unit: minute
      requests_per_unit: 3
    descriptors:
      - key: inner
        rate_limit:
          unit: minute
          requests_per_unit: 4
      - key: inner
        value: alice
        rate_limit:
          name: alice_limit
          unit: minute
          requests_per_unit: 1
      - key: inner
        value: blocked
        rate_limit:
          name: blocked
          unit: minute
          requests_per_unit: 0
      - key: side
        rate_limit:
          unit: second
          requests_per_unit: 2
      - key: side
        value: trusted
        rate_limit:
          unit: minute
          requests_per_unit: 4
      - key: side
        value: suspect
        rate_limit:
          unit: minute
          requests_per_unit: 4
        shadow_mode: true
      - key: free
        rate_limit:
          unlimited: true
  - key: anything
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: open
    rate_limit:
      unlimited: true
  - key: product
    value: product_a
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      product_with_quota:
        name: "product_a"
  - key: product
    value: product_b
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 3
    metadata:
      product_with_quota:
        name: "product_b"
"#;

/// envoy's `examples/ratelimit/config/config.yaml`, in other words: a leading `---` and two
/// values of one key.
const EXAMPLE_CONFIG: &str = "---
domain: orders_db
descriptors:
  - key: table
    value: orders
    rate_limit:
      unit: second
      requests_per_unit: 400

  - key: table
    value: fallback
    rate_limit:
      unit: second
      requests_per_unit: 400
";

/// Both files of envoy's `examples/ratelimit/config/` load, together, each with its features.
#[test]
fn envoys_example_files_load_with_every_feature() {
    let dir = directory(&[("example.yaml", EXAMPLE), ("config.yaml", EXAMPLE_CONFIG)]);
    let r = RuleSet::load(dir.path()).unwrap();
    assert_eq!(r.domains().count(), 2);
    assert_eq!(r.len(), 19);

    let billing = find(&r, "demo", &[("kind", "billing")]).unwrap();
    assert_eq!(billing.replaces, ["alice_limit", "decoy"]);
    assert_eq!(billing.limit, per(5, MINUTE).limit);
    let to_alice = find(&r, "demo", &[("from", "gateway"), ("to", "alice")]).unwrap();
    assert_eq!(to_alice.replaces, ["alice_limit"]);
    let escape = find(&r, "demo", &[("from", "gateway"), ("to", "escape")]).unwrap();
    assert_eq!(escape.replaces, ["blocked"]);
    assert_eq!(
        found(&r, "demo", &[("from", "gateway"), ("to", "stub")]),
        Some(per(1, MINUTE))
    );
    assert_eq!(
        found(&r, "demo", &[("from", "gateway"), ("to", "decoy")]),
        Some(per(3, MINUTE).named("decoy"))
    );
    assert!(found(&r, "demo", &[("from", "gateway"), ("to", "elsewhere")]).is_none());
    assert_eq!(found(&r, "demo", &[("outer", "o")]), Some(per(3, MINUTE)));
    assert_eq!(
        found(&r, "demo", &[("outer", "o"), ("inner", "bob")]),
        Some(per(4, MINUTE))
    );
    assert_eq!(
        found(&r, "demo", &[("outer", "o"), ("inner", "alice")]),
        Some(per(1, MINUTE).named("alice_limit"))
    );
    // requests_per_unit: 0 denies everything.
    let blocked = find(&r, "demo", &[("outer", "o"), ("inner", "blocked")]).unwrap();
    assert_eq!(blocked.limit, Limit::Quota(Quota::deny_all()));
    assert_eq!(blocked.name.as_deref(), Some("blocked"));
    assert_eq!(
        found(&r, "demo", &[("outer", "o"), ("side", "x")]),
        Some(per(2, SECOND))
    );
    assert_eq!(
        found(&r, "demo", &[("outer", "o"), ("side", "trusted")]),
        Some(per(4, MINUTE))
    );
    assert_eq!(
        found(&r, "demo", &[("outer", "o"), ("side", "suspect")]),
        Some(per(4, MINUTE).shadow())
    );
    assert_eq!(
        found(&r, "demo", &[("outer", "o"), ("free", "f")]),
        Some(unlimited())
    );
    assert_eq!(found(&r, "demo", &[("open", "o")]), Some(unlimited()));
    let anything = find(&r, "demo", &[("anything", "v")]).unwrap();
    assert!(anything.detailed_metric);
    for (value, count) in [("product_a", 2), ("product_b", 3)] {
        let product = find(&r, "demo", &[("product", value)]).unwrap();
        assert_eq!(
            found(&r, "demo", &[("product", value)]),
            Some(per(count, MINUTE).quota_mode())
        );
        let inner = map(&[("name", text(value))]);
        assert_eq!(
            product.metadata.as_deref(),
            Some(&map(&[("product_with_quota", inner)]))
        );
    }
    assert!(found(&r, "demo", &[("product", "product_c")]).is_none());

    assert_eq!(
        found(&r, "orders_db", &[("table", "orders")]),
        Some(per(400, SECOND))
    );
    assert_eq!(
        found(&r, "orders_db", &[("table", "fallback")]),
        Some(per(400, SECOND))
    );
    assert!(found(&r, "orders_db", &[("table", "users")]).is_none());
}

// ---------------------------------------------------------------------------------------------
// 4. share_threshold: one counter for every value a shared wildcard matches.
// ---------------------------------------------------------------------------------------------

/// envoy's `TestShareThreshold` (and its cache keys, `base_limiter_test.go`), and README's
/// "Sharing thresholds for wildcard matches".
#[test]
fn shared_wildcards_count_every_matching_value_on_one_counter() {
    let r = rules(SHARED);
    let d = "shared";
    let key = |pairs: &[(&str, &str)]| counter(&r, d, pairs);

    // Values matching a shared wildcard share its counter; so does its own text.
    let docs = key(&[("doc", "docs/a.pdf")]);
    assert_eq!(docs, key(&[("doc", "docs/b.csv")]));
    assert_eq!(docs, key(&[("doc", "docs/*")]));
    assert!(find(&r, d, &[("doc", "docs/a.pdf")]).unwrap().exact);

    // Under a wildcard that does not share, each value counts apart.
    let wild = rules(WILDCARDS);
    assert_ne!(
        counter(&wild, "wild", &[("bucket", "logs1")]),
        counter(&wild, "wild", &[("bucket", "logs2")])
    );
    assert!(!find(&wild, "wild", &[("bucket", "logs1")]).unwrap().exact);

    // An exact value listed before the wildcard keeps its own counter.
    let sku = key(&[("item", "sku2")]);
    assert_eq!(sku, key(&[("item", "sku23")]));
    assert_eq!(sku, key(&[("item", "sku123")]));
    assert_ne!(sku, key(&[("item", "sku1")]));
    // Different shared wildcards, different counters.
    assert_ne!(sku, docs);

    // Nested, both levels shared.
    assert_eq!(
        key(&[("doc", "top/1"), ("doc", "drafts/1")]),
        key(&[("doc", "top/2"), ("doc", "drafts/2")])
    );
    assert_eq!(
        key(&[("org", "o1live"), ("bucket", "bAv9")]),
        key(&[("org", "o99live"), ("bucket", "bBBBv9")])
    );
    // Two shared levels above a key alone: the shared values count as one, the key alone's apart.
    let read = key(&[("account", "acct/1"), ("object", "obj/1"), ("op", "read")]);
    assert_eq!(
        read,
        key(&[("account", "acct/2"), ("object", "obj/9"), ("op", "read")])
    );
    assert_ne!(
        read,
        key(&[("account", "acct/1"), ("object", "obj/1"), ("op", "write")])
    );
    // One level shared, the next not: the keys differ by the unshared value only.
    let pdf = key(&[("dir", "dir/a"), ("name", "name/x"), ("ext", "pdf")]);
    assert_eq!(pdf, key(&[("dir", "dir/b"), ("name", "name/x"), ("ext", "pdf")]));
    assert_ne!(pdf, key(&[("dir", "dir/a"), ("name", "name/y"), ("ext", "pdf")]));
    assert_ne!(pdf, key(&[("dir", "dir/a"), ("name", "name/x"), ("ext", "txt")]));
    // A shared parent above an exact child: one counter for the wildcard's values.
    assert_eq!(
        key(&[("route", "v1/a"), ("verb", "GET")]),
        key(&[("route", "v1/b"), ("verb", "GET")])
    );
    assert_ne!(
        key(&[("route", "v1/a"), ("verb", "GET")]),
        key(&[("route", "v1/a"), ("verb", "PUT")])
    );

    // A middle wildcard, and several stars.
    let beta = key(&[("endpoint", "/v1beta")]);
    assert_eq!(beta, key(&[("endpoint", "/v-2-beta")]));
    assert_eq!(beta, key(&[("endpoint", "/vbeta")]));
    let rpc = key(&[("rpc", "pkgAsvcBcall")]);
    assert_eq!(rpc, key(&[("rpc", "pkgXXsvcYYcall")]));
    assert_eq!(rpc, key(&[("rpc", "pkgsvccall")]));
    assert_eq!(key(&[("hook", "/hook-a-v3")]), key(&[("hook", "/hookv3")]));
}

// ---------------------------------------------------------------------------------------------
// 5. Metric labels: detailed_metric, value_to_metric, share_threshold.
// ---------------------------------------------------------------------------------------------

/// envoy's `TestDetailedMetric`: its four small configs and its "realistic" one.
#[test]
fn detailed_metric_names_every_value_of_the_request() {
    let two_levels = |top: bool, nested: bool| {
        format!(
            "domain: nested\ndescriptors:\n  - key: key-1\n    detailed_metric: {top}\n    rate_limit: {{unit: minute, requests_per_unit: 100}}\n    descriptors:\n      - key: key-2\n        detailed_metric: {nested}\n        rate_limit: {{unit: minute, requests_per_unit: 5}}\n"
        )
    };
    let top_only = [("key-1", "value-1")];
    let both = [("key-1", "value-1"), ("key-2", "value-2")];
    let r = rules(&two_levels(true, false));
    assert_eq!(label(&r, "nested", &top_only).as_deref(), Some("key-1_value-1"));
    let r = rules(&two_levels(false, false));
    assert_eq!(label(&r, "nested", &top_only), None);
    assert_eq!(place(&r, "nested", &top_only), "nested: key-1");
    let r = rules(&two_levels(true, true));
    assert_eq!(
        label(&r, "nested", &both).as_deref(),
        Some("key-1_value-1.key-2_value-2")
    );
    let r = rules(&two_levels(false, false));
    assert_eq!(label(&r, "nested", &both), None);
    assert_eq!(place(&r, "nested", &both), "nested: key-1 > key-2");
    // Whether a label names the values is the found rule's own flag, not its parent's.
    let r = rules(&two_levels(true, false));
    assert_eq!(label(&r, "nested", &both), None);

    let r = rules(
        "
domain: nested
descriptors:
  - key: k1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: k1
    value: fixed-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: k2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: k3
        detailed_metric: true
      - key: k3
        value: wanted
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: k2
    value: special
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: k3
        detailed_metric: true
      - key: k3
        value: wanted
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
",
    );
    assert_eq!(
        label(&r, "nested", &[("k1", "some-k1")]).as_deref(),
        Some("k1_some-k1")
    );
    assert_eq!(label(&r, "nested", &[("k1", "fixed-1")]), None);
    assert_eq!(
        label(&r, "nested", &[("k2", "some-k2")]).as_deref(),
        Some("k2_some-k2")
    );
    let nested = [("k2", "some-k2"), ("k3", "wanted")];
    assert_eq!(found(&r, "nested", &nested), Some(per(5, MINUTE)));
    assert_eq!(
        label(&r, "nested", &nested).as_deref(),
        Some("k2_some-k2.k3_wanted")
    );
    let special = [("k2", "special"), ("k3", "wanted")];
    assert_eq!(found(&r, "nested", &special), Some(per(100, MINUTE)));
    assert_eq!(
        label(&r, "nested", &special).as_deref(),
        Some("k2_special.k3_wanted")
    );
    // A nested key alone with no limit: nothing found.
    assert!(found(&r, "nested", &[("k2", "some-k2"), ("k3", "other")]).is_none());
}

/// Three levels, `value_to_metric` on the first two as asked, a limit on the third.
fn value_to_metric_levels(first: bool, second: bool, leaf_detailed: bool) -> RuleSet {
    rules(&format!(
        "domain: m\ndescriptors:\n  - key: route\n    value_to_metric: {first}\n    descriptors:\n      - key: http_method\n        value_to_metric: {second}\n        descriptors:\n          - key: subject_id\n            detailed_metric: {leaf_detailed}\n            rate_limit: {{unit: minute, requests_per_unit: 60}}\n"
    ))
}

/// envoy's `TestValueToMetric_*` tests, and README's "Including descriptor values in metrics".
#[test]
fn value_to_metric_names_the_request_value_of_each_marked_level() {
    let request = [("route", "draw"), ("http_method", "GET"), ("subject_id", "123")];
    // UsesRuntimeValuesInStats (and FullKeyMatchesStatsKey: one label).
    let r = value_to_metric_levels(true, true, false);
    assert_eq!(
        label(&r, "m", &request).as_deref(),
        Some("route_draw.http_method_GET.subject_id")
    );
    // WithEmptyValue: an empty value adds nothing to its key.
    let empty_route = [("route", ""), ("http_method", "GET"), ("subject_id", "123")];
    assert_eq!(
        label(&r, "m", &empty_route).as_deref(),
        Some("route.http_method_GET.subject_id")
    );
    let empty_method = [("route", "draw"), ("http_method", ""), ("subject_id", "123")];
    assert_eq!(
        label(&r, "m", &empty_method).as_deref(),
        Some("route_draw.http_method.subject_id")
    );
    let empty_both = [("route", ""), ("http_method", ""), ("subject_id", "123")];
    assert_eq!(
        label(&r, "m", &empty_both).as_deref(),
        Some("route.http_method.subject_id")
    );
    // MidLevelOnly.
    let r = value_to_metric_levels(false, true, false);
    assert_eq!(
        label(&r, "m", &request).as_deref(),
        Some("route.http_method_GET.subject_id")
    );
    // DefaultKeyIncludesValueAtThatLevel.
    let r = value_to_metric_levels(true, false, false);
    assert_eq!(
        label(&r, "m", &request).as_deref(),
        Some("route_draw.http_method.subject_id")
    );
    // NoFlag_Unchanged: the rule's own series.
    let r = value_to_metric_levels(false, false, false);
    assert_eq!(label(&r, "m", &request), None);
    assert_eq!(place(&r, "m", &request), "m: route > http_method > subject_id");
    // DoesNotOverrideDetailedMetric: detailed_metric wins, every value is named.
    let r = value_to_metric_levels(true, true, true);
    assert_eq!(
        label(&r, "m", &request).as_deref(),
        Some("route_draw.http_method_GET.subject_id_123")
    );
    let r = value_to_metric_levels(false, false, true);
    assert_eq!(
        label(&r, "m", &request).as_deref(),
        Some("route_draw.http_method_GET.subject_id_123")
    );

    // WithConfiguredValues: a value written is always in; value_to_metric on it changes nothing.
    let r = rules(
        "
domain: m
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
  - key: only_written
    value: fixed
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
",
    );
    let get = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "user123"),
    ];
    assert_eq!(found(&r, "m", &get), Some(per(60, MINUTE)));
    assert_eq!(
        label(&r, "m", &get).as_deref(),
        Some("route_api.http_method_GET.subject_id")
    );
    let post = [
        ("route", "api"),
        ("http_method", "POST"),
        ("subject_id", "user456"),
    ];
    assert_eq!(found(&r, "m", &post), Some(per(30, MINUTE)));
    assert_eq!(
        label(&r, "m", &post).as_deref(),
        Some("route_api.http_method_POST.subject_id")
    );
    assert_eq!(label(&r, "m", &[("only_written", "fixed")]), None);

    // WithWildcard: a wildcard marked value_to_metric names the whole request value.
    let r = rules(
        "
domain: m
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
",
    );
    let alice = [
        ("user", "alice"),
        ("action", "readfile"),
        ("resource", "documents"),
    ];
    assert_eq!(found(&r, "m", &alice), Some(per(100, MINUTE)));
    assert_eq!(
        label(&r, "m", &alice).as_deref(),
        Some("user_alice.action_readfile.resource")
    );
    let bob = [("user", "bob"), ("action", "readdata"), ("resource", "database")];
    assert_eq!(
        label(&r, "m", &bob).as_deref(),
        Some("user_bob.action_readdata.resource")
    );
}

/// envoy's `TestWildcardStatsBehavior`: a wildcard's label for each combination of flags, its
/// star at the end or in the middle.
#[test]
fn wildcard_labels_follow_their_flags_wherever_the_star_is() {
    for wildcard in ["foo*", "foo*bar*"] {
        let one = |flags: &str| {
            rules(&format!(
                "domain: w\ndescriptors:\n  - key: wild\n    value: '{wildcard}'\n{flags}    rate_limit: {{unit: minute, requests_per_unit: 20}}\n"
            ))
        };
        let first = [("wild", "foo1bar1")];
        let second = [("wild", "fooXbarY")];
        // No flags: the rule's own series, named by the wildcard, for every value.
        let r = one("");
        assert_eq!(label(&r, "w", &first), None, "{wildcard}");
        assert_eq!(place(&r, "w", &first), format!("w: wild={wildcard}"));
        assert_eq!(place(&r, "w", &first), place(&r, "w", &second));
        // value_to_metric: the request's value.
        let r = one("    value_to_metric: true\n");
        assert_eq!(
            label(&r, "w", &first).as_deref(),
            Some("wild_foo1bar1"),
            "{wildcard}"
        );
        // share_threshold, with or without value_to_metric: the wildcard, which names the
        // rule's own series already.
        for flags in [
            "    share_threshold: true\n",
            "    share_threshold: true\n    value_to_metric: true\n",
        ] {
            let r = one(flags);
            assert_eq!(label(&r, "w", &first), None, "{wildcard} {flags}");
            assert_eq!(place(&r, "w", &first), format!("w: wild={wildcard}"));
            assert_eq!(place(&r, "w", &second), format!("w: wild={wildcard}"));
        }
        // With detailed_metric too: the wildcard, in a label of the request's own.
        let shared = format!("wild_{wildcard}");
        let r = one("    share_threshold: true\n    detailed_metric: true\n");
        assert_eq!(
            label(&r, "w", &first).as_deref(),
            Some(shared.as_str()),
            "{wildcard}"
        );
        assert_eq!(
            label(&r, "w", &second).as_deref(),
            Some(shared.as_str()),
            "{wildcard}"
        );
    }
    // value_to_metric on another level keeps the wildcard as written.
    let r = rules(
        "
domain: w
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
",
    );
    let request = [("wild", "foo1"), ("other", "bar"), ("limit", "X")];
    assert_eq!(
        label(&r, "w", &request).as_deref(),
        Some("wild_foo*.other_bar.limit")
    );
}

/// envoy's `TestShareThreshold` "share_threshold with metrics" and the middle-wildcard cases, and
/// README: a shared level is named by its wildcard even with value_to_metric or detailed_metric.
#[test]
fn a_shared_level_is_named_by_its_wildcard() {
    let r = rules(SHARED);
    let d = "shared";
    // value_to_metric on a shared wildcard: envoy's key is `route_v1/*.verb`, the place as
    // written, so the rule's own series.
    assert_eq!(label(&r, d, &[("route", "v1/users"), ("verb", "GET")]), None);
    assert_eq!(
        place(&r, d, &[("route", "v1/users"), ("verb", "GET")]),
        "shared: route=v1/* > verb"
    );
    assert_eq!(label(&r, d, &[("hook", "/hook/api/v3")]), None);
    assert_eq!(
        place(&r, d, &[("hook", "/hook-beta-v3")]),
        "shared: hook=/hook*v3"
    );
    // detailed_metric below a shared wildcard: the wildcard, then the request's value.
    assert_eq!(
        label(&r, d, &[("backend", "be/users"), ("call", "get")]).as_deref(),
        Some("backend_be/*.call_get")
    );
    assert_eq!(
        label(&r, d, &[("backend", "be/orders"), ("call", "get")]).as_deref(),
        Some("backend_be/*.call_get")
    );
    // Without a flag the rule's own series, which its place names.
    assert_eq!(label(&r, d, &[("team", "core"), ("doc", "drafts/1")]), None);
    assert_eq!(
        place(&r, d, &[("doc", "top/1"), ("doc", "drafts/1")]),
        "shared: doc=top/* > doc=drafts/*"
    );
    assert_eq!(
        place(&r, d, &[("dir", "dir/a"), ("name", "name/x"), ("ext", "pdf")]),
        "shared: dir=dir/* > name=name/* > ext"
    );
    assert_eq!(
        place(&r, d, &[("org", "o1live"), ("bucket", "bAv9")]),
        "shared: org=o*live > bucket=b*v9"
    );
    assert_eq!(place(&r, d, &[("item", "sku1")]), "shared: item=sku1");
    assert_eq!(place(&r, d, &[("item", "sku2")]), "shared: item=sku*");

    // value_to_metric on a shared wildcard and on a level below it: the wildcard stays, the
    // level below names the request's value.
    let r = rules(
        "
domain: m
descriptors:
  - key: route
    value: v1/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: verb
        value_to_metric: true
        rate_limit: {unit: minute, requests_per_unit: 61}
",
    );
    assert_eq!(
        label(&r, "m", &[("route", "v1/users"), ("verb", "GET")]).as_deref(),
        Some("route_v1/*.verb_GET")
    );
    assert_eq!(
        label(&r, "m", &[("route", "v1/orders"), ("verb", "PUT")]).as_deref(),
        Some("route_v1/*.verb_PUT")
    );
}

// ---------------------------------------------------------------------------------------------
// 6. metadata: what it holds, and its bounds.
// ---------------------------------------------------------------------------------------------

/// One rule with `metadata: <flow>`.
fn with_metadata(flow: &str) -> String {
    format!(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n    metadata: {flow}\n"
    )
}

/// `metadata:` read as envoy reads it into a protobuf `Struct`: numbers as f64, every YAML kind.
#[test]
fn metadata_holds_maps_lists_numbers_bools_strings_and_nulls() {
    let r = rules(
        "
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata:
      name: checkout
      quoted: '42'
      count: 7
      ratio: 0.25
      negative: -3
      enabled: true
      nothing: ~
      tags: [a, 2, false, {deep: [x]}]
      owner:
        team: payments
        oncall:
          primary: ann
      9: nine
",
    );
    let metadata = r.rules().next().unwrap().metadata.as_deref().cloned();
    let expected = map(&[
        ("name", text("checkout")),
        ("quoted", text("42")),
        ("count", Metadata::Number(7.0)),
        ("ratio", Metadata::Number(0.25)),
        ("negative", Metadata::Number(-3.0)),
        ("enabled", Metadata::Bool(true)),
        ("nothing", Metadata::Null),
        (
            "tags",
            Metadata::List(vec![
                text("a"),
                Metadata::Number(2.0),
                Metadata::Bool(false),
                map(&[("deep", Metadata::List(vec![text("x")]))]),
            ]),
        ),
        (
            "owner",
            map(&[
                ("team", text("payments")),
                ("oncall", map(&[("primary", text("ann"))])),
            ]),
        ),
        ("9", text("nine")),
    ]);
    assert_eq!(metadata, Some(expected));
    // `metadata:` with nothing is none.
    assert_eq!(rules(&with_metadata("~")).rules().next().unwrap().metadata, None);
}

/// envoy parses `metadata` into a map: anything else is refused, naming the field.
#[test]
fn metadata_that_is_not_a_map_is_refused() {
    for flow in ["[1, 2]", "just text", "3", "true"] {
        let e = refused(&with_metadata(flow));
        assert_eq!(e.field, "descriptors[0].metadata", "{flow}: {e}");
        assert!(e.message.contains("map"), "{flow}: {e}");
    }
    let nested = refused(
        "domain: d\ndescriptors:\n  - key: a\n  - key: b\n    descriptors:\n      - key: c\n        metadata: [x]\n",
    );
    assert_eq!(nested.field, "descriptors[1].descriptors[0].metadata");
    // A key that is itself a list or a map has no text.
    let e = refused(&with_metadata("{[a]: 1}"));
    assert!(e.field.starts_with("descriptors[0].metadata"), "{e}");
    assert!(e.message.contains("key"), "{e}");
}

/// `n` maps nested in one another around a number: the number is `n` levels deep.
fn nested_maps(n: usize) -> String {
    format!("{}1{}", "{k: ".repeat(n), "}".repeat(n))
}

/// [`MAX_METADATA_DEPTH`] and [`MAX_METADATA_ITEMS`]: at the bound loads, past it is refused with
/// a clear error; deep nesting and alias bombs end in an error, not a stack overflow.
#[test]
fn metadata_past_its_depth_or_size_is_refused() {
    assert!(RuleSet::from_yaml(&with_metadata(&nested_maps(MAX_METADATA_DEPTH))).is_ok());
    let e = refused(&with_metadata(&nested_maps(MAX_METADATA_DEPTH + 1)));
    assert!(e.field.starts_with("descriptors[0].metadata.k"), "{e}");
    assert!(
        e.message.contains(&format!("deeper than {MAX_METADATA_DEPTH}")),
        "{e}"
    );

    // The top map, its key and its list are three items: then the list's own.
    let list = |n: usize| format!("{{a: [{}]}}", vec!["1"; n].join(", "));
    assert!(RuleSet::from_yaml(&with_metadata(&list(MAX_METADATA_ITEMS - 3))).is_ok());
    let e = refused(&with_metadata(&list(MAX_METADATA_ITEMS - 2)));
    assert!(e.field.starts_with("descriptors[0].metadata.a["), "{e}");
    assert!(
        e.message
            .contains(&format!("more than {MAX_METADATA_ITEMS} items")),
        "{e}"
    );

    // Aliases are counted as they expand: ten thousand items from a few lines.
    let bomb = "{a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]}";
    let e = refused(&with_metadata(bomb));
    assert!(e.message.contains("items"), "{e}");

    // Far deeper than any bound, as maps and as lists: an error, and the stack holds.
    let e = refused(&with_metadata(&nested_maps(2_000)));
    assert!(e.message.contains("deeper"), "{e}");
    let lists = format!("{{a: {}{}}}", "[".repeat(2_000), "]".repeat(2_000));
    let e = refused(&with_metadata(&lists));
    assert!(e.message.contains("deeper"), "{e}");
    // Descriptors nested far past MAX_DEPTH: the YAML reader's own bound stops them first.
    let deep = (0..300).fold(String::from("domain: d\ndescriptors:\n"), |mut text, level| {
        let pad = "  ".repeat(2 * level);
        text.push_str(&format!("{pad}  - key: k{level}\n{pad}    descriptors:\n"));
        text
    });
    let e = refused(&deep);
    assert!(e.message.contains("recursion limit"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// 7. Merging: any split of a domain's top-level descriptors over files is the one file.
// ---------------------------------------------------------------------------------------------

/// One level of a generated descriptor: its key and value (none: the key alone).
type Step = (String, Option<String>);

/// A generated top-level descriptor: its step, its limit if it has one, its nested descriptors
/// (each a step and a limit if it has one), and the file it goes in.
#[derive(Debug, Clone)]
struct Top {
    step: Step,
    limit: Option<u32>,
    children: Vec<(Step, Option<u32>)>,
    file: usize,
}

fn step_strategy() -> impl Strategy<Value = Step> {
    (
        prop::sample::select(vec!["a", "b", "c"]),
        prop::option::of(prop::sample::select(vec!["x", "y", "x*", "*y", "x*y", "*"])),
    )
        .prop_map(|(key, value)| (key.to_owned(), value.map(str::to_owned)))
}

/// One descriptor as YAML, at `indent`.
fn descriptor_yaml(out: &mut String, indent: usize, (key, value): &Step, limit: Option<u32>) {
    let pad = " ".repeat(indent);
    out.push_str(&format!("{pad}- key: \"{key}\"\n"));
    if let Some(value) = value {
        out.push_str(&format!("{pad}  value: \"{value}\"\n"));
    }
    if let Some(count) = limit {
        out.push_str(&format!(
            "{pad}  rate_limit: {{unit: second, requests_per_unit: {count}}}\n"
        ));
    }
}

/// A file of domain `d` holding `tops`.
fn file_yaml<'a>(tops: impl Iterator<Item = &'a Top>) -> String {
    let mut out = String::from("domain: d\ndescriptors:\n");
    for top in tops {
        descriptor_yaml(&mut out, 2, &top.step, top.limit);
        if !top.children.is_empty() {
            out.push_str("    descriptors:\n");
            for (step, limit) in &top.children {
                descriptor_yaml(&mut out, 6, step, *limit);
            }
        }
    }
    out
}

/// Top-level descriptors with distinct steps, each with distinct nested steps and its own
/// limits (so a rule is told by its limit), spread over three files.
fn tops_strategy() -> impl Strategy<Value = Vec<Top>> {
    let child = (step_strategy(), prop::option::of(Just(())));
    let top = (
        step_strategy(),
        any::<bool>(),
        prop::collection::vec(child, 0..4),
        0..3usize,
    );
    prop::collection::vec(top, 1..10).prop_map(|generated| {
        let mut tops: Vec<Top> = Vec::new();
        let mut next = 0;
        let mut count = || {
            next += 1;
            next
        };
        for (step, limited, children, file) in generated {
            if tops.iter().any(|top| top.step == step) {
                continue;
            }
            let mut kept: Vec<(Step, Option<u32>)> = Vec::new();
            for (step, limited) in children {
                if !kept.iter().any(|(s, _)| *s == step) {
                    kept.push((step, limited.map(|()| count())));
                }
            }
            tops.push(Top {
                step,
                limit: limited.then(&mut count),
                children: kept,
                file,
            });
        }
        tops
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// envoy's domain merging (`TestDomainMerge`): files of one domain with distinct top-level
    /// (key, value) pairs find what one file holding all their descriptors, in the files'
    /// order, finds.
    #[test]
    fn merged_files_find_what_one_file_of_all_their_descriptors_finds(
        tops in tops_strategy(),
        requests in prop::collection::vec(
            prop::collection::vec(
                (prop::sample::select(vec!["a", "b", "c"]), prop::sample::select(vec!["x", "y", "xy", "xzy", "z", "", "x*", "*"])),
                1..3,
            ),
            1..24,
        ),
    ) {
        let files: Vec<String> = (0..3)
            .map(|file| file_yaml(tops.iter().filter(|top| top.file == file)))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        for (i, text) in files.iter().enumerate() {
            std::fs::write(dir.path().join(format!("{i:02}.yaml")), text).unwrap();
        }
        let mut in_file_order = tops.clone();
        in_file_order.sort_by_key(|top| top.file);
        let one = file_yaml(in_file_order.iter());
        let merged = merged(dir.path()).unwrap();
        let whole = rules(&one);
        prop_assert_eq!(merged.len(), whole.len());
        for request in &requests {
            let entries = entries(request);
            let (a, b) = (merged.find("d", &entries), whole.find("d", &entries));
            prop_assert_eq!(
                a.map(|rule| (&rule.id, rule.limit)),
                b.map(|rule| (&rule.id, rule.limit)),
                "{:?}\nfiles:\n{}\none file:\n{}", request, files.join("---\n"), one
            );
        }
    }
}

/// A split the property above may miss: the wildcard of the first file read comes first, as in
/// one file.
#[test]
fn merged_files_keep_their_wildcards_in_file_order() {
    let tops = [
        Top {
            step: ("a".into(), Some("x*".into())),
            limit: Some(1),
            children: vec![],
            file: 0,
        },
        Top {
            step: ("a".into(), Some("*".into())),
            limit: Some(2),
            children: vec![(("b".into(), None), Some(3))],
            file: 1,
        },
    ];
    let dir = directory(&[
        ("00.yaml", file_yaml(tops.iter().filter(|t| t.file == 0)).as_str()),
        ("01.yaml", file_yaml(tops.iter().filter(|t| t.file == 1)).as_str()),
    ]);
    let r = merged(dir.path()).unwrap();
    assert_eq!(found(&r, "d", &[("a", "xy")]), Some(per(1, SECOND)));
    assert_eq!(found(&r, "d", &[("a", "zy")]), Some(per(2, SECOND)));
    assert_eq!(found(&r, "d", &[("a", "zy"), ("b", "q")]), Some(per(3, SECOND)));
}
