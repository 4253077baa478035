//! The rules of each domain as a tree, checked, and matched as envoy's ratelimit service
//! matches a request descriptor.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use foldhash::fast::RandomState;
use sluice::{AlgorithmKind, Quota};

use crate::error::RulesError;
use crate::key::RuleId;
use crate::raw::{RawDescriptor, RawDomain, RawRateLimit};

/// The deepest nesting of descriptors read.
pub const MAX_DEPTH: usize = 32;
/// The most descriptors one domain holds.
pub const MAX_DESCRIPTORS: usize = 100_000;
/// The longest domain, key or value, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;

/// One entry of a request descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The descriptor key.
    pub key: &'a str,
    /// Its value.
    pub value: &'a str,
}

/// What a rule limits to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// A quota.
    Quota(Quota),
    /// Nothing: the descriptor matches and is never limited.
    Unlimited,
}

/// A descriptor with a `rate_limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Its place in the rules.
    pub id: RuleId,
    /// Its limit.
    pub limit: Limit,
    /// The algorithm counting it, if the rule names one.
    pub algorithm: Option<AlgorithmKind>,
    /// Its name (`rate_limit.name`).
    pub name: Option<String>,
    /// The names of limits it replaces when both match one request.
    pub replaces: Vec<String>,
    /// Counted and reported, never denying.
    pub shadow_mode: bool,
    /// Metrics per value wanted (kept; the service does not act on it).
    pub detailed_metric: bool,
    /// Every level of its path is an exact value, so every descriptor it matches is the
    /// same and one counter serves them all ([`crate::counter_key`] is then its place alone).
    pub exact: bool,
}

type Map<V> = HashMap<String, V, RandomState>;

/// One level of descriptors: exact values, value prefixes (`prefix*`), and key-only ones.
#[derive(Clone, Debug, Default)]
struct Level {
    /// By key, then value.
    exact: Map<Map<usize>>,
    /// By key: (prefix, node), longest prefix first.
    wildcard: Map<Vec<(String, usize)>>,
    /// By key.
    key_only: Map<usize>,
}

impl Level {
    fn find(&self, entry: &Entry<'_>) -> Option<usize> {
        if let Some(node) = self
            .exact
            .get(entry.key)
            .and_then(|values| values.get(entry.value))
        {
            return Some(*node);
        }
        if let Some(prefixes) = self.wildcard.get(entry.key)
            && let Some((_, node)) = prefixes
                .iter()
                .find(|(prefix, _)| entry.value.starts_with(prefix.as_str()))
        {
            return Some(*node);
        }
        self.key_only.get(entry.key).copied()
    }
}

#[derive(Clone, Debug)]
struct Node {
    rule: Option<Rule>,
    children: Level,
}

/// One domain's rules (one file of envoy ratelimit's format).
#[derive(Clone, Debug)]
pub struct DomainRules {
    name: String,
    nodes: Vec<Node>,
    top: Level,
}

