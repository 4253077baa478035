//! A single limit shared by many threads: the direct limiter.

#[cfg(all(test, loom))]
mod loom_tests;
mod refund;
#[cfg(all(test, not(loom)))]
mod tests;

use crate::algorithm::succeed;
use crate::chain::Receipt;
use crate::stable::StableBox;
use crate::sync::atomic::{AtomicPtr, Ordering};
use crate::sync::{Mutex, lock};
use crate::{Algorithm, CheckError, Clock, Decision, MonotonicClock, Quota, QuotaError};

/// One limit (not keyed), checked lock-free from any number of threads.
///
/// The quota can be changed while the limiter is in use ([`RateLimiter::set_quota`]): what
/// was consumed and still counts stays consumed, capped at the new capacity, and recovers at
/// the new rate. Checks never wait on a change.
///
/// # Example
/// ```
/// use sluice::{Quota, RateLimiter, TokenBucket};
/// let limiter = RateLimiter::new(TokenBucket, "2/s".parse::<Quota>()?)?;
/// assert!(limiter.check().is_allowed());
/// assert!(limiter.check().is_allowed());
/// let denied = limiter.check();
/// assert!(!denied.is_allowed());
/// assert!(denied.retry_after().as_millis() > 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RateLimiter<A: Algorithm, C: Clock = MonotonicClock> {
    algorithm: A,
    clock: C,
    /// The limit in force; always one of `installed`.
    current: AtomicPtr<Limit<A>>,
    /// Every limit ever installed, kept until the limiter drops, because a check may still be
    /// reading one that was just retired. A quota change or an epoch move adds one; an epoch
    /// moves at most every 2^39 ns (9 minutes: algorithms refuse quotas they cannot count for
    /// 2^40 ns, and a move keeps at least half of that), and only for rates with a large
    /// reduced count, so checks alone never grow it faster. The mutex also serializes
    /// replacements; checks never take it.
    /// (`StableBox`: `current` holds a pointer to the newest one.)
    installed: Mutex<Vec<StableBox<Limit<A>>>>,
}

/// A quota with its compiled parameters and the state counting against it.
struct Limit<A: Algorithm> {
    quota: Quota,
    params: A::Params,
    /// The clock reading the algorithm's time is relative to.
    epoch: u64,
    /// The latest clock reading the state can take (epoch + horizon).
    last_valid: u64,
    state: A::State,
}

impl<A: Algorithm> Limit<A> {
    fn new(algorithm: &A, quota: Quota, params: A::Params, epoch: u64, state: A::State) -> Self {
        let last_valid = epoch.saturating_add(algorithm.horizon(&params));
        Self {
            quota,
            params,
            epoch,
            last_valid,
            state,
        }
    }
}

