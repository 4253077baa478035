//! A rules file (or the files of one merged domain) compiled into a domain's tree: every field
//! checked (units, both-or-neither, `replaces` naming another limit of the domain, unique
//! names, sibling duplicates, `share_threshold` only on wildcards, depth, sizes), the error
//! naming the field's path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sluice::{AlgorithmKind, Quota};

use crate::error::RulesError;
use crate::key::RuleId;
use crate::raw::{QuotaTexts, RawDescriptor, RawDomain, RawRateLimit};
use crate::rules::{
    DomainRules, Level, Limit, MAX_DEPTH, MAX_DESCRIPTORS, MAX_STACKED, MAX_TEXT_BYTES, Node, Rule, Wildcard,
};

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
    compile(vec![read(text)?]).map_err(|(_, error)| error)
}

/// The deepest nesting of flow collections (`[`, `{`) a rules file may have: twice
/// [`MAX_DEPTH`] for descriptors written in flow style, and room for their metadata.
pub const MAX_FLOW_NESTING: usize = 128;

/// Refuses a text whose flow collections nest deeper than [`MAX_FLOW_NESTING`], before the
/// YAML reader sees it: reading a deeply nested text takes time quadratic in its depth. A
/// quote opens a quoted scalar only where a token starts, as in YAML, so brackets inside one
/// are not counted and brackets in plain text are; a quote is taken to end with its line (a
/// line of a block scalar that looks like a quote hides nothing on the next), which can only
/// count more than there is.
fn check_flow_nesting(text: &str) -> Result<(), RulesError> {
    let (mut depth, mut line, mut column) = (0usize, 1usize, 0usize);
    let mut token_start = true;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        column += 1;
        match c {
            '\n' => {
                (line, column, token_start) = (line + 1, 0, true);
                continue;
            }
            '#' if token_start => {
                // A comment, to the end of the line.
                while chars.next_if(|&c| c != '\n').is_some() {}
                continue;
            }
            '\'' | '"' if token_start => {
                // A quoted scalar: '' escapes a single quote, \ escapes in a double-quoted one.
                while let Some(q) = chars.next_if(|&q| q != '\n') {
                    column += 1;
                    if c == '"' && q == '\\' {
                        if chars.next_if(|&q| q != '\n').is_some() {
                            column += 1;
                        }
                    } else if q == c {
                        if c == '\'' && chars.peek() == Some(&'\'') {
                            chars.next();
                            column += 1;
                        } else {
                            break;
                        }
                    }
                }
                token_start = false;
                continue;
            }
            '[' | '{' => {
                depth += 1;
                if depth > MAX_FLOW_NESTING {
                    return Err(RulesError::new(
                        format!("line {line} column {column}"),
                        format!("nested deeper than {MAX_FLOW_NESTING} levels"),
                    ));
                }
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        token_start = matches!(c, ' ' | '\t' | '[' | '{' | ',' | ':' | '-' | '?');
    }
    Ok(())
}

/// A rules file's text as written, every field's type checked.
pub(crate) fn read(text: &str) -> Result<RawDomain, RulesError> {
    check_flow_nesting(text)?;
    let deserializer = serde_norway::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let named = path.clone();
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
        // A missing field is named as the field.
        if let Some(name) = (message.strip_prefix("missing field `"))
            .and_then(|rest| rest.strip_suffix('`'))
            .filter(|name| !name.contains('`'))
        {
            let field = if nameless {
                name.to_owned()
            } else {
                format!("{named}.{name}")
            };
            return RulesError::new(field, "is missing");
        }
        RulesError::new(field, message)
    })
}

/// One domain's rules from the files giving it (one, unless domains are merged: then each
/// file's top-level descriptors are added to the others', as envoy ratelimit's
/// `MERGE_DOMAIN_CONFIG` does). An error comes with the index of the file it is in.
pub(crate) fn compile(files: Vec<RawDomain>) -> Result<DomainRules, (usize, RulesError)> {
    let Some(first) = files.first() else {
        return Err((0, RulesError::new("domain", "is missing")));
    };
    let name = first.domain.clone();
    if name.is_empty() {
        return Err((0, RulesError::new("domain", "is empty")));
    }
    if name.len() > MAX_TEXT_BYTES {
        return Err((
            0,
            RulesError::new("domain", format!("longer than {MAX_TEXT_BYTES} bytes")),
        ));
    }
    let mut builder = Builder {
        nodes: Vec::new(),
        names: HashMap::new(),
        replacing: Vec::new(),
        file: 0,
        files: files.len(),
    };
    let top_id = RuleId::domain(&name);
    let mut top = Level::default();
    let mut seen = HashMap::new();
    for (file, raw) in files.iter().enumerate() {
        builder.file = file;
        let at = Place {
            id: top_id.clone(),
            path: Vec::new(),
            here: String::new(),
            fixed: true,
            shared: 0,
            value_to_metric: 0,
        };
        builder
            .level(&mut top, &mut seen, &raw.descriptors, &at)
            .map_err(|e| (file, e))?;
    }
    // Every name a rule replaces must be a limit of this domain.
    for (file, here, names) in &builder.replacing {
        for (i, name) in names.iter().enumerate() {
            if !builder.names.contains_key(name) {
                return Err((
                    *file,
                    RulesError::new(
                        format!("{here}.rate_limit.replaces[{i}].name"),
                        format!("no limit of this domain is named '{name}'"),
                    ),
                ));
            }
        }
    }
    Ok(DomainRules {
        name,
        nodes: builder.nodes,
        top,
    })
}

