//! A single limit shared by many threads: the direct limiter.

#[cfg(all(test, loom))]
mod loom_tests;
mod reclaim;
mod refund;
#[cfg(all(test, not(loom)))]
mod tests;

use reclaim::Pinned;

use crate::algorithm::succeed;
use crate::chain::Receipt;
use crate::stable::StableBox;
use crate::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use crate::sync::{Mutex, lock};
use crate::{Algorithm, Charge, CheckError, Clock, Decision, MonotonicClock, Quota, QuotaError};

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
    /// The limit the limiter was built with, inline: until it is replaced (most limiters never
    /// are), a check reads it without announcing it or following a pointer. It is never freed
    /// before the limiter nor reused, and once retired its state stays `RETIRED`.
    first: Limit<A>,
    /// Clock readings past `first`'s epoch below this one are decided on `first` directly:
    /// its span plus one while it is in force, 0 once it was replaced (an algorithm that
    /// keeps no state, [`crate::Unmetered`], cannot refuse a check once retired).
    first_bound: AtomicU64,
    /// The limit in force once `first` was replaced (`installed.current`'s); null before.
    current: AtomicPtr<Limit<A>>,
    /// The limit in force and those retired that a check may still be reading. The mutex
    /// serializes replacements; checks never take it.
    installed: Mutex<Installed<A>>,
}

/// The limits a direct limiter owns.
struct Installed<A: Algorithm> {
    /// (`StableBox`: `RateLimiter::current` holds a pointer to it.) `None` while the first
    /// limit, held inline, is in force.
    current: Option<StableBox<Limit<A>>>,
    /// Limits replaced (by a quota change or an epoch move): freed once no check names them
    /// (see `reclaim`).
    retired: Vec<StableBox<Limit<A>>>,
    /// How many retired limits make the next replacement try to free them: a scan makes every
    /// thread pass a barrier, so it waits for a few, and for twice as many as a scan kept.
    reclaim_at: usize,
    /// Limits installed so far, the first included (tests: checks alone must not add many).
    #[cfg(test)]
    installs: usize,
}

/// Retired limits that make a replacement try to free them (a scan costs a process-wide
/// barrier; under the model checker every replacement scans).
const RECLAIM_AT: usize = if cfg!(all(test, loom)) { 1 } else { 8 };

/// A quota with its compiled parameters and the state counting against it.
struct Limit<A: Algorithm> {
    /// The name receipts give this limit: unique in the process (an address would not do: a
    /// freed limit's may be reused by its successor).
    id: u64,
    quota: Quota,
    params: A::Params,
    /// The clock reading the algorithm's time is relative to.
    epoch: u64,
    /// The latest clock reading the state can take (epoch + horizon).
    last_valid: u64,
    state: A::State,
    /// Set where the model checker frees a limit (it is kept, marked): a check reading it
    /// after that, or not ordered before that, is reported.
    #[cfg(all(test, loom))]
    freed: crate::sync::UnsafeCell<bool>,
}

// SAFETY: only the model checker's build has the mark, whose cell is written once (`free`)
// and otherwise only read (`Limit::used`); the checker reports any such pair not ordered by
// the protocol, which is what it is there to find. Every other field is `Sync` already.
#[cfg(all(test, loom))]
unsafe impl<A: Algorithm> Sync for Limit<A> {}

/// Names for limits, from 2^63 up: apart from the keyed limiter's (clock readings), so a
/// receipt handed to the wrong kind of link matches nothing.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1 << 63);

impl<A: Algorithm> Limit<A> {
    fn new(algorithm: &A, quota: Quota, params: A::Params, epoch: u64, state: A::State) -> Self {
        let last_valid = epoch.saturating_add(algorithm.horizon(&params));
        Self {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            quota,
            params,
            epoch,
            last_valid,
            state,
            #[cfg(all(test, loom))]
            freed: crate::sync::UnsafeCell::new(false),
        }
    }

