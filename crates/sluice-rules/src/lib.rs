//! # sluice-rules: descriptor rules in a database
//!
//! The rules service's side (`sluice rules`), deployed where the rules are kept; hosts only
//! poll it, with the light client of `sluice-rules-client`, and never compile this crate's
//! databases.
//!
//! Seed 004's rules store: each domain's rules (one file of envoy ratelimit's format, checked
//! by [`sluice_descriptors::parse_domain`], the same validator as the service's files) kept
//! in a database with a store-wide revision that only grows and a history of every change
//! (who, when, before, after). A domain's revision is that of its last change: its `ETag`, so
//! a write can name the revision it read and be refused if another came between.
//!
//! [`SqliteStore`] is the embedded store (one file, WAL); [`PostgresStore`] one that several
//! rules-service replicas share. [`RulesApi`] serves it over HTTP
//! (JSON, `ETag`/`If-Match`, bearer [`Tokens`] with a scope); its snapshot answer
//! (`GET /v1/rules`) is `sluice_rules_client::SnapshotBody`, the model the hosts' retriever
//! (`sluice_rules_client::RulesSource`) reads, defined once there.
//!
//! ```
//! use sluice_rules::{RuleStore, SqliteStore};
//! let store = SqliteStore::in_memory()?;
//! let edge = store.create("domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60}\n", "alice")?;
//! assert_eq!((edge.domain.as_str(), edge.revision), ("edge", 1));
//! let changed = store.replace("edge", &edge.text.replace("60", "30"), Some(edge.revision), "bob")?;
//! assert_eq!(changed.revision, 2);
//! // A write that read revision 1 comes too late.
//! assert!(store.replace("edge", &edge.text, Some(1), "carol").is_err());
//! assert_eq!(store.history("edge")?.len(), 2);
//! # Ok::<(), sluice_rules::StoreError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod api;
mod patch;
mod postgres;
mod sqlite;
mod tokens;
mod write;

pub use api::{MAX_RULES_BYTES, RulesApi};
pub use patch::{MAX_PATCH_OPERATIONS, PatchError};
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;
pub use tokens::{Caller, Scope, Tokens, TokensError};

use sluice_descriptors::RulesError;

/// One domain's rules as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRecord {
    /// The domain.
    pub domain: String,
    /// Its rules file, as written (checked when stored).
    pub text: String,
    /// The store's revision at its last change.
    pub revision: u64,
}

/// One change, as the history keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The store's revision this change made.
    pub revision: u64,
    /// The domain changed.
    pub domain: String,
    /// Who changed it.
    pub who: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: i64,
    /// The rules before (none: created).
    pub before: Option<String>,
    /// The rules after (none: deleted).
    pub after: Option<String>,
}

/// A page of domains, in name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The domains of this page.
    pub domains: Vec<DomainRecord>,
    /// The name to list after for the next page, if there is one.
    pub next: Option<String>,
}

/// The most domains one page lists.
pub const MAX_PAGE: usize = 1000;

/// Why a store operation did not happen. Nothing is changed when one is returned.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No such domain.
    #[error("domain '{0}' not found")]
    NotFound(String),
    /// The domain exists already (a create).
    #[error("domain '{0}' exists already")]
    Exists(String),
    /// The domain changed since the revision the write read.
    #[error("domain '{domain}' is at revision {current}, not {expected}: read it again")]
    Stale {
        /// The domain.
        domain: String,
        /// The revision the write named.
        expected: u64,
        /// Its revision now.
        current: u64,
    },
    /// The rules are not a valid rules file; the error names the field.
    #[error(transparent)]
    Invalid(#[from] RulesError),
    /// The rules name another domain than the one written to.
    #[error("the rules are for domain '{named}', not '{domain}'")]
    WrongDomain {
        /// The domain written to.
        domain: String,
        /// The domain the rules name.
        named: String,
    },
    /// A page of 0 or more than [`MAX_PAGE`] domains.
    #[error("a page lists 1 to {MAX_PAGE} domains, not {0}")]
    PageSize(usize),
    /// The database's schema is newer than this build knows.
    #[error("the database's schema is version {found}; this sluice knows up to {known}")]
    NewerSchema {
        /// The schema's version.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },
    /// The database failed.
    #[error("database: {0}")]
    Database(DatabaseError),
    /// PostgreSQL failed or could not be reached.
    #[error("postgres: {0}")]
    Postgres(DatabaseError),
}

/// A database's failure: what its driver said, the driver's error kept as the source (so the
/// driver's types are not part of this crate's API).
///
/// # Example
/// ```
/// use sluice_rules::{RuleStore, SqliteStore, StoreError};
/// let dir = std::env::temp_dir().join(format!("sluice-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// // A directory is not a database file.
/// if let Err(StoreError::Database(e)) = SqliteStore::open(&dir) {
///     assert!(!e.is_unreachable());
/// }
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct DatabaseError {
    message: String,
    /// The server gave no answer (as opposed to refusing the statement).
    unreachable: bool,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl DatabaseError {
    /// Whether the database could not be reached at all: another try may find it back.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Database(DatabaseError {
            message: error.to_string(),
            unreachable: false,
            source: Box::new(error),
        })
    }
}

