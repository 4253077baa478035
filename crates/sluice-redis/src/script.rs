//! The Lua scripts, and the translation between quotas, script arguments and decisions.
//!
//! Redis runs Lua numbers as doubles, exact for integers below 2^53. Every value a script
//! computes is kept below [`EXACT_LIMIT`] (2^50, leaving room for sums), and quotas that could
//! not be held so are refused with [`QuotaTooLarge`]. Precision:
//!
//! - token bucket (GCRA): exact. Time is Redis' clock in microseconds; the bucket counts in
//!   units of `1/k` µs, where `k` is chosen (from the quota's exact rate) so one unit of cost
//!   is a whole number `p` of them. Decisions equal the core [`sluice::TokenBucket`]'s for the
//!   same instants, to the nanosecond.
//! - windows: a window is the quota's fill time rounded up to whole microseconds, aligned to
//!   Redis' clock (Unix time), and all times are whole microseconds.
//!
//! Quota changes: each state is stored with the parameters of the quota it counts under (GCRA:
//! `k`, `p` and `tau`; fixed window and counter: window length and limit; log: `w` and `l` in
//! its hash). A check under other parameters first carries the state over by the core's rule
//! ([`sluice::Algorithm::carry_over`]): GCRA at the same rate exactly, capped at the new burst,
//! at another rate in whole units rounded up, capped at the new capacity; the window
//! algorithms into the new length's window on Unix time. The conversion is written even when
//! that check denies or peeks, so a later check does not convert the old state again. A state
//! stored without them (by an earlier version) counts as stored under the check's quota. With
//! the same parameters a check costs what it did: one `GET` and at most one `SET` (the log: one
//! `HMGET`, one `HSET`).

use std::sync::LazyLock;

use redis::Script;
use sluice::{Charge, Decision, Quota};

use crate::QuotaTooLarge;

/// The bound kept on every number a script handles.
pub(crate) const EXACT_LIMIT: u64 = 1 << 50;

const PRELUDE: &str = include_str!("../lua/prelude.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

static GCRA: LazyLock<Script> = LazyLock::new(|| script(include_str!("../lua/gcra.lua")));
static FIXED_WINDOW: LazyLock<Script> = LazyLock::new(|| script(include_str!("../lua/fixed_window.lua")));
static SLIDING_COUNTER: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("../lua/sliding_counter.lua")));
static SLIDING_LOG: LazyLock<Script> = LazyLock::new(|| script(include_str!("../lua/sliding_log.lua")));
/// A group of limits of one algorithm decided all or nothing in one call: the algorithm's
/// script as a function, and `group.lua` running it on each limit.
fn group(body: &str) -> Script {
    let runner = include_str!("../lua/group.lua");
    Script::new(&format!(
        "{PRELUDE}\nlocal function body(KEYS, ARGV)\n{body}\nend\n{runner}"
    ))
}

static GROUP_GCRA: LazyLock<Script> = LazyLock::new(|| group(include_str!("../lua/gcra.lua")));
static GROUP_FIXED_WINDOW: LazyLock<Script> =
    LazyLock::new(|| group(include_str!("../lua/fixed_window.lua")));
static GROUP_SLIDING_COUNTER: LazyLock<Script> =
    LazyLock::new(|| group(include_str!("../lua/sliding_counter.lua")));
static GROUP_SLIDING_LOG: LazyLock<Script> = LazyLock::new(|| group(include_str!("../lua/sliding_log.lua")));
pub(crate) static CONCURRENCY: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("../lua/concurrency.lua")));

/// Which script decides a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// GCRA.
    TokenBucket,
    /// Fixed window counter.
    FixedWindow,
    /// Sliding window counter.
    SlidingWindowCounter,
    /// Sliding window log.
    SlidingWindowLog,
}

impl Kind {
    pub(crate) fn script(self) -> &'static Script {
        match self {
            Kind::TokenBucket => &GCRA,
            Kind::FixedWindow => &FIXED_WINDOW,
            Kind::SlidingWindowCounter => &SLIDING_COUNTER,
            Kind::SlidingWindowLog => &SLIDING_LOG,
        }
    }

    /// The script deciding a group of this algorithm's limits all or nothing (`group.lua`).
    pub(crate) fn group_script(self) -> &'static Script {
        match self {
            Kind::TokenBucket => &GROUP_GCRA,
            Kind::FixedWindow => &GROUP_FIXED_WINDOW,
            Kind::SlidingWindowCounter => &GROUP_SLIDING_COUNTER,
            Kind::SlidingWindowLog => &GROUP_SLIDING_LOG,
        }
    }

    /// Whether a reply's room is in units of the limit's `p` (the GCRA), not in units of cost.
    pub(crate) fn scaled_room(self) -> bool {
        self == Kind::TokenBucket
    }

    /// A short name, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token bucket (GCRA)",
            Kind::FixedWindow => "fixed window",
            Kind::SlidingWindowCounter => "sliding window counter",
            Kind::SlidingWindowLog => "sliding window log",
        }
    }

    /// The Redis keys of the limit named `tag` (already wrapped in `{}`, so all keys of one
    /// limit hash to the same Redis Cluster slot).
    pub(crate) fn keys(self, tag: &str) -> Vec<String> {
        match self {
            Kind::TokenBucket => vec![format!("{tag}:tb")],
            Kind::FixedWindow => vec![format!("{tag}:fw")],
            Kind::SlidingWindowCounter => vec![format!("{tag}:sc")],
            Kind::SlidingWindowLog => vec![format!("{tag}:sl"), format!("{tag}:sn")],
        }
    }
}

