//! A descriptor rules file, as the loader reads it (`sluice_descriptors::parse_domain`, what
//! `RuleSet::load` does with each file's text).

use std::collections::HashSet;

use sluice_descriptors::{
    DomainRules, Entry, MAX_DEPTH, MAX_DESCRIPTORS, MAX_METADATA_DEPTH, MAX_METADATA_ITEMS, MAX_TEXT_BYTES,
    Metadata, Rule, RuleSet, counter_key, parse_domain,
};

/// Between a key and its value in a rule's place (`RuleId`).
const PAIR: char = '\u{1e}';
/// Between levels of a rule's place.
const LEVEL: char = '\u{1f}';
/// Escapes the next character of a rule's place.
const ESCAPE: char = '\\';

/// `data` as a rules file: never a panic; a refusal names a field and what is wrong, on one
/// line; accepted rules keep the bounds (a domain name and every key and value of at most
/// `MAX_TEXT_BYTES`, at most `MAX_DESCRIPTORS` descriptors, `MAX_DEPTH` levels), rule names
/// are unique and every name a rule `replaces` is one of them, a rule whose every level is an
/// exact value is the one its own path finds, envoy ratelimit's fields keep their meaning
/// (shared levels are wildcards whose values share a counter, no rule replaces itself,
/// metadata within its bounds), and reading the file again gives the same rules.
///
/// # Example
/// ```
/// sluice_invariants::descriptor_rules(b"domain: d\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
/// sluice_invariants::descriptor_rules(b"domain: d\ndescriptors: [{key: k, rate_limit: {unit: aeon}}]");
/// ```
pub fn descriptor_rules(data: &[u8]) {
    // The loader reads files as UTF-8 and refuses others as unreadable.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let domain = match parse_domain(text) {
        Ok(domain) => domain,
        Err(e) => {
            assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
            let line = e.to_string();
            assert!(!line.contains(['\n', '\r']), "not one line: {line:?}");
            return;
        }
    };
    let name = domain.name();
    assert!(!name.is_empty() && name.len() <= MAX_TEXT_BYTES, "{name:?}");
    let rules = sorted(&domain);
    assert!(rules.len() <= MAX_DESCRIPTORS);
    let names: Vec<&str> = rules.iter().filter_map(|r| r.name.as_deref()).collect();
    let unique: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "a name given twice: {names:?}");
    for rule in &rules {
        for replaced in &rule.replaces {
            assert!(
                unique.contains(replaced.as_str()),
                "{} replaces {replaced:?}",
                rule.id
            );
        }
        let path = place(rule.id.as_str());
        assert_eq!(path.first().map(|(d, _)| d.as_str()), Some(name), "{}", rule.id);
        let levels = &path[1..];
        assert!(
            (1..=MAX_DEPTH).contains(&levels.len()),
            "{}: {} levels",
            rule.id,
            levels.len()
        );
        for (key, value) in levels {
            assert!(!key.is_empty() && key.len() <= MAX_TEXT_BYTES, "{}", rule.id);
            assert!(
                value.as_ref().is_none_or(|v| v.len() <= MAX_TEXT_BYTES),
                "{}",
                rule.id
            );
        }
        check_envoy_fields(rule, levels);
        if rule.exact {
            let entries: Vec<Entry<'_>> = levels
                .iter()
                .map(|(key, value)| Entry {
                    key,
                    value: value.as_deref().unwrap_or_default(),
                })
                .collect();
            let found = domain.find(&entries).map(|r| &r.id);
            assert_eq!(found, Some(&rule.id), "an exact rule not found by its own path");
        }
    }
    match parse_domain(text) {
        Ok(again) => assert_eq!(sorted(&again), rules, "read twice, two rule sets"),
        Err(e) => panic!("read twice, refused the second time: {e}"),
    }
    match RuleSet::from_domains(vec![domain]) {
        Ok(set) => assert_eq!(set.len(), rules.len()),
        Err(e) => panic!("one domain refused as a set: {e}"),
    }
}

