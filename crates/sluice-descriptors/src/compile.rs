//! A rules file compiled into a domain's tree: every field checked (units, both-or-neither,
//! `replaces` naming a limit of the domain, unique names, sibling duplicates, depth, sizes),
//! the error naming the field's path.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sluice::{AlgorithmKind, Quota};

use crate::error::RulesError;
use crate::key::RuleId;
use crate::raw::{RawDescriptor, RawDomain, RawRateLimit};
use crate::rules::{DomainRules, Level, Limit, MAX_DEPTH, MAX_DESCRIPTORS, MAX_TEXT_BYTES, Node, Rule};

/// Reads one domain's rules from a file's text.
///
/// # Errors
/// The text is not such a file: the error names the field (`descriptors[2].rate_limit.unit`).
///
/// # Example
/// ```
/// let domain = sluice_descriptors::parse_domain("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60}\n")?;
/// assert_eq!(domain.name(), "edge");
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
pub fn parse_domain(text: &str) -> Result<DomainRules, RulesError> {
    let deserializer = serde_norway::Deserializer::from_str(text);
    let raw: RawDomain = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // A path that names nothing (the top, or a field whose name is empty) gives way to
        // the place in the file.
        let nameless = path == "." || path.is_empty();
        let field = match inner.location() {
            Some(at) if nameless || path.contains('?') => {
                format!("line {} column {}", at.line(), at.column())
            }
            _ if nameless => "file".to_string(),
            _ => path,
        };
        let message = inner.to_string();
        let message = match message.split_once(" at line ") {
            Some((head, _)) => head.to_string(),
            None => message,
        };
        // The YAML reader names the parent again: the field says it already.
        let message = match message.split_once(": ") {
            Some((parent, rest)) if !parent.contains(' ') && field.starts_with(parent) => rest.to_string(),
            _ => message,
        };
        RulesError::new(field, message)
    })?;
    compile(raw)
}

fn compile(raw: RawDomain) -> Result<DomainRules, RulesError> {
    if raw.domain.is_empty() {
        return Err(RulesError::new("domain", "is empty"));
    }
    if raw.domain.len() > MAX_TEXT_BYTES {
        return Err(RulesError::new(
            "domain",
            format!("longer than {MAX_TEXT_BYTES} bytes"),
        ));
    }
    let mut builder = Builder {
        nodes: Vec::new(),
        names: HashMap::new(),
        replacing: Vec::new(),
    };
    let top = builder.level(&raw.descriptors, &RuleId::domain(&raw.domain), "", 1, true)?;
    // Every name a rule replaces must be a limit of this domain.
    for (here, names) in &builder.replacing {
        for (i, name) in names.iter().enumerate() {
            if !builder.names.contains_key(name) {
                return Err(RulesError::new(
                    format!("{here}.rate_limit.replaces[{i}].name"),
                    format!("no limit of this domain is named '{name}'"),
                ));
            }
        }
    }
    Ok(DomainRules {
        name: raw.domain,
        nodes: builder.nodes,
        top,
    })
}

struct Builder {
    nodes: Vec<Node>,
    /// Limit names, with the path of the descriptor giving each.
    names: HashMap<String, String>,
    /// The names each replacing rule replaces, by its path.
    replacing: Vec<(String, Vec<String>)>,
}

impl Builder {
    /// One level's descriptors under `parent`; `exact`: every level above is an exact value.
    fn level(
        &mut self,
        descriptors: &[RawDescriptor],
        parent: &RuleId,
        path: &str,
        depth: usize,
        exact: bool,
    ) -> Result<Level, RulesError> {
        let mut level = Level::default();
        let mut seen = HashSet::new();
        for (i, raw) in descriptors.iter().enumerate() {
            let here = if path.is_empty() {
                format!("descriptors[{i}]")
            } else {
                format!("{path}.descriptors[{i}]")
            };
            if depth > MAX_DEPTH {
                return Err(RulesError::new(
                    here,
                    format!("nested deeper than {MAX_DEPTH} levels"),
                ));
            }
            if self.nodes.len() >= MAX_DESCRIPTORS {
                return Err(RulesError::new(
                    here,
                    format!("more than {MAX_DESCRIPTORS} descriptors in one domain"),
                ));
            }
            if raw.key.is_empty() {
                return Err(RulesError::new(format!("{here}.key"), "is empty"));
            }
            if raw.key.len() > MAX_TEXT_BYTES {
                return Err(RulesError::new(
                    format!("{here}.key"),
                    format!("longer than {MAX_TEXT_BYTES} bytes"),
                ));
            }
            if let Some(value) = &raw.value
                && value.len() > MAX_TEXT_BYTES
            {
                return Err(RulesError::new(
                    format!("{here}.value"),
                    format!("longer than {MAX_TEXT_BYTES} bytes"),
                ));
            }
            if !seen.insert((raw.key.as_str(), raw.value.as_deref())) {
                let what = match &raw.value {
                    Some(value) => format!("key '{}' with value '{value}'", raw.key),
                    None => format!("key '{}' without a value", raw.key),
                };
                return Err(RulesError::new(
                    here,
                    format!("{what} is given twice at this level"),
                ));
            }
            let id = parent.child(&raw.key, raw.value.as_deref());
            let exact = exact && raw.value.as_deref().is_some_and(|value| !value.ends_with('*'));
            let rule = match &raw.rate_limit {
                Some(limit) => Some(self.rule(limit, raw, &id, &here, exact)?),
                None => None,
            };
            let children = self.level(&raw.descriptors, &id, &here, depth + 1, exact)?;
            let index = self.nodes.len();
            self.nodes.push(Node { rule, children });
            let key = raw.key.clone();
            match raw.value.as_deref() {
                None => {
                    level.key_only.insert(key, index);
                }
                Some(value) => match value.strip_suffix('*') {
                    Some(prefix) => {
                        let prefixes = level.wildcard.entry(key).or_default();
                        prefixes.push((prefix.to_owned(), index));
                        prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
                    }
                    None => {
                        level
                            .exact
                            .entry(key)
                            .or_default()
                            .insert(value.to_owned(), index);
                    }
                },
            }
        }
        Ok(level)
    }

