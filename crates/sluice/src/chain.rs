//! Chains: several limits on one request, admitted all-or-nothing.
//!
//! A request often answers to more than one limit: its key's and the global one, a per-second
//! and a per-hour limit, a cost of 5 on one and 1 on another. [`check_chain`] takes the cost
//! from every link in order; if any link denies, everything taken is given back
//! ([`Algorithm::refund`]), so a denied request consumes nothing anywhere, and the answer says
//! which link denied and when the whole chain could admit (the latest retry-after of the
//! denying links).
//!
//! While a chain is being decided, a concurrent check may see a link's tentative take (and be
//! denied for it); no link ever admits more than its own limit.

use std::borrow::Borrow;
use std::hash::Hash;
use std::time::Duration;

use crate::{Algorithm, CheckError, Clock, Decision, KeyedLimiter, QuotaSource, RateLimiter};

/// What a link needs to give back one take: the state it was decided on and when.
///
/// # Example
/// ```
/// use sluice::{Link, ManualClock, RateLimiter, Receipt, TokenBucket};
/// let limiter = RateLimiter::with_clock(TokenBucket, "5/s".parse()?, ManualClock::new(1_000))?;
/// let (_, receipt) = limiter.take(2)?;
/// assert_ne!(receipt, Receipt::NOTHING);
/// limiter.give_back(receipt, 2);
/// assert_eq!(limiter.check_n(0)?.remaining(), 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt {
    at: u64,
    tag: u64,
}

impl Receipt {
    /// A receipt that gives nothing back (the take was not stored).
    pub const NOTHING: Self = Self {
        at: u64::MAX,
        tag: u64::MAX,
    };

    /// A receipt for a take at `at` (as the link counts time) on the state named `tag`. Made
    /// only by the limiters: a forged one could give back what was never taken.
    pub(crate) const fn new(at: u64, tag: u64) -> Self {
        Self { at, tag }
    }

    /// When the take happened, as the link counts time.
    pub const fn at(&self) -> u64 {
        self.at
    }

    /// Which state the take was decided on, as the link names it.
    pub const fn tag(&self) -> u64 {
        self.tag
    }
}

/// One limit of a chain: takes a cost and can give it back.
///
/// Implemented by [`RateLimiter`] and by [`KeyedLink`] (one key of a [`KeyedLimiter`]).
///
/// # Example
/// ```
/// use sluice::{Link, ManualClock, RateLimiter, TokenBucket};
/// let limiter = RateLimiter::with_clock(TokenBucket, "3/s".parse()?, ManualClock::new(0))?;
/// let (decision, receipt) = limiter.take(2)?;
/// assert_eq!(decision.remaining(), 1);
/// limiter.give_back(receipt, 2);
/// assert_eq!(limiter.check_n(0)?.remaining(), 3);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Link: Send + Sync {
    /// Checks `cost`, consuming it if allowed, and returns what giving it back needs.
    ///
    /// # Errors
    /// [`CheckError::CostExceedsCapacity`] if this link can never admit `cost`.
    fn take(&self, cost: u64) -> Result<(Decision, Receipt), CheckError>;

    /// Gives back `cost` admitted by [`Link::take`], as if it had never been taken.
    fn give_back(&self, receipt: Receipt, cost: u64);
}

impl<A: Algorithm, C: Clock> Link for RateLimiter<A, C> {
    fn take(&self, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.take_n(cost)
    }

    fn give_back(&self, receipt: Receipt, cost: u64) {
        self.refund_n(receipt, cost);
    }
}

/// One key of a [`KeyedLimiter`], as a link of a chain.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, KeyedLink, Link, TokenBucket};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "5/s".parse()?)
///     .unknown_key_quota("5/s".parse()?)
///     .build()?;
/// let alice = KeyedLink::new(&limiter, "alice");
/// assert_eq!(alice.take(5)?.0.remaining(), 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KeyedLink<'a, K, A: Algorithm, S, C, Q: ?Sized> {
    limiter: &'a KeyedLimiter<K, A, S, C>,
    key: &'a Q,
}

