//! Names made of text the user controls, escaped so that no two different inputs share one:
//! a rule's place ([`RuleId`]) and a counter's key ([`counter_key`]).

use crate::{Entry, Rule};

/// Between a key and its value.
const PAIR: char = '\u{1e}';
/// Between levels (or entries).
const LEVEL: char = '\u{1f}';
/// Between a rule's place and a request's entries in a counter key.
const COUNTER: char = '\u{1c}';
/// Escapes the next character.
const ESCAPE: char = '\\';

/// Appends `text`, escaping the separators and the escape itself.
pub(crate) fn push_escaped(out: &mut String, text: &str) {
    // The separators and the escape are ASCII, so a byte scan finds them; most text has none.
    let special = |b: &u8| matches!(*b, 0x1c..=0x1f | b'\\');
    if !text.as_bytes().iter().any(special) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        if matches!(c, PAIR | LEVEL | COUNTER | ESCAPE) {
            out.push(ESCAPE);
        }
        out.push(c);
    }
}

/// A rule's place: its domain and the (key, value as written) path from the top, escaped.
/// Stable across reloads while the rule keeps its place, whatever its limit.
///
/// # Example
/// ```
/// use sluice_descriptors::RuleSet;
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")?;
/// let id = &rules.rules().next().unwrap().id;
/// let same = sluice_descriptors::RuleId::from_string(id.as_str().to_owned());
/// assert_eq!(same, *id);
/// // Equal ids hash alike; another place is another id.
/// use std::hash::BuildHasher;
/// let hasher = std::hash::RandomState::new();
/// assert_eq!(hasher.hash_one(&same), hasher.hash_one(id));
/// assert_ne!(sluice_descriptors::RuleId::from_string(format!("{}x", id.as_str())), *id);
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
#[derive(Clone)]
pub struct RuleId {
    text: std::sync::Arc<str>,
    /// The text's hash, taken once: every decision finds its rule's statistics and field
    /// policy by id, and a long id hashed each time cost more than the lookup.
    hash: u64,
}

/// The hasher of every id's text: seeded at random once per process, so ids that collide
/// cannot be written in advance.
fn id_hasher() -> &'static foldhash::quality::RandomState {
    static HASHER: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    HASHER.get_or_init(foldhash::quality::RandomState::default)
}

impl PartialEq for RuleId {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.text == other.text
    }
}

impl Eq for RuleId {}

impl std::hash::Hash for RuleId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for RuleId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RuleId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.text.cmp(&other.text)
    }
}

impl std::fmt::Debug for RuleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RuleId").field(&self.text).finish()
    }
}

impl RuleId {
    fn new(text: std::sync::Arc<str>) -> Self {
        use std::hash::BuildHasher;
        let hash = id_hasher().hash_one(&*text);
        Self { text, hash }
    }

    /// Its text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The id whose text is `text` (as [`RuleId::as_str`] gave it).
    pub fn from_string(text: String) -> Self {
        Self::new(text.into())
    }

    /// The id of the domain's top level.
    pub(crate) fn domain(name: &str) -> Self {
        let mut text = String::with_capacity(name.len());
        push_escaped(&mut text, name);
        Self::new(text.into())
    }

    /// The id of a child of this place.
    pub(crate) fn child(&self, key: &str, value: Option<&str>) -> Self {
        let mut text =
            String::with_capacity(self.text.len() + key.len() + value.map_or(0, |v| v.len() + 1) + 1);
        text.push_str(&self.text);
        text.push(LEVEL);
        push_escaped(&mut text, key);
        if let Some(value) = value {
            text.push(PAIR);
            push_escaped(&mut text, value);
        }
        Self::new(text.into())
    }
}

