//! A clock on tokio's time, which tests and simulations can pause and advance.

use tokio::time::Instant;

use crate::Clock;

/// Nanoseconds since creation on tokio's clock. In a runtime whose time is paused
/// (`tokio::time::pause`, `#[tokio::test(start_paused = true)]`) it moves only as tokio's
/// time does, so waits on a limit run instantly and deterministically; otherwise it is the
/// monotonic clock.
///
/// # Example
/// ```
/// use sluice::{Clock, TokioClock};
/// let clock = TokioClock::new();
/// let a = clock.now();
/// assert!(clock.now() >= a);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: Instant,
}

impl TokioClock {
    /// A clock reading 0 now.
    ///
    /// # Example
    /// ```
    /// use sluice::{Clock, TokioClock};
    /// assert!(TokioClock::new().now() < 1_000_000_000);
    /// ```
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        crate::saturating_nanos(elapsed)
    }
}