impl<'a, K, A: Algorithm, S, C, Q: ?Sized> KeyedLink<'a, K, A, S, C, Q> {
    /// The limit of `key` in `limiter`.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, KeyedLink, RateLimiter, TokenBucket, check_chain};
    /// let per_key = KeyedLimiter::<u64, _>::builder(TokenBucket, "1/s".parse()?)
    ///     .unknown_key_quota("1/s".parse()?)
    ///     .build()?;
    /// let global = RateLimiter::new(TokenBucket, "100/s".parse()?)?;
    /// assert!(check_chain(&[(&KeyedLink::new(&per_key, &42), 1), (&global, 1)])?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(limiter: &'a KeyedLimiter<K, A, S, C>, key: &'a Q) -> Self {
        Self { limiter, key }
    }
}

impl<K, A, S, C, Q> Link for KeyedLink<'_, K, A, S, C, Q>
where
    K: Hash + Eq + Clone + Send + Sync + 'static + Borrow<Q>,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
    Q: Hash + Eq + ToOwned + Sync + ?Sized,
    Q::Owned: Into<K>,
{
    fn take(&self, cost: u64) -> Result<(Decision, Receipt), CheckError> {
        self.limiter.take_n(self.key, cost)
    }

    fn give_back(&self, receipt: Receipt, cost: u64) {
        self.limiter.refund_n(self.key, receipt, cost);
    }
}

impl<K, A, S, C, Q> KeyedLink<'_, K, A, S, C, Q>
where
    K: Hash + Eq + Clone + Send + Sync + 'static + Borrow<Q>,
    A: Algorithm,
    S: QuotaSource<K>,
    C: Clock + 'static,
    Q: Hash + Eq + ToOwned + Sync + ?Sized,
    Q::Owned: Into<K>,
{
    /// [`Link::take`], also saying which quota the key was decided under (its own once
    /// fetched, else the failsafe or unknown-key quota), even when the cost can never fit:
    /// one lookup where a take and then [`KeyedLimiter::quota_of`] take two.
    ///
    /// # Example
    /// ```
    /// use sluice::{KeyedLimiter, KeyedLink, TokenBucket};
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "5/s".parse()?)
    ///     .unknown_key_quota("3/s".parse()?)
    ///     .build()?;
    /// let (taken, quota) = KeyedLink::new(&limiter, "alice").take_quoted(2);
    /// assert_eq!(taken?.0.remaining(), 1);
    /// assert_eq!(quota, "3/s".parse()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    #[allow(clippy::type_complexity)]
    pub fn take_quoted(&self, cost: u64) -> (Result<(Decision, Receipt), CheckError>, crate::Quota) {
        self.limiter.check_key(self.key, cost, |checked| {
            let receipt = checked.receipt;
            (
                checked.result.map(|decision| (decision, receipt)),
                checked.limit.quota,
            )
        })
    }
}

/// The answer to a chain: admitted by every link, or denied with the first denying link and
/// the time until the whole chain could admit.
///
/// # Example
/// ```
/// use sluice::{ManualClock, RateLimiter, TokenBucket, check_chain};
/// let clock = ManualClock::new(0);
/// let per_second = RateLimiter::with_clock(TokenBucket, "2/s".parse()?, clock.clone())?;
/// let per_minute = RateLimiter::with_clock(TokenBucket, "3/min".parse()?, clock.clone())?;
/// for _ in 0..2 {
///     assert!(check_chain(&[(&per_second, 1), (&per_minute, 1)])?.is_allowed());
/// }
/// let denied = check_chain(&[(&per_second, 1), (&per_minute, 1)])?;
/// assert_eq!(denied.denied_by(), Some(0));
/// assert_eq!(per_minute.check_n(0)?.remaining(), 1); // the denial took nothing
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct ChainDecision {
    decision: Decision,
    denied_by: Option<usize>,
    retry_after_ns: u64,
}

