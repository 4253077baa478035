//! The store tests every `RuleStore` passes: each case takes `open`, whose every call opens
//! the same fresh database (the first call on it makes it).

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;

use sluice_rules::{RuleStore, StoreError};

pub fn rules(domain: &str, per_minute: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: ip\n    rate_limit: {{unit: minute, requests_per_unit: {per_minute}}}\n"
    )
}

pub fn writes_make_one_revision_each_and_the_history_keeps_before_and_after<
    S: RuleStore + Send + Sync + 'static,
>(
    open: &dyn Fn() -> S,
) {
    let store = open();
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

pub fn refused_writes_change_nothing<S: RuleStore + Send + Sync + 'static>(open: &dyn Fn() -> S) {
    let store = open();
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

pub fn domains_are_listed_by_prefix_in_pages<S: RuleStore + Send + Sync + 'static>(open: &dyn Fn() -> S) {
    let store = open();
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

pub fn two_stores_on_one_database_share_the_rules_and_one_revision<S: RuleStore + Send + Sync + 'static>(
    open: &dyn Fn() -> S,
) {
    let first = open();
    let second = open();
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

pub fn concurrent_writers_get_distinct_revisions_and_lose_nothing<S: RuleStore + Send + Sync + 'static>(
    open: &dyn Fn() -> S,
) {
    let store = open();
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
