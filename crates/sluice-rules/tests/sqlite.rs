//! The SQLite rules store on real files: every store case (writes checked, versioned and
//! kept in the history; stale writes refused with nothing changed; pages; two stores on one
//! file; concurrent writers), and the schema's version guarded.

mod cases;

use sluice_rules::{RuleStore, SqliteStore, StoreError};

use cases::rules;

/// Runs `case` on a new database file, opened by every call of its `open`.
fn on_a_file(case: fn(&dyn Fn() -> SqliteStore)) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.db");
    case(&|| SqliteStore::open(&path).unwrap());
}

#[test]
fn writes_make_one_revision_each_and_the_history_keeps_before_and_after() {
    on_a_file(cases::writes_make_one_revision_each_and_the_history_keeps_before_and_after);
}

#[test]
fn refused_writes_change_nothing() {
    on_a_file(cases::refused_writes_change_nothing);
}

#[test]
fn domains_are_listed_by_prefix_in_pages() {
    on_a_file(cases::domains_are_listed_by_prefix_in_pages);
}

#[test]
fn two_stores_on_one_file_share_the_rules_and_one_revision() {
    on_a_file(cases::two_stores_on_one_database_share_the_rules_and_one_revision);
}

#[test]
fn concurrent_writers_get_distinct_revisions_and_lose_nothing() {
    on_a_file(cases::concurrent_writers_get_distinct_revisions_and_lose_nothing);
}

#[test]
fn a_database_from_a_newer_sluice_is_refused_and_a_reopened_one_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.db");
    let store = SqliteStore::open(&path).unwrap();
    store.create(&rules("edge", 60), "alice").unwrap();
    drop(store);
    // Reopening migrates nothing and keeps everything.
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.revision().unwrap(), 1);
    drop(store);
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "user_version", 99).unwrap();
    drop(raw);
    let error = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::NewerSchema { found: 99, known: 1 }),
        "{error:?}"
    );
    // Not a database at all.
    let garbage = dir.path().join("garbage.db");
    std::fs::write(
        &garbage,
        b"this is not a database, just text long enough to look at",
    )
    .unwrap();
    assert!(SqliteStore::open(&garbage).is_err());
}