    fn rule(
        &mut self,
        raw: &RawRateLimit,
        descriptor: &RawDescriptor,
        id: &RuleId,
        here: &str,
        exact: bool,
    ) -> Result<Rule, RulesError> {
        let field = |name: &str| format!("{here}.rate_limit.{name}");
        let counted = raw.unit.is_some() || raw.requests_per_unit.is_some();
        let limit = match (raw.unlimited, &raw.quota, counted) {
            (true, None, false) => Limit::Unlimited,
            (true, _, _) => {
                return Err(RulesError::new(
                    field("unlimited"),
                    "an unlimited rule has no requests_per_unit, unit or quota",
                ));
            }
            (false, Some(_), true) => {
                return Err(RulesError::new(
                    field("quota"),
                    "give either quota or requests_per_unit with unit, not both",
                ));
            }
            (false, Some(text), false) => {
                Limit::Quota(text.parse().map_err(|e| RulesError::new(field("quota"), e))?)
            }
            (false, None, true) => {
                let Some(unit) = &raw.unit else {
                    return Err(RulesError::new(
                        field("unit"),
                        "missing (second, minute, hour, day, week, month or year)",
                    ));
                };
                let seconds = unit_seconds(unit).ok_or_else(|| {
                    RulesError::new(
                        field("unit"),
                        format!("unknown unit '{unit}' (use second, minute, hour, day, week, month or year)"),
                    )
                })?;
                let Some(count) = raw.requests_per_unit else {
                    return Err(RulesError::new(field("requests_per_unit"), "missing"));
                };
                let quota = if count == 0 {
                    Quota::deny_all()
                } else {
                    Quota::new(u64::from(count), Duration::from_secs(seconds))
                        .map_err(|e| RulesError::new(field("requests_per_unit"), e))?
                };
                Limit::Quota(quota)
            }
            (false, None, false) => {
                return Err(RulesError::new(
                    format!("{here}.rate_limit"),
                    "needs requests_per_unit and unit, a quota, or unlimited: true",
                ));
            }
        };
        let algorithm = raw
            .algorithm
            .as_deref()
            .map(|text| {
                text.parse::<AlgorithmKind>()
                    .map_err(|e| RulesError::new(field("algorithm"), e))
            })
            .transpose()?;
        if let (Limit::Quota(quota), Some(kind)) = (limit, algorithm) {
            kind.check(&quota)
                .map_err(|e| RulesError::new(field("quota"), format!("{kind} cannot hold {quota}: {e}")))?;
        }
        if let Some(name) = &raw.name {
            if name.is_empty() {
                return Err(RulesError::new(field("name"), "is empty"));
            }
            if let Some(first) = self.names.insert(name.clone(), here.to_owned()) {
                return Err(RulesError::new(
                    field("name"),
                    format!("'{name}' is already the name of {first}"),
                ));
            }
        }
        let replaces: Vec<String> = raw.replaces.iter().map(|r| r.name.clone()).collect();
        if !replaces.is_empty() {
            self.replacing.push((here.to_owned(), replaces.clone()));
        }
        Ok(Rule {
            id: id.clone(),
            limit,
            algorithm,
            name: raw.name.clone(),
            replaces,
            shadow_mode: descriptor.shadow_mode,
            detailed_metric: descriptor.detailed_metric,
            exact,
        })
    }
}

/// The units of envoy's rules and their lengths in seconds, shortest first: a week is 7 days,
/// a month 30, a year 365. The one table of them (the RLS wire's units read it too).
pub const UNITS: [(&str, u64); 7] = [
    ("second", 1),
    ("minute", 60),
    ("hour", 3_600),
    ("day", 86_400),
    ("week", 7 * 86_400),
    ("month", 30 * 86_400),
    ("year", 365 * 86_400),
];

/// A unit's length in seconds ([`UNITS`]), in any case, as configs write `SECOND` as often as
/// `second`.
///
/// # Example
/// ```
/// assert_eq!(sluice_descriptors::unit_seconds("MINUTE"), Some(60));
/// assert_eq!(sluice_descriptors::unit_seconds("fortnight"), None);
/// ```
pub fn unit_seconds(unit: &str) -> Option<u64> {
    (UNITS.iter())
        .find(|(name, _)| name.eq_ignore_ascii_case(unit))
        .map(|(_, seconds)| *seconds)
}
