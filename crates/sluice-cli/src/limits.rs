//! The connection limit: `max_connections` from the config, or derived from the process's
//! file-descriptor limit.
//!
//! A connection costs a descriptor, so past the limit `accept` fails (EMFILE) and the server
//! can open nothing else either (a config reload, a Redis connection). Left out, the limit is
//! the soft descriptor limit less a reserve for everything else, with a floor (a tiny limit
//! still serves) and a ceiling: each connection may buffer a request head of up to
//! `max_header_bytes`, so the ceiling bounds that memory too (65 536 × 32 KiB = 2 GiB).

use std::fmt;

/// Descriptors kept for everything but client connections: a listener and an event queue
/// per serving thread, Redis connections, the config file, standard streams.
pub const RESERVED_DESCRIPTORS: u64 = 128;

/// The fewest connections a derived limit allows.
pub const MIN_DERIVED: usize = 64;

/// The most connections a derived limit allows (set `max_connections` for more).
pub const MAX_DERIVED: usize = 65_536;

/// The limit where the descriptor limit is unknown (not a Unix).
const UNKNOWN_LIMIT: usize = 1024;

/// The connection limit in force, and where it comes from (for `validate` and the log).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimit {
    /// The most connections served at once.
    pub max: usize,
    /// The process's soft file-descriptor limit, if known.
    pub descriptors: Option<u64>,
    /// Whether the config set it.
    pub configured: bool,
}

impl ConnectionLimit {
    /// The limit for a config's `max_connections` (`None`: derived).
    pub fn new(configured: Option<usize>) -> Self {
        Self::with_descriptors(configured, descriptor_limit())
    }

    fn with_descriptors(configured: Option<usize>, descriptors: Option<u64>) -> Self {
        let max = match (configured, descriptors) {
            (Some(max), _) => max,
            (None, Some(limit)) => {
                let usable = limit.saturating_sub(RESERVED_DESCRIPTORS);
                usize::try_from(usable)
                    .unwrap_or(usize::MAX)
                    .clamp(MIN_DERIVED, MAX_DERIVED)
            }
            (None, None) => UNKNOWN_LIMIT,
        };
        Self {
            max,
            descriptors,
            configured: configured.is_some(),
        }
    }

    /// Whether the limit lets connections take descriptors the process does not have.
    pub fn exceeds_descriptors(&self) -> bool {
        self.descriptors
            .is_some_and(|limit| self.max as u64 > limit.saturating_sub(RESERVED_DESCRIPTORS))
    }
}

impl fmt::Display for ConnectionLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "max_connections {}", self.max)?;
        match (self.configured, self.descriptors) {
            (true, _) if self.exceeds_descriptors() => write!(
                f,
                " (as configured, above what the file-descriptor limit of {} leaves: raise \
                 `ulimit -n`)",
                self.descriptors.unwrap_or_default()
            ),
            (true, _) => write!(f, " (as configured)"),
            (false, Some(limit)) => write!(
                f,
                " (from the file-descriptor limit {limit} less {RESERVED_DESCRIPTORS} reserved, \
                 within {MIN_DERIVED}..={MAX_DERIVED})"
            ),
            (false, None) => write!(f, " (the file-descriptor limit is unknown here)"),
        }
    }
}

/// The soft limit on open file descriptors (`ulimit -n`), if known; unlimited reads as
/// `u64::MAX`.
#[cfg(unix)]
fn descriptor_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes one `rlimit` through a pointer to a live one, nothing else.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if status != 0 {
        return None;
    }
    #[allow(clippy::useless_conversion)] // `rlim_t` is not u64 everywhere
    Some(u64::try_from(limit.rlim_cur).unwrap_or(u64::MAX))
}

#[cfg(not(unix))]
fn descriptor_limit() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_from_the_descriptor_limit_within_a_floor_and_a_ceiling() {
        let derived = |limit| ConnectionLimit::with_descriptors(None, Some(limit)).max;
        assert_eq!(derived(1024), 1024 - 128);
        assert_eq!(derived(100), MIN_DERIVED);
        assert_eq!(derived(u64::MAX), MAX_DERIVED);
        assert_eq!(ConnectionLimit::with_descriptors(None, None).max, UNKNOWN_LIMIT);
        let configured = ConnectionLimit::with_descriptors(Some(2), Some(1024));
        assert_eq!(configured.max, 2);
        assert!(configured.to_string().contains("as configured"));
        let above = ConnectionLimit::with_descriptors(Some(5000), Some(1024));
        assert!(above.exceeds_descriptors());
        assert!(above.to_string().contains("ulimit -n"), "{above}");
        let shown = ConnectionLimit::with_descriptors(None, Some(1024)).to_string();
        assert!(
            shown.starts_with("max_connections 896 (from the file-descriptor limit 1024"),
            "{shown}"
        );
    }

    #[test]
    fn this_process_has_a_limit() {
        let limit = ConnectionLimit::new(None);
        assert!((MIN_DERIVED..=MAX_DERIVED).contains(&limit.max) || limit.descriptors.is_none());
    }
}
