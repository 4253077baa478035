//! [`LimitBackend`]: the seam between the layer and the store of limits by key behind it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use sluice::{Algorithm, CheckError, Clock, Decision, KeyedLimiter, Quota, QuotaSource};

/// A store of limits by key, as the middleware uses it. Implemented for sluice's
/// [`KeyedLimiter`] with `String` keys (answers at once, allocation-free); implement it to put
/// another store behind the layer, such as a remote one that answers later.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, StaticQuotas, TokenBucket};
/// use sluice_http::LimitBackend;
/// let quotas = StaticQuotas::from_iter([("alice".to_string(), "1/s".parse()?)]);
/// let limiter = KeyedLimiter::builder(TokenBucket, "10/s".parse()?).source(quotas).build()?;
/// let decision = LimitBackend::check(&limiter, "alice", 1).into_ready().ok().unwrap()?;
/// assert!(decision.is_allowed());
/// assert_eq!(LimitBackend::quota(&limiter, "alice"), Some("1/s".parse()?));
/// let (answer, quota) = LimitBackend::check_quoted(&limiter, "alice", 1);
/// assert!(!answer.into_ready().ok().unwrap()?.is_allowed());
/// assert_eq!(quota, Some("1/s".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait LimitBackend: Send + Sync + 'static {
    /// Checks `cost` units for `key`, consuming them if allowed: at once
    /// ([`CheckFuture::ready`]) or later ([`CheckFuture::pending`]).
    ///
    /// The answer is an error ([`CheckError`]) when the cost can never be admitted under the
    /// key's quota.
    fn check(&self, key: &str, cost: u64) -> CheckFuture;

    /// The quota `key` is governed by now, if known (used for the `RateLimit-Policy` field).
    fn quota(&self, key: &str) -> Option<Quota>;

    /// Checks like [`check`](Self::check), with the quota the answer was made under when the
    /// store has it at hand: one lookup where `check` and then [`quota`](Self::quota) take
    /// two. The default gives none; the layer then asks `quota` when it writes the fields.
    fn check_quoted(&self, key: &str, cost: u64) -> (CheckFuture, Option<Quota>) {
        (self.check(key, cost), None)
    }

    /// Charges `cost` to `key` whatever is left, down to its quota's debt: a cost a response
    /// reported after the fact ([`crate::RateLimitBuilder::charge_from`]). Whether the charge
    /// was taken (or, for a store that answers later, sent); the default takes none, and the
    /// layer counts the response as uncharged.
    fn charge(&self, key: &str, cost: u64) -> bool {
        let _ = (key, cost);
        false
    }
}

type Answer = Result<Decision, CheckError>;

/// The answer of [`LimitBackend::check`]: known at once (an in-memory store; no allocation), or
/// a boxed future (a remote store). The layer holds the request back until it completes.
///
/// # Example
/// ```
/// use sluice::Decision;
/// use sluice_http::CheckFuture;
/// let now = CheckFuture::ready(Ok(Decision::allowed(10, 9, 0)));
/// assert!(now.into_ready().is_ok());
/// let later = CheckFuture::pending(async { Ok(Decision::allowed(10, 9, 0)) });
/// assert!(later.into_ready().is_err());
/// ```
#[must_use = "a check future does nothing unless polled"]
pub struct CheckFuture(State, Option<Box<SeveralLimits>>);

enum State {
    Ready(Option<Answer>),
    Pending(Pin<Box<dyn Future<Output = Answer> + Send>>),
    PendingListed(Pin<Box<dyn Future<Output = ListedAnswer> + Send>>),
}

/// An answer, with the other limits of its key when it is held to several.
type ListedAnswer = (Answer, Option<Box<SeveralLimits>>);

