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
    #[serde(default)]
    pub shadow_mode: bool,
    #[serde(default)]
    pub detailed_metric: bool,
    #[serde(default)]
    pub quota_mode: bool,
    #[serde(default)]
    pub value_to_metric: bool,
    #[serde(default)]
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
    #[serde(default)]
    pub unlimited: bool,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "list")]
    pub replaces: Vec<RawReplace>,
    /// sluice: an exact quota text (`1.1/s burst 5`) in place of `requests_per_unit`/`unit`.
    #[serde(default)]
    pub quota: Option<String>,
    /// sluice: the algorithm counting this limit.
    #[serde(default)]
    pub algorithm: Option<String>,
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