impl ChainDecision {
    /// Whether every link admitted the request.
    ///
    /// # Example
    /// ```
    /// use sluice::{ManualClock, RateLimiter, TokenBucket, check_chain};
    /// let limiter = RateLimiter::with_clock(TokenBucket, "1/s".parse()?, ManualClock::new(0))?;
    /// check_chain(&[(&limiter, 1)])?;
    /// let denied = check_chain(&[(&limiter, 1)])?;
    /// assert!(!denied.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn is_allowed(&self) -> bool {
        self.denied_by.is_none()
    }

    /// The index of the first link that denied, if any.
    ///
    /// # Example
    /// ```
    /// use sluice::{ManualClock, RateLimiter, TokenBucket, check_chain};
    /// let limiter = RateLimiter::with_clock(TokenBucket, "1/s".parse()?, ManualClock::new(0))?;
    /// check_chain(&[(&limiter, 1)])?;
    /// let denied = check_chain(&[(&limiter, 1)])?;
    /// assert_eq!(denied.denied_by(), Some(0));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn denied_by(&self) -> Option<usize> {
        self.denied_by
    }

    /// Time until every link that denied could admit its cost (the latest of their
    /// retry-afters): zero if allowed. Other links may still deny then if others consume.
    ///
    /// # Example
    /// ```
    /// use sluice::{ManualClock, RateLimiter, TokenBucket, check_chain};
    /// let limiter = RateLimiter::with_clock(TokenBucket, "1/s".parse()?, ManualClock::new(0))?;
    /// check_chain(&[(&limiter, 1)])?;
    /// let denied = check_chain(&[(&limiter, 1)])?;
    /// assert_eq!(denied.retry_after().as_secs(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }

    /// The decision of one link: the first that denied, or, if all admitted, the one with the
    /// fewest units remaining (for rate-limit headers).
    ///
    /// # Example
    /// ```
    /// use sluice::{ManualClock, RateLimiter, TokenBucket, check_chain};
    /// let limiter = RateLimiter::with_clock(TokenBucket, "1/s".parse()?, ManualClock::new(0))?;
    /// check_chain(&[(&limiter, 1)])?;
    /// let denied = check_chain(&[(&limiter, 1)])?;
    /// assert_eq!(denied.decision().limit(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub const fn decision(&self) -> &Decision {
        &self.decision
    }
}

/// Why a chain could not be decided: one link can never admit its cost. Nothing was consumed.
///
/// # Example
/// ```
/// use sluice::{ChainError, RateLimiter, TokenBucket, check_chain};
/// let small = RateLimiter::new(TokenBucket, "2/s".parse()?)?;
/// let err = check_chain(&[(&small, 3)]).unwrap_err();
/// assert_eq!(err, ChainError { link: 0, error: sluice::CheckError::CostExceedsCapacity { cost: 3, capacity: 2 } });
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("link {link} of the chain: {error}")]
pub struct ChainError {
    /// The index of the link.
    pub link: usize,
    /// Its error.
    pub error: CheckError,
}

/// What the links decided so far.
struct ChainState {
    decision: Option<Decision>,
    denied_by: Option<usize>,
    retry_after_ns: u64,
    error: Option<ChainError>,
}

impl ChainState {
    fn admitted(&self) -> bool {
        self.denied_by.is_none() && self.error.is_none()
    }

    fn record(&mut self, index: usize, decision: Decision) {
        if decision.is_allowed() {
            let tighter = self
                .decision
                .is_none_or(|d| d.is_allowed() && decision.remaining() < d.remaining());
            if tighter {
                self.decision = Some(decision);
            }
            return;
        }
        self.retry_after_ns = self.retry_after_ns.max(decision.retry_after_nanos());
        if self.denied_by.is_none() {
            self.denied_by = Some(index);
            self.decision = Some(decision);
        }
    }
}