    /// Marks the end of a check's reading of this limit (the model checker's; nothing
    /// otherwise).
    #[inline(always)]
    fn used(&self) {
        #[cfg(all(test, loom))]
        // SAFETY: a shared read of the mark, which is written only when the limit is freed;
        // the model checker reports a read not ordered before that write.
        assert!(
            !unsafe { *self.freed.get().deref() },
            "a check read a freed limit"
        );
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
        reclaim::init();
        let first = Limit::new(&algorithm, quota, params, clock.now(), state);
        // One unsigned compare of `now - epoch` (wrapping) against the bound tells a reading
        // inside the span from both one before the epoch and one past it.
        let first_bound = AtomicU64::new((first.last_valid - first.epoch).saturating_add(1));
        Ok(Self {
            algorithm,
            clock,
            first,
            first_bound,
            current: AtomicPtr::new(std::ptr::null_mut()),
            installed: Mutex::new(Installed {
                current: None,
                retired: Vec::new(),
                reclaim_at: RECLAIM_AT,
                #[cfg(test)]
                installs: 1,
            }),
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
        // The first limit needs no announcement: it lives as long as `self`. Only the
        // algorithm's answer is taken from it, which a retired state refuses (`None`); a cost
        // over its capacity may be under its successor's, and is answered there.
        let first = &self.first;
        let since_epoch = now().wrapping_sub(first.epoch);
        if since_epoch < self.first_bound.load(Ordering::Acquire) && cost <= first.quota.capacity() {
            let decision = self
                .algorithm
                .check(&first.params, &first.state, since_epoch, cost);
            if let Some(decision) = decision {
                return Ok((decision, Receipt::new(since_epoch, first.id)));
            }
        }
        self.take_n_replaced(now, cost)
    }

    /// [`RateLimiter::take_n_with`] once the first limit was replaced (or is due to be): on the
    /// limit `current` names, announced while it is read.
    #[cold]
    #[inline(never)]
    fn take_n_replaced(&self, now: impl Fn() -> u64, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.on_current(now, |limit, since_epoch| {
            let result = decide(
                &self.algorithm,
                &limit.quota,
                &limit.params,
                &limit.state,
                since_epoch,
                cost,
            )?;
            Some(result.map(|decision| (decision, Receipt::new(since_epoch, limit.id))))
        })
    }

    /// Runs `op` on the limit in force at the time `now` reads (announced while it is read),
    /// moving the epoch first if that time is past its span, and again on the successor while
    /// `op` finds the state retired (`None`).
    fn on_current<T>(&self, now: impl Fn() -> u64, op: impl Fn(&Limit<A>, u64) -> Option<T>) -> T {
        let mut pinned = reclaim::pin();
        loop {
            let limit = self.load(&mut pinned);
            let now = now();
            if now > limit.last_valid {
                self.replace(limit, None, now);
                continue;
            }
            // A reading older than the epoch (a thread that read the clock just before a
            // replacement) is taken as the epoch itself.
            let since_epoch = now.saturating_sub(limit.epoch);
            let done = op(limit, since_epoch);
            limit.used();
            if let Some(done) = done {
                return done;
            }
            // The state was retired: its successor is being published.
            crate::sync::spin_loop();
        }
    }

    /// Consumes `cost` whatever is left: a cost known only after the request was served
    /// (tokens generated, bytes sent). Never refused: the limit goes below empty, down to
    /// [`Quota::max_debt`] units (one period's worth unless the quota says otherwise), and
    /// checks are denied, each with its exact retry-after, until refill has repaid the debt.
    ///
    /// # Example
    /// ```
    /// use sluice::{ManualClock, RateLimiter, SlidingWindowLog};
    /// let clock = ManualClock::new(0);
    /// let limiter = RateLimiter::with_clock(SlidingWindowLog, "10/s".parse()?, clock.clone())?;
    /// assert!(limiter.check_n(4)?.is_allowed());
    /// let charge = limiter.charge_n(1_000); // at most 10 below empty
    /// assert_eq!((charge.charged(), charge.balance()), (16, -10));
    /// clock.set(1_000_000_000); // every unit logged at 0 leaves the window
    /// assert!(limiter.check().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn charge_n(&self, cost: u64) -> Charge {
        self.charge_n_with(|| self.clock.now(), cost)
    }

    /// [`RateLimiter::charge_n`] at the times `now` reads (the failsafe pool's owner's clock).
    pub(crate) fn charge_n_with(&self, now: impl Fn() -> u64, cost: u64) -> Charge {
        self.on_current(now, |limit, since_epoch| {
            self.algorithm
                .charge(&limit.params, &limit.state, since_epoch, cost)
        })
    }

    /// The quota in force.
    pub fn quota(&self) -> Quota {
        let mut pinned = reclaim::pin();
        let limit = self.load(&mut pinned);
        let quota = limit.quota;
        limit.used();
        quota
    }

    /// The limit in force, until `pinned` drops or loads again.
    #[inline(always)]
    fn load<'p>(&'p self, pinned: &'p mut Pinned) -> &'p Limit<A> {
        // The first limit is never freed and `current` never goes back to null: nothing to
        // announce (announcing null would read as an idle slot to a check nested in this one).
        if self.current.load(Ordering::Acquire).is_null() {
            return &self.first;
        }
        let replaced = pinned.protect(&self.current);
        // SAFETY: a non-null `current` holds the pointer of `installed.current`, freed only
        // with the limiter (not while `&self` lives), or of one just retired, which is freed
        // only by a scan that finds no slot naming it (`Installed::reclaim`); `protect` returns
        // it named in this thread's slot until `pinned` drops or protects again, which the
        // borrow rules out while the reference lives. Limits are never mutated except through
        // their atomic state.
        unsafe { &*replaced }
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
        self.replace(std::ptr::null(), Some((quota, params)), self.clock.now());
        Ok(())
    }

    /// Retires the limit in force and installs its successor, under a new quota or (for
    /// `None`) the same one with the epoch moved to `now`. An epoch move does nothing if
    /// `seen`, the limit it found stale, was already replaced.
    fn replace(&self, seen: *const Limit<A>, new: Option<(Quota, A::Params)>, now: u64) {
        let mut installed = lock(&self.installed);
        let installed = &mut *installed;
        let current = installed.current.as_deref().unwrap_or(&self.first);
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
        // The first limit is not freed: it stays inline, retired, and checks pass it by.
        match installed.current.replace(successor) {
            Some(retired) => installed.retired.push(retired),
            None => self.first_bound.store(0, Ordering::Release),
        }
        #[cfg(test)]
        {
            installed.installs += 1;
        }
        if installed.retired.len() >= installed.reclaim_at {
            installed.reclaim();
        }
    }
}

impl<A: Algorithm> Installed<A> {
    /// Frees the retired limits no check can be reading any more. Called after their
    /// successors were published, as the scan requires.
    fn reclaim(&mut self) {
        // `None`: a nested check holds every limit.
        let Some(Some(hazards)) = reclaim::domain().hazards() else {
            return;
        };
        #[cfg(all(test, loom))]
        let hazards = if loom_tests::IGNORE_HAZARDS.get() {
            Vec::new()
        } else {
            hazards
        };
        let mut kept = Vec::new();
        for limit in self.retired.drain(..) {
            if hazards.contains(&(limit.as_non_null().as_ptr() as usize)) {
                kept.push(limit);
            } else {
                free(limit);
            }
        }
        self.retired = kept;
        // Checks that hold some back make the next scan wait for more, so scans stay rare.
        self.reclaim_at = RECLAIM_AT.max(2 * self.retired.len());
    }
}

/// Frees a retired limit.
#[cfg(not(all(test, loom)))]
fn free<A: Algorithm>(limit: StableBox<Limit<A>>) {
    drop(limit);
}

/// Marks a retired limit freed and keeps it, so the model checker sees every read after.
#[cfg(all(test, loom))]
fn free<A: Algorithm>(limit: StableBox<Limit<A>>) {
    // SAFETY: the mark's only write; reads not ordered before it are reported as races.
    unsafe { *limit.freed.get_mut().deref() = true };
    std::mem::forget(limit);
}

impl<A: Algorithm, C: Clock> RateLimiter<A, C> {
    /// Gives back `cost` taken at clock reading `at` (as given to [`Self::take_n_with`]) when
    /// the receipt is not at hand: on the limit in force, if `at` falls in its span. Across an
    /// epoch move (same quota, state carried over exactly) that is the take's own state.
    pub(crate) fn refund_at(&self, at: u64, cost: u64) {
        let mut pinned = reclaim::pin();
        let limit = self.load(&mut pinned);
        if at >= limit.epoch && at <= limit.last_valid {
            self.algorithm
                .refund(&limit.params, &limit.state, at - limit.epoch, cost);
        }
        limit.used();
    }

    /// How many limits this limiter has installed, the first included (tests: checks alone
    /// must not add many).
    #[cfg(test)]
    fn installed(&self) -> usize {
        lock(&self.installed).installs
    }

    /// How many limits this limiter holds now: the one in force and those retired but not yet
    /// freed.
    #[cfg(test)]
    fn held(&self) -> usize {
        1 + lock(&self.installed).retired.len()
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
