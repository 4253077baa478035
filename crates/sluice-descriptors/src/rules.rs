//! The rules of each domain as a tree, matched as envoy's ratelimit service matches a
//! request descriptor (the tree is built and checked in `compile.rs`).

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;
use sluice::{AlgorithmKind, Quota};

use crate::compile::parse_domain;
use crate::error::RulesError;
use crate::key::RuleId;
use crate::metadata::Metadata;

/// The deepest nesting of descriptors read.
pub const MAX_DEPTH: usize = 32;
/// The most descriptors one domain holds.
pub const MAX_DESCRIPTORS: usize = 100_000;
/// The longest domain, key or value, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;
/// The most quotas a rule holds beside its first ([`Rule::stacked`]).
pub const MAX_STACKED: usize = 7;

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
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    /// Its place in the rules.
    pub id: RuleId,
    /// Its limit: with several quotas (`quota: [..]`), the first.
    pub limit: Limit,
    /// The quotas after the first, each counted apart and decided with it all or nothing: a
    /// request one of them denies takes nothing from the others. At most [`MAX_STACKED`].
    pub stacked: Vec<Quota>,
    /// The algorithm counting it, if the rule names one.
    pub algorithm: Option<AlgorithmKind>,
    /// Its name (`rate_limit.name`).
    pub name: Option<String>,
    /// The names of limits it replaces when both match one request.
    pub replaces: Vec<String>,
    /// Counted and reported, never denying.
    pub shadow_mode: bool,
    /// The hits of a request it denies are counted all the same, below empty down to the
    /// quota's debt ([`sluice::Quota::max_debt`]): a post-paid meter, whose later requests are
    /// denied until the debt is repaid (`rate_limit.count_over_limit`).
    pub count_over_limit: bool,
    /// Over its limit, it does not deny by itself: a request is denied when every
    /// quota-mode limit it is counted against is over (or any other limit is).
    pub quota_mode: bool,
    /// Its metric label names every value of the request ([`crate::metric_label`]).
    pub detailed_metric: bool,
    /// Bit `i`: the value at level `i` of its path is a `value_to_metric` key alone or
    /// wildcard, so the request's own value goes into its metric label.
    pub value_to_metric_levels: u32,
    /// Bit `i`: the value at level `i` of its path is a `share_threshold` wildcard, so every
    /// value it matches shares one counter ([`crate::counter_key`]).
    pub shared_levels: u32,
    /// Every level of its path is an exact value or a shared wildcard, so one counter serves
    /// every descriptor it matches ([`crate::counter_key`] is then its place alone).
    pub exact: bool,
    /// Its `metadata:`, returned for the descriptors it admits when the service is asked to.
    pub metadata: Option<Arc<Metadata>>,
    /// Its path as written, from the top: each level's key and value (`None`: the key alone).
    pub path: Arc<[(String, Option<String>)]>,
}

impl Rule {
    /// A rule on a path of one level, with nothing but a limit.
    pub(crate) fn plain(id: RuleId, limit: Limit, key: &str, value: Option<String>) -> Self {
        Self {
            id,
            limit,
            stacked: Vec::new(),
            algorithm: None,
            name: None,
            replaces: Vec::new(),
            shadow_mode: false,
            count_over_limit: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric_levels: 0,
            shared_levels: 0,
            exact: value.is_some(),
            metadata: None,
            path: Arc::from([(key.to_owned(), value)]),
        }
    }
}

/// A value with `*` in it: each `*` matches any run of characters (none included), as envoy
/// ratelimit matches `foo*`, `bar*b` and `foo*bar*baz`.
#[derive(Clone, Debug)]
pub(crate) struct Wildcard {
    /// The value split at each `*` (so at least two parts).
    parts: Vec<String>,
}

impl Wildcard {
    /// The wildcard `value` is, if it has a `*`.
    pub(crate) fn of(value: &str) -> Option<Self> {
        value.contains('*').then(|| Self {
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// Whether `value` matches: it starts with the first part, ends with the last, and holds
    /// the others in order between them, none overlapping.
    pub(crate) fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        let fixed: usize = self.parts.iter().map(String::len).sum();
        if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str()) {
            return false;
        }
        // Both ends are on character boundaries (they matched whole strings) and do not
        // overlap (the value holds every part's length).
        let Some(mut rest) = value.get(first.len()..value.len() - last.len()) else {
            return false;
        };
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

pub(crate) type Map<V> = HashMap<String, V, RandomState>;

/// One level of descriptors: exact values, wildcard values (`prefix*`, `a*b`), and key-only
/// ones.
#[derive(Clone, Debug, Default)]
pub(crate) struct Level {
    /// By key, then value.
    pub(crate) exact: Map<Map<usize>>,
    /// By key: (wildcard, node), in the file's order (the first that matches is taken).
    pub(crate) wildcard: Map<Vec<(Wildcard, usize)>>,
    /// By key.
    pub(crate) key_only: Map<usize>,
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
        if let Some(wildcards) = self.wildcard.get(entry.key)
            && let Some((_, node)) = wildcards
                .iter()
                .find(|(wildcard, _)| wildcard.matches(entry.value))
        {
            return Some(*node);
        }
        self.key_only.get(entry.key).copied()
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Node {
    pub(crate) rule: Option<Rule>,
    pub(crate) children: Level,
}

/// One domain's rules (one file of envoy ratelimit's format).
#[derive(Clone, Debug)]
pub struct DomainRules {
    pub(crate) name: String,
    pub(crate) nodes: Vec<Node>,
    pub(crate) top: Level,
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
                rule: Some(Rule::plain(id, Limit::Quota(quota), key, value.clone())),
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

    /// Gives the rule of `key`'s exact `value` (one of [`DomainRules::by_value`]'s) further
    /// quotas, enforced with its own all or nothing ([`Rule::stacked`]).
    ///
    /// # Errors
    /// No rule for that value, or more than [`MAX_STACKED`] quotas.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::{DomainRules, Entry, RuleSet};
    /// let mut domain = DomainRules::by_value("accounts", "account", [("alice".to_string(), "1/s".parse()?)], None)?;
    /// domain.stack("account", "alice", vec!["100/day".parse()?])?;
    /// assert!(domain.stack("account", "bob", vec!["1/h".parse()?]).is_err());
    /// let rules = RuleSet::from_domains(vec![domain])?;
    /// let alice = rules.find("accounts", &[Entry { key: "account", value: "alice" }]).unwrap();
    /// assert_eq!(alice.stacked, ["100/day".parse()?]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stack(&mut self, key: &str, value: &str, quotas: Vec<Quota>) -> Result<(), RulesError> {
        let field = || format!("value {value:?}");
        if quotas.len() > MAX_STACKED {
            let told = format!("{} quotas beside the first, at most {MAX_STACKED}", quotas.len());
            return Err(RulesError::new(field(), told));
        }
        let rule = (self.top.exact.get(key))
            .and_then(|values| values.get(value))
            .and_then(|&index| self.nodes.get_mut(index))
            .and_then(|node| node.rule.as_mut());
        let Some(rule) = rule else {
            return Err(RulesError::new(field(), "no rule for this value"));
        };
        rule.stacked = quotas;
        Ok(())
    }

    /// The rule for a request descriptor: the entries walked level by level; at each, an
    /// exact value first, then the first wildcard value that matches, then the key alone. The rule
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
