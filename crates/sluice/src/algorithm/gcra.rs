//! The generic cell rate algorithm: a token bucket (or leaky bucket) in one atomic word.
//!
//! Time is counted in units of `1/c` ns, where `c/p` is the quota's rate in lowest terms, so
//! one unit of cost is exactly `p` units long and every rate is exact. The word holds the
//! theoretical arrival time (TAT): the scaled time at which the bucket would be full again.
//! A check computes the new TAT and installs it with one compare-and-swap; a denial writes
//! nothing.

use super::word::{self, Step};
use super::{RETIRED, SCALED_LIMIT};
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::{Charge, Decision, Quota, QuotaError};

/// Constants of one GCRA limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraParams {
    /// Scaled units per nanosecond.
    c: u64,
    /// Scaled length of one unit of cost.
    p: u64,
    capacity: u64,
    /// Scaled length of the whole capacity (the burst tolerance).
    tau: u64,
    /// How far ahead the TAT may be after an admitted check: `tau` plus the scaled delay a
    /// shaper may impose beyond the burst (nothing for a meter).
    most_ahead: u64,
    /// How far ahead a charge may take the TAT: `tau` plus the quota's debt, or `most_ahead`
    /// if that is further.
    deepest: u64,
}

impl GcraParams {
    pub(crate) fn new(quota: &Quota, max_delay_ns: u64) -> Result<Self, QuotaError> {
        let (c, p) = quota.reduced_rate();
        // A deny-all quota never reaches a check with a positive cost; any rate serves peeks.
        let (c, p) = if c == 0 { (1, 1) } else { (c, p) };
        let tau = quota.capacity() * p; // at most 2^60, checked by Quota
        let max_delay = max_delay_ns
            .checked_mul(c)
            .filter(|d| *d <= SCALED_LIMIT - tau)
            .ok_or_else(|| {
                QuotaError::Overflow(format!(
                    "a maximum delay of {max_delay_ns} ns at {quota} cannot be held exactly"
                ))
            })?;
        // At most 2^60 (checked by Quota): with tau, below 2^61.
        let debt = quota.max_debt() * p;
        let params = Self {
            c,
            p,
            capacity: quota.capacity(),
            tau,
            most_ahead: tau + max_delay,
            deepest: (tau + max_delay).max(tau + debt),
        };
        let how = || {
            format!(
                "its rate in lowest terms is {c} per {p} ns, and that count may be at most 2^21 ({})",
                SCALED_LIMIT / super::MIN_HORIZON
            )
        };
        super::long_enough(quota, params.horizon(), how)?;
        Ok(params)
    }

    /// Scaled time stays below 2^61, TAT below 2^62.
    pub(crate) fn horizon(&self) -> u64 {
        SCALED_LIMIT / self.c
    }

    /// Room left, in units of `1/p` of a unit of cost (divided when read).
    fn room(&self, ahead: u64) -> u64 {
        self.tau.saturating_sub(ahead)
    }
}

/// The GCRA state: the scaled TAT relative to the epoch.
#[derive(Debug, Default)]
pub struct GcraState(AtomicU64);

#[inline]
pub(crate) fn check(params: &GcraParams, state: &GcraState, now: u64, cost: u64) -> Option<Decision> {
    let t = now * params.c;
    let cost_len = cost * params.p;
    // Written out rather than through `word::update`: a closure answering a `Decision` through
    // `Step` made a denied check twice as slow (`benches/direct.rs`).
    let mut tat = state.0.load(Ordering::Acquire);
    loop {
        if tat == RETIRED {
            return None;
        }
        let base = tat.max(t);
        let ahead = base - t;
        let new_ahead = ahead + cost_len;
        if new_ahead > params.most_ahead {
            let retry = new_ahead - params.most_ahead;
            let denied = Decision::denied(params.capacity, params.room(ahead), ahead, retry);
            return Some(denied.scaled(params.p, params.c));
        }
        let allowed = |ahead| {
            Decision::allowed(params.capacity, params.room(ahead), ahead)
                .with_delay(new_ahead.saturating_sub(params.tau))
                .scaled(params.p, params.c)
        };
        if cost == 0 {
            return Some(allowed(ahead));
        }
        match state
            .0
            .compare_exchange_weak(tat, base + cost_len, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Some(allowed(new_ahead)),
            Err(current) => tat = current,
        }
    }
}