/// The limits an answer stands among when its key is held to several (an account of several
/// quotas): the answer is the tightest one's, and the layer lists every one in the
/// `RateLimit-Policy` and `RateLimit` fields, the answer's first. Each is named by its place:
/// the layer's policy name for the first, then `NAME-2`, `NAME-3`...
///
/// # Example
/// ```
/// use sluice::Decision;
/// use sluice_http::{CheckFuture, SeveralLimits};
/// let listed = SeveralLimits {
///     place: 1,
///     quota: Some("100/day".parse()?),
///     others: vec![(0, Decision::allowed(10, 9, 100_000_000), Some("10/s".parse()?))],
/// };
/// let answer = CheckFuture::ready_listed(Ok(Decision::allowed(100, 3, 0)), Box::new(listed));
/// let (decision, listed) = answer.into_ready_listed().ok().unwrap();
/// assert_eq!((decision?.remaining(), listed.unwrap().others.len()), (3, 1));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeveralLimits {
    /// The answer's place among the key's limits (0: the first).
    pub place: usize,
    /// The answer's quota, if known.
    pub quota: Option<Quota>,
    /// Every other limit: its place, its decision and its quota.
    pub others: Vec<(usize, Decision, Option<Quota>)>,
}

impl CheckFuture {
    /// An answer known now.
    #[inline]
    pub fn ready(answer: Result<Decision, CheckError>) -> Self {
        Self(State::Ready(Some(answer)), None)
    }

    /// An answer known now, among several limits of its key (boxed: a backend's answer stays
    /// small on the way for the keys held to one).
    pub fn ready_listed(answer: Result<Decision, CheckError>, listed: Box<SeveralLimits>) -> Self {
        Self(State::Ready(Some(answer)), Some(listed))
    }

    /// An answer that `future` will give.
    pub fn pending(future: impl Future<Output = Result<Decision, CheckError>> + Send + 'static) -> Self {
        Self(State::Pending(Box::pin(future)), None)
    }

    /// An answer that `future` will give, with the other limits of its key when it lists them
    /// (a key held to several).
    pub fn pending_listed(
        future: impl Future<Output = (Result<Decision, CheckError>, Option<Box<SeveralLimits>>)> + Send + 'static,
    ) -> Self {
        Self(State::PendingListed(Box::pin(future)), None)
    }

    /// The answer if it is known now, or the future that will give it.
    ///
    /// # Errors
    /// `self` again when the answer is still to come.
    #[inline]
    pub fn into_ready(self) -> Result<Result<Decision, CheckError>, Self> {
        self.into_ready_listed().map(|(answer, _)| answer)
    }

    /// [`into_ready`](Self::into_ready), with the key's other limits if it has several.
    ///
    /// # Errors
    /// `self` again when the answer is still to come.
    #[inline]
    pub fn into_ready_listed(self) -> Result<ListedAnswer, Self> {
        match self.0 {
            State::Ready(Some(answer)) => Ok((answer, self.1)),
            state => Err(Self(state, self.1)),
        }
    }

    /// Once the future has given its answer: the key's other limits, if it has several.
    pub fn take_listed(&mut self) -> Option<Box<SeveralLimits>> {
        self.1.take()
    }
}

impl std::fmt::Debug for CheckFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.0 {
            State::Ready(_) => "ready",
            State::Pending(_) | State::PendingListed(_) => "pending",
        };
        f.debug_tuple("CheckFuture").field(&state).finish()
    }
}

impl Future for CheckFuture {
    type Output = Result<Decision, CheckError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match &mut this.0 {
            State::Pending(future) => future.as_mut().poll(cx),
            State::PendingListed(future) => {
                let (answer, listed) = std::task::ready!(future.as_mut().poll(cx));
                this.1 = listed;
                Poll::Ready(answer)
            }
            // Polled again after completion: the contract is broken; never answer twice.
            State::Ready(answer) => answer.take().map_or(Poll::Pending, Poll::Ready),
        }
    }
}

impl<A, S, C> LimitBackend for KeyedLimiter<String, A, S, C>
where
    A: Algorithm,
    S: QuotaSource<String>,
    C: Clock + 'static,
{
    #[inline]
    fn check(&self, key: &str, cost: u64) -> CheckFuture {
        CheckFuture::ready(self.check_n(key, cost))
    }

    fn quota(&self, key: &str) -> Option<Quota> {
        self.quota_of(key)
    }

    #[inline]
    fn check_quoted(&self, key: &str, cost: u64) -> (CheckFuture, Option<Quota>) {
        let (answer, quota) = self.check_n_quoted(key, cost);
        (CheckFuture::ready(answer), Some(quota))
    }

    fn charge(&self, key: &str, cost: u64) -> bool {
        self.charge_n(key, cost);
        true
    }
}
