//! What sluice promises about hostile input, written once as checks over arbitrary bytes.
//!
//! Each check reads its input as it comes (text, a YAML file, request headers, a path), runs
//! the code under test, and panics if a promise is broken: a panic of the code itself, or an
//! invariant (a quota that does not print back to itself, a path whose normal form is not
//! normal, a key that two different requests share...). The fuzz targets in `fuzz/` call
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

mod client_ip;
mod config;
mod input;
mod key;
mod quota;
mod route_cost;

pub use client_ip::client_ip;
pub use config::config;
pub use key::key;
pub use quota::quota;
pub use route_cost::route_cost;
