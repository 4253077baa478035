//! The write flow both stores share: check the rules and the `If-Match` revision, take the
//! next store revision, change the domain and keep one history row, all in one transaction.
//! A store supplies only its dialect ([`Writes`]) and how it opens and locks that transaction
//! ([`Writer`]).

use crate::{DomainRecord, StoreError, checked_domain, checked_for};

/// A dialect's primitive operations, inside one write transaction.
pub(crate) trait Writes {
    /// The domain as it is, held against other writers until the transaction ends.
    fn find(&mut self, domain: &str) -> Result<Option<DomainRecord>, StoreError>;
    /// Inserts a new domain; false if it exists already.
    fn insert(&mut self, record: &DomainRecord) -> Result<bool, StoreError>;
    /// Replaces an existing domain's rules and revision.
    fn update(&mut self, record: &DomainRecord) -> Result<(), StoreError>;
    /// Deletes a domain.
    fn remove(&mut self, domain: &str) -> Result<(), StoreError>;
    /// Keeps one change in the history.
    fn record(
        &mut self,
        revision: u64,
        domain: &str,
        who: &str,
        before: Option<&str>,
        after: Option<&str>,
    ) -> Result<(), StoreError>;
}

/// A store that runs writes.
pub(crate) trait Writer {
    /// Runs `write` in one transaction that holds the store's revision (other writers wait),
    /// with the next revision; commits it, and the revision, only if `write` succeeds.
    fn write<T>(
        &self,
        write: impl FnOnce(&mut dyn Writes, u64) -> Result<T, StoreError>,
    ) -> Result<T, StoreError>;
}

pub(crate) fn create(store: &impl Writer, text: &str, who: &str) -> Result<DomainRecord, StoreError> {
    let domain = checked_domain(text)?;
    store.write(|writes, revision| {
        let created = DomainRecord {
            domain,
            text: text.to_owned(),
            revision,
        };
        if !writes.insert(&created)? {
            return Err(StoreError::Exists(created.domain));
        }
        writes.record(revision, &created.domain, who, None, Some(text))?;
        Ok(created)
    })
}

pub(crate) fn replace(
    store: &impl Writer,
    domain: &str,
    text: &str,
    if_match: Option<u64>,
    who: &str,
) -> Result<DomainRecord, StoreError> {
    checked_for(domain, text)?;
    store.write(|writes, revision| {
        let held = matching(writes, domain, if_match)?;
        let replaced = DomainRecord {
            domain: domain.to_owned(),
            text: text.to_owned(),
            revision,
        };
        writes.update(&replaced)?;
        writes.record(revision, domain, who, Some(&held.text), Some(text))?;
        Ok(replaced)
    })
}

pub(crate) fn delete(
    store: &impl Writer,
    domain: &str,
    if_match: Option<u64>,
    who: &str,
) -> Result<u64, StoreError> {
    store.write(|writes, revision| {
        let held = matching(writes, domain, if_match)?;
        writes.remove(domain)?;
        writes.record(revision, domain, who, Some(&held.text), None)?;
        Ok(revision)
    })
}

/// The domain as it is, if `if_match` names its revision (or names none).
fn matching(
    writes: &mut dyn Writes,
    domain: &str,
    if_match: Option<u64>,
) -> Result<DomainRecord, StoreError> {
    let held = writes
        .find(domain)?
        .ok_or_else(|| StoreError::NotFound(domain.to_owned()))?;
    match if_match {
        Some(expected) if expected != held.revision => Err(StoreError::Stale {
            domain: domain.to_owned(),
            expected,
            current: held.revision,
        }),
        _ => Ok(held),
    }
}
