//! Descriptor rules in envoy ratelimit's config format, loadable unchanged: `domain`,
//! `descriptors` with `key`, optional `value` (exact, or a wildcard with `*` anywhere),
//! `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`,
//! `quota_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata`, nested
//! `descriptors`; several files of one domain merged on request ([`LoadOptions`]). sluice adds
//! three fields inside `rate_limit`: `quota` (an exact quota text, `1.1/s burst 5`, in place of
//! `requests_per_unit`/`unit`, or a list of them), `algorithm`, and `count_over_limit` (a
//! denied request's hits are counted all the same, below empty). Units: a week is 7 days, a month 30, a year
//! 365.
//!
//! Matching a request descriptor (its entries in order) walks the tree a level per entry. At
//! each level the entry `(key, value)` picks a child with that key and exactly that value; if
//! none, the first child (in the file's order) whose wildcard value matches, each `*` matching
//! any run of characters; if none, the child with the key and no value. No child: no rule. The
//! rule is the limit of the node the last entry reaches (none if it has no `rate_limit`); an
//! earlier entry's node only leads to its nested descriptors. A key-only or wildcard rule
//! counts each distinct value on its own counter, unless its wildcard has `share_threshold`
//! ([`counter_key`]).
//!
//! Errors name the field as a path in the file (`descriptors[2].rate_limit.unit`).
//!
//! # Example
//! ```
//! use sluice_descriptors::{Entry, RuleSet};
//! let rules = RuleSet::from_yaml(
//!     "domain: api\ndescriptors:\n  - key: user\n    descriptors:\n      - key: path\n        value: /export\n        rate_limit: {unit: hour, requests_per_unit: 10}\n",
//! )?;
//! let export = [Entry { key: "user", value: "alice" }, Entry { key: "path", value: "/export" }];
//! assert!(rules.find("api", &export).is_some());
//! assert!(rules.find("api", &export[..1]).is_none()); // `user` alone has no limit
//! # Ok::<(), sluice_descriptors::RulesError>(())
//! ```

#![forbid(unsafe_code)]

mod compile;
mod counting;
mod error;
mod key;
mod load;
mod metadata;
mod raw;
mod rules;

pub use compile::{MAX_FLOW_NESTING, UNITS, parse_domain, unit_seconds};
pub use counting::Counting;
pub use error::{LoadError, RulesError};
pub use key::{RuleId, counter_key, last_value_of, metric_label, push_counter_key, rule_of};
pub use load::LoadOptions;
pub use metadata::{MAX_METADATA_DEPTH, MAX_METADATA_ITEMS, Metadata};
pub use rules::{
    DomainRules, Entry, Limit, MAX_DEPTH, MAX_DESCRIPTORS, MAX_STACKED, MAX_TEXT_BYTES, Rule, RuleSet,
};