impl DomainRules {
    /// The domain's name.
    ///
    /// # Example
    /// ```
    /// let domain = sluice_descriptors::parse_domain("domain: edge\ndescriptors: []\n")?;
    /// assert_eq!(domain.name(), "edge");
    /// # Ok::<(), sluice_descriptors::RulesError>(())
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One key's rules built in code rather than read from a file: a rule per exact value
    /// (no value is read as a `prefix*`), and, with `others`, a key-only rule giving every
    /// other value its own counter at that quota.
    ///
    /// # Errors
    /// An empty or over-long domain, key or value, or more values than [`MAX_DESCRIPTORS`].
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::{DomainRules, Entry, Limit, RuleSet};
    /// let values = [("alice".to_string(), "1/s".parse()?), ("b*".to_string(), "2/s".parse()?)];
    /// let domain = DomainRules::by_value("accounts", "account", values, Some("5/min".parse()?))?;
    /// let rules = RuleSet::from_domains(vec![domain])?;
    /// let find = |value| rules.find("accounts", &[Entry { key: "account", value }]).map(|r| r.limit);
    /// assert_eq!(find("alice"), Some(Limit::Quota("1/s".parse()?)));
    /// assert_eq!(find("b*"), Some(Limit::Quota("2/s".parse()?)));
    /// assert_eq!(find("bob"), Some(Limit::Quota("5/min".parse()?)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn by_value(
        domain: &str,
        key: &str,
        values: impl IntoIterator<Item = (String, Quota)>,
        others: Option<Quota>,
    ) -> Result<Self, RulesError> {
        let text = |field: &str, text: &str| {
            if text.is_empty() {
                Err(RulesError::new(field, "is empty"))
            } else if text.len() > MAX_TEXT_BYTES {
                Err(RulesError::new(
                    field,
                    format!("longer than {MAX_TEXT_BYTES} bytes"),
                ))
            } else {
                Ok(())
            }
        };
        text("domain", domain)?;
        text("key", key)?;
        let parent = RuleId::domain(domain);
        let rule = |id: RuleId, quota: Quota, exact: bool| Rule {
            id,
            limit: Limit::Quota(quota),
            algorithm: None,
            name: None,
            replaces: Vec::new(),
            shadow_mode: false,
            detailed_metric: false,
            exact,
        };
        let mut nodes = Vec::new();
        let mut top = Level::default();
        let mut add = |value: Option<String>, quota: Quota| {
            if nodes.len() >= MAX_DESCRIPTORS {
                return Err(RulesError::new(
                    "descriptors",
                    format!("more than {MAX_DESCRIPTORS} descriptors in one domain"),
                ));
            }
            let index = nodes.len();
            let id = parent.child(key, value.as_deref());
            nodes.push(Node {
                rule: Some(rule(id, quota, value.is_some())),
                children: Level::default(),
            });
            match value {
                Some(value) => {
                    let values = top.exact.entry(key.to_owned()).or_default();
                    if values.insert(value, index).is_some() {
                        return Err(RulesError::new("descriptors", "a value is given twice"));
                    }
                }
                None => {
                    top.key_only.insert(key.to_owned(), index);
                }
            }
            Ok(())
        };
        for (value, quota) in values {
            text(&format!("value {value:?}"), &value)?;
            add(Some(value), quota)?;
        }
        if let Some(quota) = others {
            add(None, quota)?;
        }
        Ok(Self {
            name: domain.to_owned(),
            nodes,
            top,
        })
    }

    /// The rule for a request descriptor: the entries walked level by level; at each, an
    /// exact value first, then the longest matching `prefix*`, then the key alone. The rule
    /// is that of the node the last entry reaches, if it has a limit.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::{Entry, RuleSet};
    /// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")?;
    /// let domain = rules.domain("d").unwrap();
    /// assert!(domain.find(&[Entry { key: "user", value: "alice" }]).is_some());
    /// assert!(domain.find(&[Entry { key: "ip", value: "10.0.0.1" }]).is_none());
    /// # Ok::<(), sluice_descriptors::RulesError>(())
    /// ```
    #[inline]
    pub fn find(&self, entries: &[Entry<'_>]) -> Option<&Rule> {
        let (last, walk) = entries.split_last()?;
        let mut level = &self.top;
        for entry in walk {
            let node = self.nodes.get(level.find(entry)?)?;
            level = &node.children;
        }
        self.nodes.get(level.find(last)?)?.rule.as_ref()
    }

    /// Every rule (descriptor with a `rate_limit`) of this domain.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.nodes.iter().filter_map(|node| node.rule.as_ref())
    }
}

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
        let field = match inner.location() {
            Some(at) if path == "." || path.contains('?') => {
                format!("line {} column {}", at.line(), at.column())
            }
            _ if path == "." => "file".to_string(),
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

/// A unit's length in seconds: a week is 7 days, a month 30, a year 365. Any case, as
/// configs write `SECOND` as often as `second`.
fn unit_seconds(unit: &str) -> Option<u64> {
    const DAY: u64 = 86_400;
    let seconds = match unit.to_ascii_lowercase().as_str() {
        "second" => 1,
        "minute" => 60,
        "hour" => 3_600,
        "day" => DAY,
        "week" => 7 * DAY,
        "month" => 30 * DAY,
        "year" => 365 * DAY,
        _ => return None,
    };
    Some(seconds)
}

/// The rules of every domain.
///
/// # Example
/// ```
/// use sluice_descriptors::{Entry, Limit, RuleSet};
/// let rules = RuleSet::from_yaml(
///     "domain: edge\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
/// )?;
/// let login = rules.find("edge", &[Entry { key: "path", value: "/login" }]).unwrap();
/// assert_eq!(login.limit, Limit::Quota("5/min".parse().unwrap()));
/// let other = rules.find("edge", &[Entry { key: "path", value: "/" }]).unwrap();
/// assert_eq!(other.limit, Limit::Quota("100/s".parse().unwrap()));
/// assert!(rules.find("other", &[Entry { key: "path", value: "/" }]).is_none());
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct RuleSet {
    domains: HashMap<String, DomainRules, RandomState>,
}

impl RuleSet {
    /// The rules of one file's text.
    ///
    /// # Errors
    /// The text is not a rules file; the error names the field.
    pub fn from_yaml(text: &str) -> Result<Self, RulesError> {
        Self::from_domains(vec![parse_domain(text)?])
    }

    /// The rules of several domains.
    ///
    /// # Errors
    /// Two share a name.
    pub fn from_domains(domains: Vec<DomainRules>) -> Result<Self, RulesError> {
        let mut set = Self::default();
        for domain in domains {
            if set.domains.contains_key(&domain.name) {
                return Err(RulesError::new(
                    "domain",
                    format!("'{}' is given twice", domain.name),
                ));
            }
            set.domains.insert(domain.name.clone(), domain);
        }
        Ok(set)
    }

    /// Every domain.
    pub fn domains(&self) -> impl Iterator<Item = &DomainRules> {
        self.domains.values()
    }

    /// One domain.
    pub fn domain(&self, name: &str) -> Option<&DomainRules> {
        self.domains.get(name)
    }

    /// The rule for one request descriptor in `domain` (see [`DomainRules`] for the walk);
    /// `None` when nothing limits it.
    #[inline]
    pub fn find<'a>(&'a self, domain: &str, entries: &[Entry<'_>]) -> Option<&'a Rule> {
        self.domains.get(domain)?.find(entries)
    }

    /// Every rule (descriptor with a `rate_limit`) of every domain.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.domains.values().flat_map(DomainRules::rules)
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules().count()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
