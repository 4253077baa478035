//! The rules service's costs, on a store file in a temporary directory (SQLite, WAL, each
//! write synced) and over a loopback socket:
//!
//! - `import/one_domain_10k_rules`: one domain of 10 000 descriptors, each with its own
//!   limit, stored into a new store (checked, one transaction);
//! - `import/1000_domains_10k_rules`: 1000 domains of 10 rules each, one create each (what
//!   `sluice rules import DIR` does per file);
//! - `poll/unchanged`: a host's poll of a store holding those 10 000 rules, asking with the
//!   store's revision: a new connection, `GET /v1/rules`, the 304;
//! - `poll/changed`: the same poll when the store has moved on: the whole snapshot sent,
//!   then read and every domain checked on the host (what a host pays for one change).
//!
//! Run with `cargo bench -p sluice-rules --bench rules`. Applying a change to an engine that
//! holds 1M counters is `cargo bench -p sluice-service --bench reload`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sluice_rules::{RuleStore, RulesApi, SqliteStore, Tokens};
use sluice_rules_client::{Fetched, RulesSource};

/// A domain of `rules` descriptors, `user` values `u0`, `u1`, ..., each with its own limit.
fn domain(name: &str, rules: usize) -> String {
    let mut text = format!("domain: {name}\ndescriptors:\n");
    for i in 0..rules {
        text.push_str(&format!(
            "  - key: user\n    value: u{i}\n    rate_limit: {{unit: minute, requests_per_unit: {}}}\n",
            100 + i
        ));
    }
    text
}

fn fresh_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = SqliteStore::open(&dir.path().join("rules.db")).expect("a new store");
    (dir, store)
}

fn import(c: &mut Criterion) {
    let one = domain("edge", 10_000);
    let many: Vec<String> = (0..1000).map(|i| domain(&format!("d{i:04}"), 10)).collect();
    let mut group = c.benchmark_group("import");
    group.sample_size(10);
    group.bench_function("one_domain_10k_rules", |b| {
        b.iter_batched(
            fresh_store,
            |(dir, store)| {
                store.create(&one, "bench").expect("stored");
                (dir, store)
            },
            BatchSize::PerIteration,
        );
    });
    group.bench_function("1000_domains_10k_rules", |b| {
        b.iter_batched(
            fresh_store,
            |(dir, store)| {
                for text in &many {
                    store.create(text, "bench").expect("stored");
                }
                assert_eq!(store.revision().expect("a revision"), 1000);
                (dir, store)
            },
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

fn poll(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let (_dir, store) = fresh_store();
    for i in 0..1000 {
        store
            .create(&domain(&format!("d{i:04}"), 10), "bench")
            .expect("stored");
    }
    let revision = store.revision().expect("a revision");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a listener");
    let address = listener.local_addr().expect("its address");
    let api = RulesApi::new(Arc::new(store), Tokens::default());
    runtime.spawn(async move { api.serve(listener, std::future::pending()).await });
    let source = RulesSource::new(&format!("http://{address}"), None).expect("a URL");
    // Both cases answer what they are named for.
    let first = runtime
        .block_on(source.fetch(Some(revision - 1)))
        .expect("a snapshot");
    assert!(matches!(first, Fetched::Changed(ref s) if s.rules.len() == 10_000));
    let unchanged = runtime.block_on(source.fetch(Some(revision))).expect("a 304");
    assert!(matches!(unchanged, Fetched::Unchanged));

    let mut group = c.benchmark_group("poll");
    group.bench_function("unchanged", |b| {
        b.iter(|| black_box(runtime.block_on(source.fetch(Some(revision))).expect("a 304")));
    });
    group.sample_size(10);
    group.bench_function("changed", |b| {
        b.iter(|| {
            black_box(
                runtime
                    .block_on(source.fetch(Some(revision - 1)))
                    .expect("a snapshot"),
            )
        });
    });
    group.finish();
}

criterion_group!(benches, import, poll);
criterion_main!(benches);
