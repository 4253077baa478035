//! The SQLite rules store on real files: writes checked, versioned and kept in the history;
//! stale writes refused with nothing changed; pages; two stores on one file; the schema's
//! version guarded.

use std::collections::BTreeSet;
use std::sync::Arc;

use sluice_rules::{RuleStore, SqliteStore, StoreError};

fn rules(domain: &str, per_minute: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: ip\n    rate_limit: {{unit: minute, requests_per_unit: {per_minute}}}\n"
    )
}

fn file_store() -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("rules.db")).unwrap();
    (store, dir)
}

#[test]
fn writes_make_one_revision_each_and_the_history_keeps_before_and_after() {
    let (store, _dir) = file_store();
    assert_eq!(store.revision().unwrap(), 0);
    let edge = store.create(&rules("edge", 60), "alice").unwrap();
    let api = store.create(&rules("api", 10), "alice").unwrap();
    let edge2 = store
        .replace("edge", &rules("edge", 30), Some(edge.revision), "bob")
        .unwrap();
    assert_eq!((edge.revision, api.revision, edge2.revision), (1, 2, 3));
    assert_eq!(store.get("edge").unwrap(), edge2);
    assert_eq!(store.delete("api", None, "carol").unwrap(), 4);
    assert!(matches!(store.get("api"), Err(StoreError::NotFound(_))));
    assert_eq!(store.revision().unwrap(), 4);

    let history = store.history("edge").unwrap();
    let seen: Vec<_> = history
        .iter()
        .map(|c| (c.revision, c.who.as_str(), c.before.clone(), c.after.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (1, "alice", None, Some(rules("edge", 60))),
            (3, "bob", Some(rules("edge", 60)), Some(rules("edge", 30))),
        ]
    );
    // A deleted domain's history stays.
    let api_history = store.history("api").unwrap();
    assert_eq!(api_history.len(), 2);
    assert_eq!(api_history[1].after, None);
    assert!(api_history.iter().all(|c| c.at_unix_ms > 1_600_000_000_000));
}

#[test]
fn refused_writes_change_nothing() {
    let (store, _dir) = file_store();
    let edge = store.create(&rules("edge", 60), "alice").unwrap();
    store.replace("edge", &rules("edge", 50), None, "bob").unwrap();
    let before = (store.revision().unwrap(), store.history("edge").unwrap());

    // A write that read revision 1, after revision 2 was made.
    let stale = store.replace("edge", &rules("edge", 40), Some(edge.revision), "carol");
    assert!(
        matches!(
            stale,
            Err(StoreError::Stale {
                expected: 1,
                current: 2,
                ..
            })
        ),
        "{stale:?}"
    );
    assert!(matches!(
        store.delete("edge", Some(1), "carol"),
        Err(StoreError::Stale { .. })
    ));
    // Invalid rules name the field.
    let invalid = store
        .replace(
            "edge",
            "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
            None,
            "carol",
        )
        .unwrap_err();
    assert!(
        invalid.to_string().contains("descriptors[0].rate_limit.unit"),
        "{invalid}"
    );
    // Rules for another domain, a domain that exists, one that does not.
    assert!(matches!(
        store.replace("edge", &rules("api", 1), None, "carol"),
        Err(StoreError::WrongDomain { .. })
    ));
    assert!(matches!(
        store.create(&rules("edge", 1), "carol"),
        Err(StoreError::Exists(_))
    ));
    assert!(matches!(
        store.replace("nowhere", &rules("nowhere", 1), None, "carol"),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.delete("nowhere", None, "carol"),
        Err(StoreError::NotFound(_))
    ));

    assert_eq!(
        (store.revision().unwrap(), store.history("edge").unwrap()),
        before
    );
    assert_eq!(store.get("edge").unwrap().text, rules("edge", 50));
}

#[test]
fn domains_are_listed_by_prefix_in_pages() {
    let store = SqliteStore::in_memory().unwrap();
    let names = ["a%b", "a_c", "api", "api-v2", "apx", "edge", "edge-eu"];
    for name in names {
        store.create(&rules(name, 1), "alice").unwrap();
    }
    let page = |prefix: &str, after: Option<&str>, limit: usize| {
        let listing = store.list(prefix, after, limit).unwrap();
        let names: Vec<String> = listing.domains.into_iter().map(|d| d.domain).collect();
        (names, listing.next)
    };
    assert_eq!(
        page("api", None, 10),
        (vec!["api".to_string(), "api-v2".to_string()], None)
    );
    // `%` and `_` are plain characters in a prefix.
    assert_eq!(page("a%", None, 10).0, ["a%b"]);
    assert_eq!(page("a_", None, 10).0, ["a_c"]);
    // Every name once, page by page.
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let (names, next) = page("", after.as_deref(), 3);
        all.extend(names);
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(all, names);
    assert!(matches!(store.list("", None, 0), Err(StoreError::PageSize(0))));
    assert!(matches!(
        store.list("", None, 1001),
        Err(StoreError::PageSize(1001))
    ));
}

#[test]
fn two_stores_on_one_file_share_the_rules_and_one_revision() {
    let (first, dir) = file_store();
    let second = SqliteStore::open(&dir.path().join("rules.db")).unwrap();
    let edge = first.create(&rules("edge", 60), "alice").unwrap();
    assert_eq!(second.get("edge").unwrap(), edge);
    let changed = second
        .replace("edge", &rules("edge", 30), Some(1), "bob")
        .unwrap();
    assert_eq!(changed.revision, 2);
    // The first store's reader sees it, and its stale write is refused.
    assert_eq!(first.revision().unwrap(), 2);
    assert!(matches!(
        first.replace("edge", &rules("edge", 10), Some(1), "carol"),
        Err(StoreError::Stale { .. })
    ));
}

#[test]
fn concurrent_writers_get_distinct_revisions_and_lose_nothing() {
    let (store, _dir) = file_store();
    let store = Arc::new(store);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..25 {
                    store.create(&rules(&format!("d{t}-{i}"), 1), "writer").unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(store.revision().unwrap(), 100);
    let revisions: BTreeSet<u64> = store
        .list("", None, 1000)
        .unwrap()
        .domains
        .iter()
        .map(|d| d.revision)
        .collect();
    assert_eq!(revisions, (1..=100).collect());
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
