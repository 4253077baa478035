//! What sluice promises about hostile input, written once as checks over arbitrary bytes.
//!
//! Each check reads its input as it comes (text, a YAML file, request headers, a path, what
//! a network port receives), runs the code under test, and panics if a promise is broken: a
//! panic of the code itself, or an invariant (a quota that does not print back to itself, a
//! path whose normal form is not normal, a key that two different requests share...). The fuzz targets in `fuzz/` call
//! them on libFuzzer's inputs (`scripts/fuzz.sh`); this crate's tests call them on bounded
//! proptest inputs, so the normal test suite covers them too.
//!
//! Panicking is the point here: this crate is a test harness, never linked into sluice.
//!
//! ```
//! sluice_invariants::quota(b"10/min burst 20");
//! sluice_invariants::route_cost(b"\x00//a/../%65xport");
//! ```

#![forbid(unsafe_code)]

mod check_api;
mod client_ip;
mod config;
mod descriptors;
mod input;
mod key;
mod quota;
mod rls;
mod route_cost;
mod rules_api;
mod service;
mod snapshot;

pub use check_api::check_api;
pub use client_ip::client_ip;
pub use config::config;
pub use descriptors::descriptor_rules;
pub use key::key;
pub use quota::quota;
pub use rls::rls;
pub use route_cost::route_cost;
pub use rules_api::{rules_document, rules_patch};
pub use snapshot::{rules_answer, snapshot};