impl<A: Algorithm> RateLimiter<A, MonotonicClock> {
    /// A limiter on the default clock.
    pub fn new(algorithm: A, quota: Quota) -> Result<Self, QuotaError> {
        Self::with_clock(algorithm, quota, MonotonicClock)
    }
}

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// A limiter on the given clock (a [`crate::ManualClock`] for tests and simulations).
    ///
    /// # Example
    /// ```
    /// use sluice::{FixedWindow, ManualClock, RateLimiter};
    /// let limiter = RateLimiter::with_clock(FixedWindow, "5/min".parse()?, ManualClock::new(0))?;
    /// assert_eq!(limiter.quota().capacity(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_clock(algorithm: A, quota: Quota, clock: C) -> Result<Self, QuotaError> {
        let params = algorithm.params(&quota)?;
        let state = algorithm.new_state(&params);
        let limit = StableBox::new(Limit::new(&algorithm, quota, params, clock.now(), state));
        Ok(Self {
            algorithm,
            clock,
            current: AtomicPtr::new(limit.as_non_null().as_ptr()),
            installed: Mutex::new(vec![limit]),
        })
    }

    /// Checks a cost of 1 and consumes it if allowed.
    #[inline]
    pub fn check(&self) -> Decision {
        unit_decision(self.check_n(1))
    }

    /// Checks a cost of `cost` units, all or nothing. A cost of 0 peeks: it reports the
    /// remaining capacity and consumes nothing.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] if `cost` could never be admitted. Under a quota that
    /// denies everything ([`Quota::deny_all`]) every positive cost is denied instead, with a
    /// retry-after of `u64::MAX` ns.
    ///
    /// # Example
    /// ```
    /// use sluice::{Quota, RateLimiter, SlidingWindowLog};
    /// let limiter = RateLimiter::new(SlidingWindowLog, "10/s".parse::<Quota>()?)?;
    /// assert_eq!(limiter.check_n(7)?.remaining(), 3);
    /// assert!(!limiter.check_n(4)?.is_allowed());
    /// assert!(limiter.check_n(11).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, CheckError> {
        self.take_n(cost).map(|(decision, _)| decision)
    }

    /// [`RateLimiter::check_n`], also returning what a refund of this check needs: the state it
    /// was decided on and the time given to the algorithm.
    #[inline]
    pub(crate) fn take_n(&self, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.take_n_with(|| self.clock.now(), cost)
    }

    /// [`RateLimiter::take_n`] at the times `now` reads: the keyed limiter's failsafe pool
    /// decides on its owner's clock.
    #[inline(always)]
    pub(crate) fn take_n_with(
        &self,
        now: impl Fn() -> u64,
        cost: u64,
    ) -> Result<(Decision, Receipt), CheckError> {
        loop {
            let limit = self.current();
            let now = now();
            if now > limit.last_valid {
                self.replace(limit, None, now);
                continue;
            }
            // A reading older than the epoch (a thread that read the clock just before a
            // replacement) is taken as the epoch itself.
            let since_epoch = now.saturating_sub(limit.epoch);
            let result = decide(
                &self.algorithm,
                &limit.quota,
                &limit.params,
                &limit.state,
                since_epoch,
                cost,
            );
            if let Some(result) = result {
                let tag = std::ptr::from_ref(limit) as usize as u64;
                return result.map(|decision| (decision, Receipt::new(since_epoch, tag)));
            }
            // The state was retired: its successor is being published.
            crate::sync::spin_loop();
        }
    }

    /// The quota in force.
    pub fn quota(&self) -> Quota {
        self.current().quota
    }

    fn current(&self) -> &Limit<A> {
        // SAFETY: `current` always holds the pointer of one of `installed`, whose limits are
        // freed only when the limiter drops, which cannot happen while `&self` is borrowed.
        // Limits are never mutated except through their atomic state.
        unsafe { &*self.current.load(Ordering::Acquire) }
    }

    /// The algorithm of this limiter.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// Replaces the quota without resetting what was consumed: consumption that still counts
    /// stays consumed (capped at the new capacity) and recovers at the new rate. Concurrent
    /// checks are decided either entirely under the old quota or entirely under the new one.
    ///
    /// # Errors
    /// [`QuotaError`] if this algorithm cannot hold the new quota; the old one stays.
    ///
    /// # Example
    /// ```
    /// use sluice::{ManualClock, Quota, RateLimiter, TokenBucket};
    /// let limiter = RateLimiter::with_clock(TokenBucket, "10/s".parse()?, ManualClock::new(0))?;
    /// limiter.check_n(4)?;
    /// limiter.set_quota("20/s".parse()?)?;
    /// assert_eq!(limiter.check_n(0)?.remaining(), 16); // 4 stay consumed
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_quota(&self, quota: Quota) -> Result<(), QuotaError> {
        let params = self.algorithm.params(&quota)?;
        self.replace(self.current(), Some((quota, params)), self.clock.now());
        Ok(())
    }

    /// Retires `seen` and installs its successor, under a new quota or (for `None`) the same
    /// one with the epoch moved to `now`. Does nothing if `seen` was already replaced.
    fn replace(&self, seen: &Limit<A>, new: Option<(Quota, A::Params)>, now: u64) {
        let mut installed = lock(&self.installed);
        let current = self.current();
        if new.is_none() && !std::ptr::eq(current, seen) {
            return; // another thread moved the epoch already
        }
        let since_epoch = now.saturating_sub(current.epoch);
        let (quota, params) = match new {
            Some(new) => new,
            None => (current.quota, current.params.clone()),
        };
        let (shift, state) = succeed(
            &self.algorithm,
            &current.params,
            &current.state,
            &params,
            since_epoch,
        );
        let successor = StableBox::new(Limit::new(
            &self.algorithm,
            quota,
            params,
            current.epoch + shift,
            state,
        ));
        self.current
            .store(successor.as_non_null().as_ptr(), Ordering::Release);
        installed.push(successor);
    }
}

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// Gives back `cost` taken at clock reading `at` (as given to [`Self::take_n_with`]) when
    /// the receipt is not at hand: on the limit in force, if `at` falls in its span. Across an
    /// epoch move (same quota, state carried over exactly) that is the take's own state.
    pub(crate) fn refund_at(&self, at: u64, cost: u64) {
        let limit = self.current();
        if at >= limit.epoch && at <= limit.last_valid {
            self.algorithm
                .refund(&limit.params, &limit.state, at - limit.epoch, cost);
        }
    }

    /// How many limits this limiter has installed (tests: checks alone must not add any).
    #[cfg(all(test, not(loom)))]
    fn installed(&self) -> usize {
        lock(&self.installed).len()
    }
}

impl<A: Algorithm + std::fmt::Debug, C: Clock> std::fmt::Debug for RateLimiter<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("algorithm", &self.algorithm)
            .field("quota", &self.quota())
            .finish_non_exhaustive()
    }
}

/// Decides one check on a state, answering costs the quota can never admit first. `None`
/// means the state was retired.
#[inline]
pub(crate) fn decide<A: Algorithm>(
    algorithm: &A,
    quota: &Quota,
    params: &A::Params,
    state: &A::State,
    since_epoch: u64,
    cost: u64,
) -> Option<Result<Decision, CheckError>> {
    let capacity = quota.capacity();
    if cost > capacity {
        if quota.is_deny_all() {
            return Some(Ok(Decision::denied(0, 0, 0, u64::MAX)));
        }
        return Some(Err(CheckError::CostExceedsCapacity { cost, capacity }));
    }
    algorithm.check(params, state, since_epoch, cost).map(Ok)
}

/// The decision of a cost-1 check. A cost of 1 exceeds only a capacity of 0, which `decide`
/// answers as a denial before this error can arise; it maps to the same denial regardless.
#[inline]
pub(crate) fn unit_decision(result: Result<Decision, CheckError>) -> Decision {
    match result {
        Ok(decision) => decision,
        Err(CheckError::CostExceedsCapacity { capacity, .. }) => Decision::denied(capacity, 0, 0, u64::MAX),
    }
}
