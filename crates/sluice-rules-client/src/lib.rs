//! # sluice-rules-client: what a host asks of the services it reads its limits from
//!
//! The light side of sluice's remote limits, linked into every host (`sluice serve`): one
//! HTTP/1.1 `GET` on a new connection per question, its time and its answer bounded, and no
//! database. The store and its API are `sluice-rules`, which only the rules service runs.
//!
//! - [`RulesSource`] polls the rules service's `GET /v1/rules` with the revision the host
//!   holds (`If-None-Match`), so an unchanged store costs a 304 and no body; a changed one
//!   comes whole, every domain checked by the same validator as the store's
//!   ([`sluice_descriptors::parse_domain`]), and becomes a [`Snapshot`], which the host also
//!   keeps on disk to start from when the service is down.
//! - [`SnapshotBody`] and [`DomainBody`] are that endpoint's JSON, the one definition the
//!   service writes and the host reads.
//! - [`HttpQuotas`] asks a quota service for one key's quota (`accounts_url`): a quota source
//!   over HTTP for the keyed limiter, unrelated to the rules.
//!
//! ```
//! use sluice_rules_client::{Fetched, RulesSource, Snapshot};
//! // A host's source, checked without connecting: it is asked on its first poll.
//! let source = RulesSource::new("http://rules.internal:8083", Some("s3cret"))?;
//! assert_eq!(source.authority(), "rules.internal:8083");
//! // What a poll of a changed store gives, checked domain by domain.
//! let json = r#"{"revision": 7, "domains": [{"domain": "edge", "revision": 7,
//!     "rules": "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n"}]}"#;
//! let fetched = Fetched::Changed(Snapshot::from_json(json.as_bytes().to_vec().into())?);
//! assert!(matches!(fetched, Fetched::Changed(ref s) if s.revision == 7 && s.rules.len() == 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod quotas;
mod retriever;
mod tls;
mod wire;

pub use quotas::HttpQuotas;
pub use retriever::{
    DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT, Fetched, PollError, RulesSource, Snapshot, SnapshotError, UrlError,
};
pub use tls::{ClientTls, ClientTlsError};
pub use wire::{DomainBody, SnapshotBody};
