//! A rules file as written: envoy ratelimit's fields, and sluice's two extensions inside
//! `rate_limit` (`quota`, `algorithm`).

use crate::metadata::Metadata;

use serde::{Deserialize, Deserializer};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDomain {
    pub domain: String,
    #[serde(default, deserialize_with = "list")]
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptor {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub rate_limit: Option<RawRateLimit>,
    #[serde(default, deserialize_with = "flag")]
    pub shadow_mode: bool,
    #[serde(default, deserialize_with = "flag")]
    pub detailed_metric: bool,
    #[serde(default, deserialize_with = "flag")]
    pub quota_mode: bool,
    #[serde(default, deserialize_with = "flag")]
    pub value_to_metric: bool,
    #[serde(default, deserialize_with = "flag")]
    pub share_threshold: bool,
    #[serde(default, deserialize_with = "crate::metadata::metadata")]
    pub metadata: Option<Metadata>,
    #[serde(default, deserialize_with = "list")]
    pub descriptors: Vec<RawDescriptor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRateLimit {
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub requests_per_unit: Option<u32>,
    #[serde(default, deserialize_with = "flag")]
    pub unlimited: bool,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "list")]
    pub replaces: Vec<RawReplace>,
    /// sluice: an exact quota text (`1.1/s burst 5`) in place of `requests_per_unit`/`unit`,
    /// or a list of them, all enforced at once (`["10/s burst 20", "1000/day"]`).
    #[serde(default)]
    pub quota: Option<QuotaTexts>,
    /// sluice: the algorithm counting this limit.
    #[serde(default)]
    pub algorithm: Option<String>,
    /// sluice: the hits of a request this limit denies are counted all the same (below empty,
    /// down to the quota's debt), as envoy's own fixed window counts them.
    #[serde(default, deserialize_with = "flag")]
    pub count_over_limit: bool,
}

/// One quota's text, or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum QuotaTexts {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawReplace {
    pub name: String,
}

/// A list field, where null is no items: `descriptors:` and `descriptors: null` are the same
/// YAML value, and the YAML reader takes only the first for an empty list (a JSON Patch's
/// YAML writes the second).
fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

/// A boolean as envoy ratelimit's YAML reader takes one: `true`/`false`, or YAML 1.1's words
/// (`yes`, `no`, `on`, `off`, `y`, `n`, in lower, title or upper case).
fn flag<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    struct Flag;
    impl serde::de::Visitor<'_> for Flag {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("true or false (or yes, no, on, off)")
        }
        fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<bool, E> {
            Ok(v)
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<bool, E> {
            match v {
                "y" | "Y" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Ok(true),
                "n" | "N" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => Ok(false),
                _ => Err(E::invalid_value(serde::de::Unexpected::Str(v), &self)),
            }
        }
    }
    deserializer.deserialize_any(Flag)
}
