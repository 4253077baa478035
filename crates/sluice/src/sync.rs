//! Synchronisation helpers shared by the core's modules.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking over the data of a thread that panicked while holding it: every
/// mutex here guards data that a panic cannot leave half-written (a push, a swap, a counter),
/// so refusing it would only turn one failure into many.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
