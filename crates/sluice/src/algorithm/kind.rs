//! The algorithms by name: one enum to read from config or command lines, dispatching once to
//! the concrete algorithm type.

use std::fmt;
use std::str::FromStr;

use crate::{
    Algorithm, FixedWindow, LeakyBucket, Quota, QuotaError, SlidingWindowCounter, SlidingWindowLog,
    TokenBucket,
};

/// One of the core algorithms, chosen by its name ([`Algorithm::name`]): `token_bucket`,
/// `leaky_bucket` (the meter, [`LeakyBucket::meter`]), `fixed_window`, `sliding_window_log`,
/// `sliding_window_counter`.
///
/// Parsing and printing use each algorithm's own name; [`AlgorithmKind::visit`] hands the
/// concrete algorithm to generic code.
///
/// # Example
/// ```
/// use sluice::AlgorithmKind;
/// let kind: AlgorithmKind = "fixed_window".parse()?;
/// assert_eq!(kind, AlgorithmKind::FixedWindow);
/// assert_eq!(kind.to_string(), "fixed_window");
/// let err = "magic".parse::<AlgorithmKind>().unwrap_err();
/// assert!(err.to_string().contains("expected one of token_bucket, leaky_bucket"));
/// # Ok::<(), sluice::UnknownAlgorithm>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmKind {
    /// [`TokenBucket`]
    TokenBucket,
    /// [`LeakyBucket::meter`]
    LeakyBucket,
    /// [`FixedWindow`]
    FixedWindow,
    /// [`SlidingWindowLog`]
    SlidingWindowLog,
    /// [`SlidingWindowCounter`]
    SlidingWindowCounter,
}

/// Generic code run on the concrete algorithm an [`AlgorithmKind`] names, through
/// [`AlgorithmKind::visit`].
///
/// # Example
/// ```
/// use sluice::{Algorithm, AlgorithmKind, AlgorithmVisitor};
/// struct Name;
/// impl AlgorithmVisitor for Name {
///     type Output = &'static str;
///     fn visit<A: Algorithm>(self, algorithm: A) -> &'static str {
///         algorithm.name()
///     }
/// }
/// assert_eq!(AlgorithmKind::SlidingWindowLog.visit(Name), "sliding_window_log");
/// ```
pub trait AlgorithmVisitor {
    /// What the visit returns.
    type Output;

    /// Runs on the algorithm.
    fn visit<A: Algorithm>(self, algorithm: A) -> Self::Output;
}

/// A name that is not an algorithm's; its message lists the valid names.
///
/// # Example
/// ```
/// let err = "token-bucket".parse::<sluice::AlgorithmKind>().unwrap_err();
/// assert_eq!(err.name, "token-bucket");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {name:?}: expected one of {}", AlgorithmKind::names())]
pub struct UnknownAlgorithm {
    /// The name given.
    pub name: String,
}

impl AlgorithmKind {
    /// Every kind, in the order names are listed.
    pub const ALL: [Self; 5] = [
        Self::TokenBucket,
        Self::LeakyBucket,
        Self::FixedWindow,
        Self::SlidingWindowLog,
        Self::SlidingWindowCounter,
    ];

    /// Runs `visitor` on the algorithm this kind names.
    ///
    /// # Example
    /// ```
    /// use sluice::{Algorithm, AlgorithmKind, AlgorithmVisitor, Quota, RateLimiter};
    /// struct Limiter(Quota);
    /// impl AlgorithmVisitor for Limiter {
    ///     type Output = bool;
    ///     fn visit<A: Algorithm>(self, algorithm: A) -> bool {
    ///         RateLimiter::new(algorithm, self.0).is_ok_and(|l| l.check().is_allowed())
    ///     }
    /// }
    /// assert!(AlgorithmKind::TokenBucket.visit(Limiter("1/s".parse()?)));
    /// # Ok::<(), sluice::QuotaError>(())
    /// ```
    pub fn visit<V: AlgorithmVisitor>(self, visitor: V) -> V::Output {
        match self {
            Self::TokenBucket => visitor.visit(TokenBucket),
            Self::LeakyBucket => visitor.visit(LeakyBucket::meter()),
            Self::FixedWindow => visitor.visit(FixedWindow),
            Self::SlidingWindowLog => visitor.visit(SlidingWindowLog),
            Self::SlidingWindowCounter => visitor.visit(SlidingWindowCounter),
        }
    }

    /// The algorithm's own name ([`Algorithm::name`]).
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice::AlgorithmKind::LeakyBucket.name(), "leaky_bucket");
    /// ```
    pub fn name(self) -> &'static str {
        struct Name;
        impl AlgorithmVisitor for Name {
            type Output = &'static str;
            fn visit<A: Algorithm>(self, algorithm: A) -> &'static str {
                algorithm.name()
            }
        }
        self.visit(Name)
    }

    /// Whether the algorithm can hold `quota` exactly (the check of [`Algorithm::params`]).
    ///
    /// # Example
    /// ```
    /// use sluice::AlgorithmKind;
    /// assert!(AlgorithmKind::TokenBucket.check(&"10/s".parse()?).is_ok());
    /// # Ok::<(), sluice::QuotaError>(())
    /// ```
    ///
    /// # Errors
    /// The [`QuotaError`] of [`Algorithm::params`].
    pub fn check(self, quota: &Quota) -> Result<(), QuotaError> {
        struct Params<'a>(&'a Quota);
        impl AlgorithmVisitor for Params<'_> {
            type Output = Result<(), QuotaError>;
            fn visit<A: Algorithm>(self, algorithm: A) -> Self::Output {
                algorithm.params(self.0).map(drop)
            }
        }
        self.visit(Params(quota))
    }

    /// The names of `kinds`, comma-separated (`token_bucket, fixed_window`), for messages.
    ///
    /// # Example
    /// ```
    /// use sluice::AlgorithmKind;
    /// let some = [AlgorithmKind::TokenBucket, AlgorithmKind::FixedWindow];
    /// assert_eq!(AlgorithmKind::list(some), "token_bucket, fixed_window");
    /// ```
    pub fn list(kinds: impl IntoIterator<Item = Self>) -> String {
        kinds.into_iter().map(Self::name).collect::<Vec<_>>().join(", ")
    }

    /// The names of every kind, comma-separated.
    fn names() -> String {
        Self::list(Self::ALL)
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AlgorithmKind {
    type Err = UnknownAlgorithm;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| UnknownAlgorithm {
                name: name.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in AlgorithmKind::ALL {
            assert_eq!(kind.to_string().parse::<AlgorithmKind>(), Ok(kind));
        }
        assert_eq!(
            "leaky".parse::<AlgorithmKind>().unwrap_err().to_string(),
            "unknown algorithm \"leaky\": expected one of token_bucket, leaky_bucket, fixed_window, \
             sliding_window_log, sliding_window_counter"
        );
    }

    #[test]
    fn every_kind_holds_a_plain_quota() {
        let quota: Quota = "10/s".parse().unwrap();
        for kind in AlgorithmKind::ALL {
            assert_eq!(kind.check(&quota), Ok(()), "{kind}");
        }
    }
}