impl From<::postgres::Error> for StoreError {
    fn from(error: ::postgres::Error) -> Self {
        Self::Postgres(DatabaseError {
            message: postgres_message(&error),
            unreachable: error.as_db_error().is_none(),
            source: Box::new(error),
        })
    }
}

/// Where rules are kept: every write checks the rules, makes one new revision and one history
/// entry, or changes nothing.
pub trait RuleStore {
    /// The store's revision: the number of changes ever made (0 when empty).
    ///
    /// # Errors
    /// The database failed.
    fn revision(&self) -> Result<u64, StoreError>;

    /// Up to `limit` domains whose names start with `prefix`, after `after`, in name order.
    ///
    /// # Errors
    /// A `limit` of 0 or more than [`MAX_PAGE`]; the database failed.
    fn list(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Listing, StoreError>;

    /// One domain.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; the database failed.
    fn get(&self, domain: &str) -> Result<DomainRecord, StoreError>;

    /// Stores a new domain's rules (the domain the file names).
    ///
    /// # Errors
    /// Invalid rules, a domain that exists, the database failed.
    fn create(&self, text: &str, who: &str) -> Result<DomainRecord, StoreError>;

    /// Replaces a domain's rules; with `if_match`, only if the domain is at that revision.
    ///
    /// # Errors
    /// Invalid rules or rules for another domain, no such domain, a stale `if_match`, the
    /// database failed.
    fn replace(
        &self,
        domain: &str,
        text: &str,
        if_match: Option<u64>,
        who: &str,
    ) -> Result<DomainRecord, StoreError>;

    /// Deletes a domain; with `if_match`, only if it is at that revision. Returns the store's
    /// new revision.
    ///
    /// # Errors
    /// No such domain, a stale `if_match`, the database failed.
    fn delete(&self, domain: &str, if_match: Option<u64>, who: &str) -> Result<u64, StoreError>;

    /// The store's revision and every domain, read at one instant (what a retriever takes).
    ///
    /// # Errors
    /// The database failed.
    fn snapshot(&self) -> Result<(u64, Vec<DomainRecord>), StoreError>;

    /// Every change made to a domain, oldest first (also after it was deleted).
    ///
    /// # Errors
    /// The database failed.
    fn history(&self, domain: &str) -> Result<Vec<Change>, StoreError>;
}

/// A PostgreSQL error with the server's own message when there is one.
fn postgres_message(error: &::postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{}: {}", db.severity(), db.message()),
        None => {
            std::error::Error::source(error).map_or_else(|| error.to_string(), |s| format!("{error}: {s}"))
        }
    }
}

/// Checks a rules file written to `domain`: valid, and naming that domain.
fn checked_for(domain: &str, text: &str) -> Result<(), StoreError> {
    let named = checked_domain(text)?;
    if named != domain {
        return Err(StoreError::WrongDomain {
            domain: domain.to_owned(),
            named,
        });
    }
    Ok(())
}

/// Checks a rules file and returns its domain's name.
fn checked_domain(text: &str) -> Result<String, StoreError> {
    Ok(sluice_descriptors::parse_domain(text)?.name().to_owned())
}