/// envoy ratelimit's fields on an accepted rule: its path as written is its place; a shared
/// level is a wildcard and its values share the counter; a `value_to_metric` level is a key
/// alone or an unshared wildcard; no rule replaces itself; metadata keeps its bounds.
fn check_envoy_fields(rule: &Rule, levels: &[(String, Option<String>)]) {
    assert_eq!(&rule.path[..], levels, "{}: path and place differ", rule.id);
    for (i, (key, value)) in levels.iter().enumerate() {
        let bit = 1u32 << i;
        let wildcard = value.as_deref().is_some_and(|v| v.contains('*'));
        if rule.shared_levels & bit != 0 {
            assert!(wildcard, "{}: level {i} shared without a wildcard", rule.id);
        }
        if rule.value_to_metric_levels & bit != 0 {
            assert!(
                (value.is_none() || wildcard) && rule.shared_levels & bit == 0,
                "{}: level {i} names the metric by value",
                rule.id
            );
        }
        assert!(!key.is_empty());
    }
    let deeper = !0u32.checked_shl(levels.len() as u32).map_or(0, |mask| !mask);
    assert_eq!(rule.shared_levels & deeper, 0, "{}", rule.id);
    assert_eq!(rule.value_to_metric_levels & deeper, 0, "{}", rule.id);
    if rule.shared_levels != 0 && !rule.exact {
        // Two requests that differ only at shared levels count on one counter.
        let own: Vec<Entry<'_>> = levels
            .iter()
            .map(|(key, value)| Entry {
                key,
                value: value.as_deref().unwrap_or("v"),
            })
            .collect();
        let other_values: Vec<String> = levels
            .iter()
            .enumerate()
            .map(|(i, (_, value))| match value {
                Some(v) if rule.shared_levels & (1 << i) != 0 => format!("{v}{v}"),
                Some(v) => v.clone(),
                None => "v".to_owned(),
            })
            .collect();
        let other: Vec<Entry<'_>> = levels
            .iter()
            .zip(&other_values)
            .map(|((key, _), value)| Entry { key, value })
            .collect();
        assert_eq!(counter_key(rule, &own), counter_key(rule, &other), "{}", rule.id);
    }
    if let Some(name) = &rule.name {
        assert!(!rule.replaces.contains(name), "{} replaces itself", rule.id);
    }
    if let Some(metadata) = &rule.metadata {
        let (depth, items) = measure(metadata);
        assert!(
            depth <= MAX_METADATA_DEPTH + 1 && items <= MAX_METADATA_ITEMS,
            "{}",
            rule.id
        );
    }
}

/// A metadata tree's depth (a scalar is 1) and items (keys not counted).
fn measure(metadata: &Metadata) -> (usize, usize) {
    let children: Vec<(usize, usize)> = match metadata {
        Metadata::List(items) => items.iter().map(measure).collect(),
        Metadata::Map(fields) => fields.values().map(measure).collect(),
        _ => Vec::new(),
    };
    let depth = children.iter().map(|(d, _)| *d).max().unwrap_or(0) + 1;
    (depth, 1 + children.iter().map(|(_, n)| n).sum::<usize>())
}

fn sorted(domain: &DomainRules) -> Vec<Rule> {
    let mut rules: Vec<Rule> = domain.rules().cloned().collect();
    rules.sort_by(|a, b| a.id.cmp(&b.id));
    rules
}

/// A rule's place read back: the domain first (as a key without a value), then each level's
/// key and value, escapes removed.
fn place(id: &str) -> Vec<(String, Option<String>)> {
    let mut levels = Vec::new();
    let (mut key, mut value) = (String::new(), None::<String>);
    let mut escaped = false;
    for c in id.chars() {
        match c {
            _ if escaped => escaped = false,
            ESCAPE => {
                escaped = true;
                continue;
            }
            LEVEL => {
                levels.push((std::mem::take(&mut key), value.take()));
                continue;
            }
            PAIR if value.is_none() => {
                value = Some(String::new());
                continue;
            }
            _ => {}
        }
        value.as_mut().unwrap_or(&mut key).push(c);
    }
    levels.push((key, value));
    levels
}