/// Moves the TAT ahead by the cost, at most to `deepest`; then answers a peek.
pub(crate) fn charge(params: &GcraParams, state: &GcraState, now: u64, cost: u64) -> Option<Charge> {
    let t = now * params.c;
    let cost_len = cost.saturating_mul(params.p);
    let (charged, ahead) = word::update(&state.0, |tat| {
        let base = tat.max(t);
        let ahead = base - t;
        let new_ahead = ahead.saturating_add(cost_len).min(params.deepest.max(ahead));
        let charged = (new_ahead - ahead).div_ceil(params.p);
        if new_ahead == ahead {
            Step::Answer((charged, ahead))
        } else {
            Step::Write(t + new_ahead, (charged, new_ahead))
        }
    })?;
    let debt = ahead.saturating_sub(params.tau).div_ceil(params.p);
    // The peek that follows may see other checks' work: it answers for the state as it is.
    let decision = check(params, state, now, 0)?;
    Some(Charge::new(charged, debt, decision))
}

pub(crate) fn retire(state: &GcraState) -> u64 {
    word::retire(&state.0)
}

/// Carries the consumption of `tat` (under `old`) into a state under `new` at `now`.
///
/// The same rate (an epoch move, or a new capacity) keeps the scaled time exactly. Another rate
/// counts the consumption in whole units, rounded up: the Redis script counts in µs-scaled
/// units and this one in ns-scaled units, so only whole units re-express exactly in both (and a
/// partly consumed unit stays consumed, which never over-admits).
pub(crate) fn carry_over(old: &GcraParams, tat: u64, new: &GcraParams, now: u64) -> (u64, GcraState) {
    // `now` may lie far past the horizon (a clock jump before an epoch move or a change): a
    // product past u64 is past any TAT, so nothing is ahead.
    let ahead = now.checked_mul(old.c).map_or(0, |t| tat.saturating_sub(t));
    // Debt is carried whole at the same rate and capacity (an epoch move, or a new debt
    // floor, which bounds later charges: as the Redis script, which stores no floor); another
    // rate or capacity forgives it.
    let same_bucket = (old.c, old.p, old.most_ahead) == (new.c, new.p, new.most_ahead);
    let cap = if same_bucket {
        new.deepest.max(old.deepest)
    } else {
        new.most_ahead
    }; // below 2^61
    let ahead = if (old.c, old.p) == (new.c, new.p) {
        ahead.min(cap)
    } else {
        // Capped in units before multiplying: the product stays below 2^61 + 2^60.
        let units = ahead.div_ceil(old.p).min(cap.div_ceil(new.p));
        (units * new.p).min(cap)
    };
    (now, GcraState(AtomicU64::new(ahead)))
}

pub(crate) fn is_idle(params: &GcraParams, state: &GcraState, now: u64) -> bool {
    let tat = state.0.load(Ordering::Acquire);
    tat != RETIRED && tat <= now * params.c
}

/// Moves the TAT back by the cost, but not below the time the cost was taken: a TAT at or
/// before that time already means a full bucket, so the result is the TAT the state would have
/// had without the check.
pub(crate) fn refund(params: &GcraParams, state: &GcraState, taken_at: u64, cost: u64) -> bool {
    let floor = taken_at * params.c;
    let cost_len = cost * params.p;
    word::update(&state.0, |tat| {
        let back = tat.saturating_sub(cost_len).max(floor).min(tat);
        if back == tat {
            Step::Answer(())
        } else {
            Step::Write(back, ())
        }
    })
    .is_some()
}
