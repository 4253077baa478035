//! Which core algorithms have a Redis script.

use sluice::{Algorithm, AlgorithmKind, FixedWindow, SlidingWindowCounter, SlidingWindowLog, TokenBucket};

use crate::script::Kind;

mod sealed {
    pub trait Sealed {
        fn kind(&self) -> crate::script::Kind;
    }
}

/// A core algorithm that the Redis backend runs as one atomic Lua script: [`TokenBucket`],
/// [`FixedWindow`], [`SlidingWindowCounter`] and [`SlidingWindowLog`]. The same type serves
/// the local fallback, so a host degraded to its share runs the very same algorithm.
///
/// # Example
/// ```
/// fn takes<A: sluice_redis::RedisAlgorithm>(_: A) {}
/// takes(sluice::TokenBucket);
/// takes(sluice::SlidingWindowLog);
/// ```
pub trait RedisAlgorithm: Algorithm + Clone + sealed::Sealed {}

/// The scripted algorithms, named once: each gets its script kind, and [`visit_scripted`]
/// reaches it from its [`AlgorithmKind`] (whose variants are named after the types).
macro_rules! scripted {
    ($($ty:ident),*) => {
        $(
            impl sealed::Sealed for $ty {
                fn kind(&self) -> Kind {
                    Kind::$ty
                }
            }
            impl RedisAlgorithm for $ty {}
        )*

        fn visit_kind<V: RedisAlgorithmVisitor>(kind: AlgorithmKind, visitor: V) -> Option<V::Output> {
            match kind {
                $(AlgorithmKind::$ty => Some(visitor.visit($ty)),)*
                _ => None,
            }
        }
    };
}

scripted!(TokenBucket, FixedWindow, SlidingWindowCounter, SlidingWindowLog);

pub(crate) fn kind_of<A: RedisAlgorithm>(algorithm: &A) -> Kind {
    sealed::Sealed::kind(algorithm)
}

/// Generic code run on the Redis-scripted algorithm an [`AlgorithmKind`] names, through
/// [`visit_scripted`]: the Redis counterpart of [`sluice::AlgorithmVisitor`].
///
/// # Example
/// ```
/// use sluice::AlgorithmKind;
/// use sluice_redis::{RedisAlgorithm, RedisAlgorithmVisitor, visit_scripted};
/// struct Name;
/// impl RedisAlgorithmVisitor for Name {
///     type Output = &'static str;
///     fn visit<A: RedisAlgorithm>(self, algorithm: A) -> &'static str {
///         algorithm.name()
///     }
/// }
/// assert_eq!(visit_scripted(AlgorithmKind::FixedWindow, Name), Ok("fixed_window"));
/// assert!(visit_scripted(AlgorithmKind::LeakyBucket, Name).is_err());
/// ```
pub trait RedisAlgorithmVisitor {
    /// What the visit returns.
    type Output;

    /// Runs on the algorithm.
    fn visit<A: RedisAlgorithm>(self, algorithm: A) -> Self::Output;
}

/// An algorithm with no Redis script; its message names those that have one.
///
/// # Example
/// ```
/// let err = sluice_redis::UnsupportedAlgorithm::check(sluice::AlgorithmKind::LeakyBucket).unwrap_err();
/// assert!(err.to_string().starts_with("the leaky_bucket algorithm has no Redis backend: use token_bucket, "));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {kind} algorithm has no Redis backend: use {}",
    AlgorithmKind::list(AlgorithmKind::ALL.into_iter().filter(|k| Self::check(*k).is_ok()))
)]
pub struct UnsupportedAlgorithm {
    /// The algorithm asked for.
    pub kind: AlgorithmKind,
}

impl UnsupportedAlgorithm {
    /// `Ok` if `kind` has a Redis script.
    ///
    /// # Example
    /// ```
    /// assert!(sluice_redis::UnsupportedAlgorithm::check(sluice::AlgorithmKind::TokenBucket).is_ok());
    /// ```
    ///
    /// # Errors
    /// [`UnsupportedAlgorithm`] if it has none.
    pub fn check(kind: AlgorithmKind) -> Result<(), Self> {
        struct Scripted;
        impl RedisAlgorithmVisitor for Scripted {
            type Output = ();
            fn visit<A: RedisAlgorithm>(self, _: A) {}
        }
        visit_scripted(kind, Scripted)
    }
}

/// Runs `visitor` on the algorithm `kind` names, if it has a Redis script.
///
/// # Example
/// See [`RedisAlgorithmVisitor`].
///
/// # Errors
/// [`UnsupportedAlgorithm`] for an algorithm without a Redis script (the leaky bucket).
pub fn visit_scripted<V: RedisAlgorithmVisitor>(
    kind: AlgorithmKind,
    visitor: V,
) -> Result<V::Output, UnsupportedAlgorithm> {
    visit_kind(kind, visitor).ok_or(UnsupportedAlgorithm { kind })
}

/// Checks that the Redis script of `kind` can hold `quota` exactly (its numbers are doubles,
/// exact below 2^53), as a check would find out only when the quota is first used: for
/// validating a config before it runs. [`sluice::Quota::deny_all`] always fits (no script runs).
///
/// # Example
/// ```
/// use sluice::AlgorithmKind;
/// let quota = "100000/day".parse()?;
/// assert!(sluice_redis::check_quota(AlgorithmKind::TokenBucket, &quota).is_ok());
/// let err = sluice_redis::check_quota(AlgorithmKind::FixedWindow, &quota).unwrap_err();
/// assert!(err.to_string().contains("too large for the Redis backend"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`SetupError::Unsupported`](crate::SetupError::Unsupported) for an algorithm without a Redis
/// script; [`SetupError::QuotaTooLarge`](crate::SetupError::QuotaTooLarge) for a quota it
/// cannot hold.
pub fn check_quota(kind: AlgorithmKind, quota: &sluice::Quota) -> Result<(), crate::SetupError> {
    struct Fits<'a>(&'a sluice::Quota);
    impl RedisAlgorithmVisitor for Fits<'_> {
        type Output = Result<(), crate::SetupError>;
        fn visit<A: RedisAlgorithm>(self, algorithm: A) -> Self::Output {
            if self.0.is_deny_all() {
                return Ok(());
            }
            crate::script::Plan::new(kind_of(&algorithm), self.0)
                .map(|_| ())
                .map_err(Into::into)
        }
    }
    visit_scripted(kind, Fits(quota))?
}
