//! Errors of a check.

/// Why a check could not be decided at all (as opposed to being denied).
///
/// # Example
/// ```
/// use sluice::{Quota, RateLimiter, TokenBucket, CheckError};
/// let limiter = RateLimiter::new(TokenBucket, "10/s".parse::<Quota>()?)?;
/// assert_eq!(
///     limiter.check_n(11),
///     Err(CheckError::CostExceedsCapacity { cost: 11, capacity: 10 })
/// );
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The cost can never be admitted: it is larger than the limit's capacity.
    #[error("cost {cost} exceeds the limit's capacity {capacity}; it can never be admitted")]
    CostExceedsCapacity {
        /// The cost asked for.
        cost: u64,
        /// The capacity of the limit.
        capacity: u64,
    },
}