/// Checks one request against every link, each with its own cost, all or nothing.
///
/// Every link is asked in order (after a denial the later links are still asked, and given
/// back at once, so the retry-after covers every denying link). If all admit, their takes
/// stand; otherwise every take is given back before this returns.
///
/// # Errors
/// [`ChainError`] if a link can never admit its cost; nothing is consumed.
///
/// # Example
/// ```
/// use sluice::{FixedWindow, KeyedLimiter, KeyedLink, ManualClock, RateLimiter, TokenBucket, check_chain};
/// let clock = ManualClock::new(0);
/// let global = RateLimiter::with_clock(FixedWindow, "10/s".parse()?, clock.clone())?;
/// let per_key = KeyedLimiter::<String, _>::builder(TokenBucket, "5/s".parse()?)
///     .unknown_key_quota("5/s".parse()?)
///     .clock(clock.clone())
///     .build()?;
/// // An expensive call: 5 on its key, 1 globally.
/// let d = check_chain(&[(&KeyedLink::new(&per_key, "alice"), 5), (&global, 1)])?;
/// assert!(d.is_allowed());
/// let d = check_chain(&[(&KeyedLink::new(&per_key, "alice"), 5), (&global, 1)])?;
/// assert_eq!(d.denied_by(), Some(0));
/// assert_eq!(global.check_n(0)?.remaining(), 9);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_chain(links: &[(&dyn Link, u64)]) -> Result<ChainDecision, ChainError> {
    let mut verdict = ChainState {
        decision: None,
        denied_by: None,
        retry_after_ns: 0,
        error: None,
    };
    take_from(links, 0, &mut verdict);
    if let Some(error) = verdict.error {
        return Err(error);
    }
    Ok(ChainDecision {
        // An empty chain admits, with nothing to report.
        decision: verdict.decision.unwrap_or(Decision::allowed(0, 0, 0)),
        denied_by: verdict.denied_by,
        retry_after_ns: verdict.retry_after_ns,
    })
}

/// Takes from link `i` and the rest, then gives back link `i`'s take if the chain failed. The
/// recursion keeps each receipt on the stack: no allocation.
fn take_from(links: &[(&dyn Link, u64)], i: usize, verdict: &mut ChainState) {
    let Some(&(link, cost)) = links.get(i) else { return };
    match link.take(cost) {
        Err(error) => verdict.error = Some(ChainError { link: i, error }),
        Ok((decision, receipt)) => {
            verdict.record(i, decision);
            if verdict.error.is_none() {
                take_from(links, i + 1, verdict);
            }
            if decision.is_allowed() && !verdict.admitted() && cost > 0 {
                link.give_back(receipt, cost);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Link, Receipt};
    use crate::{
        Algorithm, FixedWindow, LeakyBucket, ManualClock, RateLimiter, SlidingWindowCounter,
        SlidingWindowLog, TokenBucket,
    };

    // A receipt can be made only here: a caller holding one can give back only what it took.
    #[test]
    fn a_forged_receipt_gives_nothing_back_and_never_panics() {
        fn drive<A: Algorithm>(algorithm: A) {
            let limiter =
                RateLimiter::with_clock(algorithm, "5/s".parse().unwrap(), ManualClock::new(7)).unwrap();
            let (_, receipt) = limiter.take(3).unwrap();
            for at in [u64::MAX, u64::MAX / 2, 1 << 62] {
                limiter.give_back(Receipt::new(at, receipt.tag()), 3);
            }
            limiter.give_back(Receipt::NOTHING, 3);
            assert_eq!(limiter.check_n(0).unwrap().remaining(), 2);
            limiter.give_back(receipt, 3);
            assert_eq!(limiter.check_n(0).unwrap().remaining(), 5);
        }
        drive(TokenBucket);
        drive(LeakyBucket::meter());
        drive(FixedWindow);
        drive(SlidingWindowLog);
        drive(SlidingWindowCounter);
    }
}
