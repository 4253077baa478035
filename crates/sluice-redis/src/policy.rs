//! What a check answers when Redis does not, and its names in config.

use std::fmt;
use std::str::FromStr;

/// What a check answers when Redis does not (error, timeout, or while degraded).
///
/// Written `fail_open`, `fail_closed` or `local_share` (its `Display` and `FromStr`).
///
/// # Example
/// ```
/// use sluice_redis::FailurePolicy;
/// assert_eq!(FailurePolicy::default(), FailurePolicy::LocalShare);
/// assert_eq!("fail_closed".parse::<FailurePolicy>()?, FailurePolicy::FailClosed);
/// assert_eq!(FailurePolicy::FailOpen.to_string(), "fail_open");
/// # Ok::<(), sluice_redis::UnknownPolicy>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit everything: availability over the limit.
    FailOpen,
    /// Deny everything: the limit over availability.
    FailClosed,
    /// Each host enforces its share of every limit (`quota / hosts`) in memory, with the core
    /// limiter of the same algorithm.
    #[default]
    LocalShare,
}

impl FailurePolicy {
    /// Every policy, in the order names are listed.
    pub const ALL: [Self; 3] = [Self::FailOpen, Self::FailClosed, Self::LocalShare];

    /// The policy's name in config: `fail_open`, `fail_closed` or `local_share`.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_redis::FailurePolicy::LocalShare.name(), "local_share");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::LocalShare => "local_share",
        }
    }
}

impl fmt::Display for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`FailurePolicy`]'s; its message lists the valid names.
///
/// # Example
/// ```
/// let err = "retry".parse::<sluice_redis::FailurePolicy>().unwrap_err();
/// assert_eq!(err.to_string(), "unknown policy \"retry\": expected one of fail_open, fail_closed, local_share");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {name:?}: expected one of {}", policy_names())]
pub struct UnknownPolicy {
    /// The name given.
    pub name: String,
}

fn policy_names() -> String {
    FailurePolicy::ALL.map(FailurePolicy::name).join(", ")
}

impl FromStr for FailurePolicy {
    type Err = UnknownPolicy;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|policy| policy.name() == name)
            .ok_or_else(|| UnknownPolicy {
                name: name.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for policy in FailurePolicy::ALL {
            assert_eq!(policy.to_string().parse(), Ok(policy));
        }
        assert!("LocalShare".parse::<FailurePolicy>().is_err());
    }
}