/// Reads as the rule's place in its file: `domain: key=value > key`, the separators shown and
/// escapes removed (for messages and logs; [`RuleId::as_str`] is the exact form).
///
/// # Example
/// ```
/// use sluice_descriptors::RuleSet;
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    value: v\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1}\n")?;
/// assert_eq!(rules.rules().next().unwrap().id.to_string(), "d: k=v > user");
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
impl std::fmt::Display for RuleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write;
        let mut escaped = false;
        let mut level = 0;
        for c in self.text.chars() {
            if escaped {
                escaped = false;
                f.write_char(c)?;
                continue;
            }
            match c {
                ESCAPE => escaped = true,
                LEVEL => {
                    f.write_str(if level == 0 { ": " } else { " > " })?;
                    level += 1;
                }
                PAIR => f.write_char('=')?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// The counter of a request descriptor `rule` matched: the rule's place and the request's own
/// entries, so each distinct value of a key-only or wildcard rule has its own counter, and no
/// two (rule, entries) pairs share one. A rule with an exact value at every level
/// ([`Rule::exact`]) matches one descriptor only, so its place alone is its counter.
///
/// # Example
/// ```
/// use sluice_descriptors::{Entry, RuleSet, counter_key, rule_of};
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n")?;
/// let alice = [Entry { key: "user", value: "alice" }];
/// let bob = [Entry { key: "user", value: "bob" }];
/// let rule = rules.find("d", &alice).unwrap();
/// assert_ne!(counter_key(rule, &alice), counter_key(rule, &bob));
/// assert_eq!(rule_of(&counter_key(rule, &alice)).as_ref(), Some(&rule.id));
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
pub fn counter_key(rule: &Rule, entries: &[Entry<'_>]) -> String {
    let size: usize = entries.iter().map(|e| e.key.len() + e.value.len() + 2).sum();
    let mut key = String::with_capacity(rule.id.text.len() + 1 + size);
    push_counter_key(&mut key, rule, entries);
    key
}

/// Appends [`counter_key`]`(rule, entries)` to `key`: for a caller that keeps a buffer.
///
/// # Example
/// ```
/// use sluice_descriptors::{Entry, RuleSet, counter_key, push_counter_key};
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n")?;
/// let alice = [Entry { key: "user", value: "alice" }];
/// let rule = rules.find("d", &alice).unwrap();
/// let mut key = String::from(">");
/// push_counter_key(&mut key, rule, &alice);
/// assert_eq!(key, format!(">{}", counter_key(rule, &alice)));
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
pub fn push_counter_key(key: &mut String, rule: &Rule, entries: &[Entry<'_>]) {
    key.push_str(&rule.id.text);
    key.push(COUNTER);
    // Every descriptor an exact rule matches counts alike: its place names its one counter.
    if rule.exact {
        return;
    }
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            key.push(LEVEL);
        }
        push_escaped(key, entry.key);
        // A shared wildcard's values all count as one: the key alone stands for them (no
        // request's entry is written without its value, so none can be taken for it).
        if rule.shared_levels & level_bit(i) == 0 {
            key.push(PAIR);
            push_escaped(key, entry.value);
        }
    }
}

/// The bit of level `i` in [`Rule::shared_levels`] and [`Rule::value_to_metric_levels`] (none
/// past the deepest level).
fn level_bit(i: usize) -> u32 {
    u32::try_from(i)
        .ok()
        .and_then(|i| 1u32.checked_shl(i))
        .unwrap_or(0)
}

/// The label of a request's own series under `rule` in the metrics, as envoy ratelimit names
/// its stats (`key_value.key`): `None` when the rule's series is its own (no value of the
/// request goes into its name). A `detailed_metric` rule names every value of the request; a
/// level written `value_to_metric` names the request's value; a shared wildcard is named by
/// the wildcard; every other level as written.
///
/// # Example
/// ```
/// use sluice_descriptors::{Entry, RuleSet, metric_label};
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: user\n    value_to_metric: true\n    descriptors:\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 1}\n")?;
/// let entries = [Entry { key: "user", value: "alice" }, Entry { key: "path", value: "/a" }];
/// let rule = rules.find("d", &entries).unwrap();
/// assert_eq!(metric_label(rule, &entries).as_deref(), Some("user_alice.path"));
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
#[inline]
pub fn metric_label(rule: &Rule, entries: &[Entry<'_>]) -> Option<String> {
    // Checked where it is called: most rules have no per-value series, and every decision
    // asks.
    if !rule.detailed_metric && rule.value_to_metric_levels == 0 {
        return None;
    }
    Some(label_of(rule, entries))
}

/// The label of a rule with per-value series.
fn label_of(rule: &Rule, entries: &[Entry<'_>]) -> String {
    let mut label = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            label.push('.');
        }
        label.push_str(entry.key);
        let bit = level_bit(i);
        let written = rule.path.get(i).and_then(|(_, value)| value.as_deref());
        let value = if rule.shared_levels & bit != 0 {
            written
        } else if rule.detailed_metric || rule.value_to_metric_levels & bit != 0 {
            Some(entry.value)
        } else {
            written
        };
        if let Some(value) = value.filter(|value| !value.is_empty()) {
            label.push('_');
            label.push_str(value);
        }
    }
    label
}

/// The value of the last entry a counter key was made of (unescaped); `None` for an exact
/// rule's key, which names no entries.
///
/// # Example
/// ```
/// use sluice_descriptors::{Entry, RuleSet, counter_key, last_value_of};
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n")?;
/// let entries = [Entry { key: "user", value: "a\\b\u{1e}c" }];
/// let key = counter_key(rules.find("d", &entries).unwrap(), &entries);
/// assert_eq!(last_value_of(&key).as_deref(), Some("a\\b\u{1e}c"));
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
pub fn last_value_of(counter_key: &str) -> Option<String> {
    let mut escaped = false;
    let mut entries = None;
    let mut value_at = None;
    for (at, c) in counter_key.char_indices() {
        if escaped {
            escaped = false;
        } else if c == ESCAPE {
            escaped = true;
        } else if c == COUNTER && entries.is_none() {
            entries = Some(at);
        } else if c == PAIR && entries.is_some() {
            value_at = Some(at + c.len_utf8());
        }
    }
    let escaped_value = &counter_key[value_at?..];
    let mut value = String::with_capacity(escaped_value.len());
    let mut escaping = false;
    for c in escaped_value.chars() {
        if c == ESCAPE && !escaping {
            escaping = true;
        } else {
            escaping = false;
            value.push(c);
        }
    }
    Some(value)
}

/// The rule a counter key was made for.
///
/// # Example
/// ```
/// assert_eq!(sluice_descriptors::rule_of("no separator"), None);
/// ```
pub fn rule_of(counter_key: &str) -> Option<RuleId> {
    let mut escaped = false;
    for (at, c) in counter_key.char_indices() {
        if escaped {
            escaped = false;
        } else if c == ESCAPE {
            escaped = true;
        } else if c == COUNTER {
            return Some(RuleId::new(counter_key[..at].into()));
        }
    }
    None
}
