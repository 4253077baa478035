//! # sluice: exact, fast rate limiting
//!
//! sluice decides whether a request may proceed under a [`Quota`] such as `100/s` or
//! `10/min burst 20`, with any of the classic algorithms:
//!
//! | algorithm | state | notes |
//! |---|---|---|
//! | [`TokenBucket`] | one atomic word (GCRA) | smooth; the default choice |
//! | [`LeakyBucket`] | one atomic word (GCRA) | as a meter, or as a shaper that returns a delay |
//! | [`FixedWindow`] | one atomic word | cheapest; up to 2× capacity across a boundary |
//! | [`SlidingWindowLog`] | log under a mutex | exact sliding window, memory up to capacity |
//! | [`SlidingWindowCounter`] | two counters under a mutex | approximates the sliding window |
//!
//! and beside them a [`ConcurrencyLimiter`] (permits held until released).
//!
//! A request without capacity can also wait for it, in a bounded queue served oldest- or
//! newest-first ([`wait`]: [`WaitingLimiter`], [`WaitingKeyed`], [`WaitingConcurrency`]), and
//! one request can answer to several limits at once, all or nothing ([`chain`]).
//!
//! Every check returns a [`Decision`]: allowed or not, the limit, what remains, when the limit
//! is full again and, when denied, exactly when this cost could be admitted. Decisions are
//! exact: time is an integer count of nanoseconds from a [`Clock`], rates are integer ratios,
//! and concurrent checks are linearizable.
//!
//! ```
//! use sluice::{Quota, RateLimiter, TokenBucket};
//!
//! let limiter = RateLimiter::new(TokenBucket, "10/s burst 20".parse::<Quota>()?)?;
//! let decision = limiter.check();
//! if decision.is_allowed() {
//!     // serve the request
//! } else {
//!     println!("retry in {:?}", decision.retry_after());
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod algorithm;
pub mod chain;
mod clock;
mod concurrency;
mod decision;
mod error;
pub mod keyed;
mod limiter;
mod quota;
mod stable;
mod sync;
mod tsc;
pub mod wait;

pub use algorithm::{
    Algorithm, FixedWindow, LeakyBucket, SlidingWindowCounter, SlidingWindowLog, TokenBucket, Unmetered,
};
pub use algorithm::{AlgorithmKind, AlgorithmVisitor, UnknownAlgorithm};
pub use chain::{ChainDecision, ChainError, KeyedLink, Link, Receipt, check_chain};
pub use clock::{Clock, ManualClock, MonotonicClock, saturating_nanos};
pub use concurrency::{AcquireError, ConcurrencyLimiter, OwnedPermit, Permit};
pub use decision::{Charge, Decision};
pub use error::CheckError;
pub use keyed::{
    DEFAULT_CAPACITY, DEFAULT_FETCH_TIMEOUT, DEFAULT_MAX_FETCHES, DEFAULT_REFRESH, FetchError, FetchResult,
    FnSource, KeyedBuildError, KeyedBuilder, KeyedLimiter, KeyedMetrics, MAX_REFRESH, Migrated, QuotaSource,
    Spawner, StaticQuotas, Task,
};
pub use limiter::RateLimiter;

/// The `tracing` target of the spans sluice's crates open for export (a decision, a Redis call,
/// a quota fetch, a rules poll), all at level `TRACE`: a subscriber that exports traces enables
/// this target alone, and with none enabled each costs one level check.
///
/// ```
/// // A filter that passes the exported spans alone:
/// let exported = |target: &str| target == sluice::TRACE_TARGET;
/// assert!(exported("sluice::trace") && !exported("sluice::denied"));
/// ```
pub const TRACE_TARGET: &str = "sluice::trace";
pub use quota::{DurationError, MAX_SCALED_BURST, Quota, QuotaError, parse_duration};
#[cfg(feature = "wait")]
pub use wait::TokioClock;
pub use wait::{
    QueueOrder, QueuedPermit, WaitError, WaitPolicy, WaitingConcurrency, WaitingKeyed, WaitingLimiter,
};