/// A quota compiled into script arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) kind: Kind,
    capacity: u64,
    shape: Shape,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// `k` scaled units per microsecond, `p` per unit of cost, `tau` for the whole capacity.
    Gcra { k: u64, p: u64, tau: u64 },
    /// Window length in microseconds.
    Window { micros: u64 },
}

fn too_large(quota: &Quota, reason: &'static str) -> QuotaTooLarge {
    QuotaTooLarge {
        quota: *quota,
        reason,
    }
}

impl Plan {
    /// Compiles a quota that is not [`Quota::deny_all`].
    pub(crate) fn new(kind: Kind, quota: &Quota) -> Result<Self, QuotaTooLarge> {
        let capacity = quota.capacity();
        let shape = match kind {
            Kind::TokenBucket => {
                // k units every p µs, in lowest terms: count time in 1/k µs.
                let (k, p) = quota.reduced_rate_per(1000);
                let p = u128::from(p);
                let fit = |x: u128| u64::try_from(x).ok().filter(|x| *x <= EXACT_LIMIT);
                match (fit(k), fit(p), fit(u128::from(capacity) * p)) {
                    (Some(k), Some(p), Some(tau)) => Shape::Gcra { k, p, tau },
                    _ => {
                        return Err(too_large(
                            quota,
                            "its burst in units of 1/k µs must stay below 2^50",
                        ));
                    }
                }
            }
            _ => {
                let micros = quota.fill_time_nanos().div_ceil(1000).max(1);
                let product = u128::from(capacity) * u128::from(micros);
                if product > u128::from(EXACT_LIMIT) {
                    return Err(too_large(quota, "capacity × window in µs must stay below 2^50"));
                }
                Shape::Window { micros }
            }
        };
        Ok(Self {
            kind,
            capacity,
            shape,
        })
    }

    /// The script arguments after `cost, force, now`.
    pub(crate) fn args(&self) -> [u64; 3] {
        match self.shape {
            Shape::Gcra { k, p, tau } => [k, p, tau],
            Shape::Window { micros } => [micros, self.capacity, 0],
        }
    }

    /// The arguments of a charge after the cost (mode 2), the Redis time and [`Plan::args`]:
    /// how far ahead of full it may take the bucket, the quota's debt below empty (as much of
    /// it as the scripts hold exactly). `None` for the window algorithms, whose scripts take
    /// no charge (their stored state has no room for debt).
    pub(crate) fn charge_limit(&self, quota: &Quota) -> Option<u64> {
        let Shape::Gcra { p, tau, .. } = self.shape else {
            return None;
        };
        let debt = u128::from(quota.max_debt()) * u128::from(p);
        let room = u128::from(EXACT_LIMIT - tau);
        Some(tau + u64::try_from(debt.min(room)).unwrap_or(0))
    }

    /// The charge a script's reply to a charge means: a peek after it, what it took and the
    /// debt.
    pub(crate) fn charge(&self, reply: &[i64]) -> Option<Charge> {
        let (&[_, _, ahead, _, taken], Shape::Gcra { p, tau, .. }) = (reply, self.shape) else {
            return None;
        };
        let peek = self.decision(&reply[..4])?;
        let [ahead, taken] = [ahead, taken].map(|v| u64::try_from(v).unwrap_or(0));
        Some(Charge::new(
            taken.div_ceil(p),
            ahead.saturating_sub(tau).div_ceil(p),
            peek,
        ))
    }

    /// The decision a script's reply means.
    pub(crate) fn decision(&self, reply: &[i64]) -> Option<Decision> {
        if let (&[0, remaining, reset, base, count, room], Shape::Window { micros }) = (reply, self.shape) {
            return Some(self.counter_denial([remaining, reset], base, count, room, micros));
        }
        let &[allowed, a, b, c] = reply else { return None };
        let [a, b, c] = [a, b, c].map(|v| u64::try_from(v).unwrap_or(0));
        let cap = self.capacity;
        Some(match self.shape {
            Shape::Gcra { k, p, .. } => {
                // Scaled units of 1/k µs to ns, rounded up as the core does.
                let nanos = |x: u64| {
                    let ns = (u128::from(x) * 1000).div_ceil(u128::from(k));
                    u64::try_from(ns).unwrap_or(u64::MAX)
                };
                if allowed == 1 {
                    Decision::allowed(cap, a / p, nanos(b))
                } else {
                    Decision::denied(cap, a / p, nanos(b), nanos(c))
                }
            }
            Shape::Window { .. } => {
                let nanos = |x: u64| x.saturating_mul(1000);
                if allowed == 1 {
                    Decision::allowed(cap, a, nanos(b))
                } else {
                    Decision::denied(cap, a, nanos(b), nanos(c))
                }
            }
        })
    }

    /// A sliding window counter's denial: the retry time is `base` µs plus the time the
    /// weighted count of `count` units takes to leave `room` free, computed in nanoseconds as
    /// the core does.
    fn counter_denial(
        &self,
        [remaining, reset]: [i64; 2],
        base: i64,
        count: i64,
        room: i64,
        micros: u64,
    ) -> Decision {
        let window = i128::from(micros) * 1000;
        let (count, room) = (i128::from(count), i128::from(room));
        let decayed = if count <= 0 {
            0
        } else {
            (window - room * window / count).max(0)
        };
        let retry = (i128::from(base) * 1000 + decayed).max(0);
        let unsigned = |v: i128| u64::try_from(v).unwrap_or(0);
        Decision::denied(
            self.capacity,
            unsigned(remaining.into()),
            unsigned(i128::from(reset) * 1000),
            unsigned(retry),
        )
    }
}
