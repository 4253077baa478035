//! A descriptor's `metadata:` (any YAML map), kept as a tree a protobuf `Struct` or a JSON
//! object can be written from, and merged as envoy ratelimit merges the metadata of the
//! descriptors that passed.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};

/// The deepest nesting of maps and lists in one descriptor's metadata.
pub const MAX_METADATA_DEPTH: usize = 16;
/// The most items (maps, lists, scalars, keys) in one descriptor's metadata.
pub const MAX_METADATA_ITEMS: usize = 4096;

/// One value of a descriptor's metadata: what a protobuf `google.protobuf.Value` holds (YAML
/// numbers are read as `f64`, as envoy ratelimit reads them).
///
/// # Example
/// ```
/// use sluice_descriptors::{Metadata, RuleSet};
/// let rules = RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    metadata: {team: {name: search, weight: 2}}\n")?;
/// let metadata = rules.rules().next().unwrap().metadata.as_deref().unwrap();
/// let Metadata::Map(fields) = metadata else { unreachable!() };
/// let Metadata::Map(team) = &fields["team"] else { unreachable!() };
/// assert_eq!(team["name"], Metadata::String("search".into()));
/// assert_eq!(team["weight"], Metadata::Number(2.0));
/// # Ok::<(), sluice_descriptors::RulesError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Metadata {
    /// `null`, or a key given no value.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    String(String),
    /// A list.
    List(Vec<Metadata>),
    /// A map, its keys in order (non-string scalar keys written as text).
    Map(BTreeMap<String, Metadata>),
}

impl Metadata {
    /// Adds `other`'s fields to this map, as envoy ratelimit merges the metadata of the
    /// descriptors that passed: a field this map lacks is added; where both have a map, they
    /// are merged the same way; otherwise this map's value stays. A non-map is left as it is.
    ///
    /// # Example
    /// ```
    /// use sluice_descriptors::Metadata;
    /// let map = |pairs: &[(&str, Metadata)]| Metadata::Map(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
    /// let mut first = map(&[("a", Metadata::Bool(true)), ("m", map(&[("x", Metadata::Number(1.0))]))]);
    /// let second = map(&[("a", Metadata::Bool(false)), ("m", map(&[("y", Metadata::Number(2.0))]))]);
    /// first.merge(&second);
    /// assert_eq!(first, map(&[("a", Metadata::Bool(true)), ("m", map(&[("x", Metadata::Number(1.0)), ("y", Metadata::Number(2.0))]))]));
    /// ```
    pub fn merge(&mut self, other: &Metadata) {
        let (Metadata::Map(into), Metadata::Map(from)) = (self, other) else {
            return;
        };
        for (key, value) in from {
            match into.get_mut(key) {
                Some(existing @ Metadata::Map(_)) => existing.merge(value),
                Some(_) => {}
                None => {
                    into.insert(key.clone(), value.clone());
                }
            }
        }
    }

    /// The scalar as a map key, as envoy ratelimit writes a non-string key; `None` for a map
    /// or a list.
    fn as_key(&self) -> Option<String> {
        match self {
            Metadata::Null => Some("<nil>".to_owned()),
            Metadata::Bool(b) => Some(b.to_string()),
            Metadata::Number(n) => Some(n.to_string()),
            Metadata::String(s) => Some(s.clone()),
            Metadata::List(_) | Metadata::Map(_) => None,
        }
    }
}

/// Reads `metadata:`: a map (or null, which is none), bounded in depth and size.
pub(crate) fn metadata<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Metadata>, D::Error> {
    let mut items = 0;
    let read = Seed {
        depth: 0,
        items: &mut items,
    }
    .deserialize(deserializer)?;
    match read {
        Metadata::Null => Ok(None),
        map @ Metadata::Map(_) => Ok(Some(map)),
        _ => Err(D::Error::custom("must be a map")),
    }
}

/// Reads one value at `depth`, counting items.
struct Seed<'a> {
    depth: usize,
    items: &'a mut usize,
}

impl Seed<'_> {
    fn count<E: serde::de::Error>(&mut self) -> Result<(), E> {
        *self.items += 1;
        if *self.items > MAX_METADATA_ITEMS {
            return Err(E::custom(format!("more than {MAX_METADATA_ITEMS} items")));
        }
        Ok(())
    }

    fn nested<E: serde::de::Error>(&mut self) -> Result<Seed<'_>, E> {
        if self.depth >= MAX_METADATA_DEPTH {
            return Err(E::custom(format!(
                "nested deeper than {MAX_METADATA_DEPTH} levels"
            )));
        }
        Ok(Seed {
            depth: self.depth + 1,
            items: self.items,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Metadata;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Metadata, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Metadata;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map, list, string, number, bool or null")
    }

    fn visit_unit<E: serde::de::Error>(mut self) -> Result<Metadata, E> {
        self.count()?;
        Ok(Metadata::Null)
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Metadata, E> {
        self.visit_unit()
    }

    fn visit_bool<E: serde::de::Error>(mut self, v: bool) -> Result<Metadata, E> {
        self.count()?;
        Ok(Metadata::Bool(v))
    }

    fn visit_i64<E: serde::de::Error>(mut self, v: i64) -> Result<Metadata, E> {
        self.count()?;
        Ok(Metadata::Number(v as f64))
    }

    fn visit_u64<E: serde::de::Error>(mut self, v: u64) -> Result<Metadata, E> {
        self.count()?;
        Ok(Metadata::Number(v as f64))
    }

    fn visit_f64<E: serde::de::Error>(mut self, v: f64) -> Result<Metadata, E> {
        self.count()?;
        Ok(Metadata::Number(v))
    }

    fn visit_str<E: serde::de::Error>(mut self, v: &str) -> Result<Metadata, E> {
        self.count()?;
        Ok(Metadata::String(v.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<Metadata, A::Error> {
        self.count()?;
        let mut list = Vec::new();
        loop {
            let item = self.nested()?;
            match seq.next_element_seed(item)? {
                Some(value) => list.push(value),
                None => return Ok(Metadata::List(list)),
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Metadata, A::Error> {
        self.count()?;
        let mut fields = BTreeMap::new();
        loop {
            let Some(key) = map.next_key_seed(self.nested()?)? else {
                return Ok(Metadata::Map(fields));
            };
            let key = key
                .as_key()
                .ok_or_else(|| A::Error::custom("a map key must be a string, number, bool or null"))?;
            let value = map.next_value_seed(self.nested()?)?;
            fields.insert(key, value);
        }
    }
}
