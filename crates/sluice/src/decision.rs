//! The answer to a check, the same for every algorithm and every backend.

use std::time::Duration;

/// The outcome of one check.
///
/// `retry_after` is exact: the time until this same cost could be admitted if nothing else
/// consumed in between. It is zero when the check was allowed and never zero when it was
/// denied. `reset_after` is the time until the limit is back to its full capacity.
/// `delay` is non-zero only for shaping algorithms, which admit a request but ask it to wait
/// before it proceeds (its place in the queue).
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::Decision;
/// let d = Decision::denied(10, 0, 1_000_000_000, 100_000_000);
/// assert!(!d.is_allowed());
/// assert_eq!(d.retry_after(), Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy)]
#[must_use = "a decision says whether the request may proceed"]
pub struct Decision {
    limit: u64,
    /// `remaining × unit`, plus a fraction of a unit.
    remaining: u64,
    /// The times below, in units of `1/scale` ns.
    reset_after_ns: u64,
    /// Zero exactly when the request was admitted: the admission is not stored apart, which
    /// keeps the decision seven words with no padding to copy.
    retry_after_ns: u64,
    delay_ns: u64,
    /// Divisors applied when read, so a check does no division it may not need.
    unit: u64,
    scale: u64,
}

impl PartialEq for Decision {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Decision {}

impl std::hash::Hash for Decision {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl Decision {
    /// An admitted request: `remaining` units are left, the limit is full again after
    /// `reset_after_ns`.
    pub const fn allowed(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self {
            limit,
            remaining,
            reset_after_ns,
            retry_after_ns: 0,
            delay_ns: 0,
            unit: 1,
            scale: 1,
        }
    }

    /// A denied request that could be admitted after `retry_after_ns` (raised to 1 ns if 0,
    /// so a denial never tells a client to retry at once).
    pub const fn denied(limit: u64, remaining: u64, reset_after_ns: u64, retry_after_ns: u64) -> Self {
        Self {
            limit,
            remaining,
            reset_after_ns,
            retry_after_ns: if retry_after_ns == 0 { 1 } else { retry_after_ns },
            delay_ns: 0,
            unit: 1,
            scale: 1,
        }
    }

    /// A decision whose `remaining` is counted in `unit`ths of a unit and whose times are in
    /// `1/scale` ns (both at least 1); divided only when read.
    #[inline]
    pub(crate) const fn scaled(mut self, unit: u64, scale: u64) -> Self {
        self.unit = unit;
        self.scale = scale;
        self
    }

    fn key(&self) -> (bool, u64, u64, u64, u64, u64) {
        (
            self.is_allowed(),
            self.limit,
            self.remaining(),
            self.reset_after_nanos(),
            self.retry_after_nanos(),
            self.delay_nanos(),
        )
    }

    /// The same decision, admitted with a wait of `delay_ns` before the request proceeds.
    pub const fn with_delay(mut self, delay_ns: u64) -> Self {
        self.delay_ns = delay_ns;
        self
    }

    /// Whether the request was admitted.
    pub const fn is_allowed(&self) -> bool {
        self.retry_after_ns == 0
    }

    /// The capacity of the limit (the most that can be admitted at once).
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// Units that could still be admitted right now, after this decision.
    pub const fn remaining(&self) -> u64 {
        self.remaining / self.unit
    }

    /// Time until the limit is back to full capacity.
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_nanos())
    }

    /// Time until this cost could be admitted: zero if allowed, never zero if denied.
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_nanos())
    }

    /// For a shaper: how long an admitted request waits before it proceeds.
    pub const fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos())
    }

    /// [`Self::reset_after`] in nanoseconds.
    pub const fn reset_after_nanos(&self) -> u64 {
        self.reset_after_ns.div_ceil(self.scale)
    }

    /// [`Self::retry_after`] in nanoseconds.
    pub const fn retry_after_nanos(&self) -> u64 {
        self.retry_after_ns.div_ceil(self.scale)
    }

    /// [`Self::delay`] in nanoseconds.
    pub const fn delay_nanos(&self) -> u64 {
        self.delay_ns.div_ceil(self.scale)
    }
}

/// The outcome of a charge: a cost consumed after the fact, whatever was left
/// ([`crate::RateLimiter::charge_n`]).
///
/// A charge never refuses: it consumes down to the quota's floor ([`crate::Quota::max_debt`]
/// units below empty) and reports how much it took and how far below empty the limit now is.
/// Checks are denied until refill has repaid the debt, each with its exact retry-after.
///
/// # Example
/// ```
/// use sluice::{ManualClock, RateLimiter, TokenBucket};
/// let limiter = RateLimiter::with_clock(TokenBucket, "10/s".parse()?, ManualClock::new(0))?;
/// let charge = limiter.charge_n(15);
/// assert_eq!((charge.charged(), charge.debt(), charge.balance()), (15, 5, -5));
/// // Denied until 5 units are repaid and one more is back: 0.6 s at 10/s.
/// assert_eq!(limiter.check().retry_after_nanos(), 600_000_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    charged: u64,
    debt: u64,
    decision: Decision,
}

impl Charge {
    /// A charge of `charged` units leaving the limit `debt` units below empty, where a check
    /// of nothing (a peek) answers `decision`.
    pub const fn new(charged: u64, debt: u64, decision: Decision) -> Self {
        Self {
            charged,
            debt,
            decision,
        }
    }

    /// The units consumed: the cost, or less where the floor stopped it (a part of a unit
    /// counts as a unit).
    pub const fn charged(&self) -> u64 {
        self.charged
    }

    /// Units below empty after the charge, rounded up (0 if not below empty). For a shaper
    /// ([`crate::LeakyBucket::shaper`]) the delay it is serving counts: its tokens are below
    /// empty too, though checks within the maximum delay are still admitted.
    pub const fn debt(&self) -> u64 {
        self.debt
    }

    /// Units left after the charge, negative while in debt.
    pub const fn balance(&self) -> i64 {
        if self.debt > 0 {
            0i64.saturating_sub_unsigned(self.debt)
        } else {
            let remaining = self.decision.remaining();
            if remaining > i64::MAX as u64 {
                i64::MAX
            } else {
                remaining as i64
            }
        }
    }

    /// What a check of nothing answers right after the charge: denied while in debt, with
    /// the time until the debt is repaid as its retry-after; the limit, remaining and reset
    /// as any decision's.
    pub const fn decision(&self) -> &Decision {
        &self.decision
    }
}