struct Builder {
    nodes: Vec<Node>,
    /// Limit names, with where the descriptor giving each is.
    names: HashMap<String, String>,
    /// The names each replacing rule replaces, by its file and path.
    replacing: Vec<(usize, String, Vec<String>)>,
    /// The file being read, and how many there are.
    file: usize,
    files: usize,
}

/// A place in the tree being built: what the levels above it say.
struct Place {
    id: RuleId,
    /// Each level's key and value as written.
    path: Vec<(String, Option<String>)>,
    /// Its field path in the file (`descriptors[2].descriptors[0]`; empty at the top).
    here: String,
    /// Every level above is an exact value or a shared wildcard.
    fixed: bool,
    /// The levels whose value is a shared wildcard ([`Rule::shared_levels`]).
    shared: u32,
    /// The levels whose request value names the metric ([`Rule::value_to_metric_levels`]).
    value_to_metric: u32,
}

impl Builder {
    /// Where a descriptor is, for a message: its path, and its file when there are several.
    fn whereabouts(&self, file: usize, here: &str) -> String {
        if self.files > 1 {
            format!("{here} of file {}", file + 1)
        } else {
            here.to_owned()
        }
    }

    /// One level's descriptors under `parent`, into `level`; `seen`: the (key, value) pairs
    /// given at this level so far, with where.
    fn level(
        &mut self,
        level: &mut Level,
        seen: &mut HashMap<(String, Option<String>), (usize, String)>,
        descriptors: &[RawDescriptor],
        parent: &Place,
    ) -> Result<(), RulesError> {
        let depth = parent.path.len() + 1;
        for (i, raw) in descriptors.iter().enumerate() {
            let here = if parent.here.is_empty() {
                format!("descriptors[{i}]")
            } else {
                format!("{}.descriptors[{i}]", parent.here)
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
            // An empty value is no value, as envoy ratelimit reads it.
            let value = raw.value.clone().filter(|value| !value.is_empty());
            if let Some(value) = &value
                && value.len() > MAX_TEXT_BYTES
            {
                return Err(RulesError::new(
                    format!("{here}.value"),
                    format!("longer than {MAX_TEXT_BYTES} bytes"),
                ));
            }
            let what = match &value {
                Some(value) => format!("key '{}' with value '{value}'", raw.key),
                None => format!("key '{}' without a value", raw.key),
            };
            if let Some((file, first)) = seen.get(&(raw.key.clone(), value.clone())) {
                let message = if *file == self.file {
                    format!("{what} is given twice at this level")
                } else {
                    format!("{what} is already given by {}", self.whereabouts(*file, first))
                };
                return Err(RulesError::new(here, message));
            }
            seen.insert((raw.key.clone(), value.clone()), (self.file, here.clone()));
            let wildcard = value.as_deref().and_then(Wildcard::of);
            if raw.share_threshold && wildcard.is_none() {
                return Err(RulesError::new(
                    format!("{here}.share_threshold"),
                    format!("only a wildcard value (with '*') can share a threshold, and {what} has none"),
                ));
            }
            let bit = 1u32 << (depth - 1);
            let shared = raw.share_threshold;
            let at = Place {
                id: parent.id.child(&raw.key, value.as_deref()),
                path: {
                    let mut path = parent.path.clone();
                    path.push((raw.key.clone(), value.clone()));
                    path
                },
                fixed: parent.fixed && (shared || (value.is_some() && wildcard.is_none())),
                shared: parent.shared | if shared { bit } else { 0 },
                // A value written exactly names the metric already; a shared wildcard names
                // it by the wildcard.
                value_to_metric: parent.value_to_metric
                    | if raw.value_to_metric && !shared && (value.is_none() || wildcard.is_some()) {
                        bit
                    } else {
                        0
                    },
                here,
            };
            let rule = match &raw.rate_limit {
                Some(limit) => Some(self.rule(limit, raw, &at)?),
                None => None,
            };
            let mut children = Level::default();
            self.level(&mut children, &mut HashMap::new(), &raw.descriptors, &at)?;
            let index = self.nodes.len();
            self.nodes.push(Node { rule, children });
            let key = raw.key.clone();
            match (value, wildcard) {
                (None, _) => {
                    level.key_only.insert(key, index);
                }
                (Some(value), Some(wildcard)) => {
                    // A request's value written as the wildcard is, is that node's exactly
                    // (as envoy ratelimit finds it).
                    level.exact.entry(key.clone()).or_default().insert(value, index);
                    level.wildcard.entry(key).or_default().push((wildcard, index));
                }
                (Some(value), None) => {
                    level.exact.entry(key).or_default().insert(value, index);
                }
            }
        }
        Ok(())
    }

    fn rule(
        &mut self,
        raw: &RawRateLimit,
        descriptor: &RawDescriptor,
        at: &Place,
    ) -> Result<Rule, RulesError> {
        let here = at.here.as_str();
        let field = |name: &str| format!("{here}.rate_limit.{name}");
        // An unlimited rule may keep a count it ignores, as envoy ratelimit allows; a unit
        // would say it limits.
        let counted = raw.unit.is_some() || (raw.requests_per_unit.is_some() && !raw.unlimited);
        // The quotas after the first of a list.
        let mut stacked: Vec<Quota> = Vec::new();
        let limit = match (raw.unlimited, &raw.quota, counted) {
            (true, None, false) => Limit::Unlimited,
            (true, _, _) => {
                return Err(RulesError::new(
                    field("unlimited"),
                    "an unlimited rule has no unit or quota",
                ));
            }
            (false, Some(_), true) => {
                return Err(RulesError::new(
                    field("quota"),
                    "give either quota or requests_per_unit with unit, not both",
                ));
            }
            (false, Some(QuotaTexts::One(text)), false) => {
                Limit::Quota(text.parse().map_err(|e| RulesError::new(field("quota"), e))?)
            }
            (false, Some(QuotaTexts::Many(texts)), false) => {
                if texts.is_empty() || texts.len() > MAX_STACKED + 1 {
                    return Err(RulesError::new(
                        field("quota"),
                        format!("a list of 1 to {} quotas, not {}", MAX_STACKED + 1, texts.len()),
                    ));
                }
                for (i, text) in texts.iter().enumerate() {
                    let quota = text
                        .parse()
                        .map_err(|e| RulesError::new(field(&format!("quota[{i}]")), e))?;
                    stacked.push(quota);
                }
                Limit::Quota(stacked.remove(0))
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
        if let (Limit::Quota(first), Some(kind)) = (limit, algorithm) {
            for (i, quota) in std::iter::once(&first).chain(&stacked).enumerate() {
                let at = if stacked.is_empty() {
                    field("quota")
                } else {
                    field(&format!("quota[{i}]"))
                };
                kind.check(quota)
                    .map_err(|e| RulesError::new(at, format!("{kind} cannot hold {quota}: {e}")))?;
            }
        }
        if let Some(name) = &raw.name {
            if name.is_empty() {
                return Err(RulesError::new(field("name"), "is empty"));
            }
            let whereabouts = self.whereabouts(self.file, here);
            if let Some(first) = self.names.insert(name.clone(), whereabouts) {
                return Err(RulesError::new(
                    field("name"),
                    format!("'{name}' is already the name of {first}"),
                ));
            }
        }
        let replaces: Vec<String> = raw.replaces.iter().map(|r| r.name.clone()).collect();
        for (i, replaced) in replaces.iter().enumerate() {
            if replaced.is_empty() {
                return Err(RulesError::new(
                    format!("{here}.rate_limit.replaces[{i}].name"),
                    "is empty",
                ));
            }
            if raw.name.as_ref() == Some(replaced) {
                return Err(RulesError::new(
                    format!("{here}.rate_limit.replaces[{i}].name"),
                    format!("'{replaced}' is this rule's own name: a rule cannot replace itself"),
                ));
            }
        }
        if !replaces.is_empty() {
            self.replacing
                .push((self.file, here.to_owned(), replaces.clone()));
        }
        Ok(Rule {
            id: at.id.clone(),
            limit,
            stacked,
            algorithm,
            name: raw.name.clone(),
            replaces,
            shadow_mode: descriptor.shadow_mode,
            count_over_limit: raw.count_over_limit,
            quota_mode: descriptor.quota_mode,
            detailed_metric: descriptor.detailed_metric,
            value_to_metric_levels: at.value_to_metric,
            shared_levels: at.shared,
            exact: at.fixed,
            metadata: descriptor.metadata.clone().map(Arc::new),
            path: at.path.clone().into(),
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
