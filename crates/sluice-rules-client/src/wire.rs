//! The rules API's JSON for rules, as both ends read it: the rules service writes it
//! (`sluice_rules::RulesApi`, `GET /v1/rules` and a domain's own answers), a host reads it
//! ([`crate::Snapshot::from_json`]). One definition, so the two cannot drift apart.

use serde::{Deserialize, Serialize};

/// One domain as the API sends it (and a retriever reads it): its name, the store's revision
/// at its last change, and its rules file as written.
///
/// ```
/// use sluice_rules_client::DomainBody;
/// let body: DomainBody = serde_json::from_str(
///     r#"{"domain": "edge", "revision": 3, "rules": "domain: edge\ndescriptors: []\n"}"#,
/// )?;
/// assert_eq!((body.domain.as_str(), body.revision), ("edge", 3));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainBody {
    /// The domain.
    pub domain: String,
    /// The store's revision at the domain's last change (its `ETag`).
    pub revision: u64,
    /// Its rules file, as written.
    pub rules: String,
}

/// Every domain at one store revision (`GET /v1/rules`): what a host polls, and what it keeps
/// on disk as its snapshot.
///
/// ```
/// use sluice_rules_client::{DomainBody, SnapshotBody};
/// let body = SnapshotBody {
///     revision: 3,
///     domains: vec![DomainBody {
///         domain: "edge".into(),
///         revision: 3,
///         rules: "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n".into(),
///     }],
/// };
/// let json = serde_json::to_vec(&body)?;
/// let snapshot = sluice_rules_client::Snapshot::from_json(json.into()).unwrap();
/// assert_eq!((snapshot.revision, snapshot.rules.len()), (3, 1));
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotBody {
    /// The store's revision.
    pub revision: u64,
    /// Every domain, in name order.
    pub domains: Vec<DomainBody>,
}
