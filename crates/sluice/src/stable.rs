//! A heap value owned through a raw pointer, so that pointers to it stay valid while it lives.

use std::ptr::NonNull;

/// A heap value owned through a raw pointer, freed on drop. A `Box` would not do where other
/// pointers to the value are handed out: moving a `Box` (into a vector, or when a vector or map
/// grows) asserts unique ownership again, which under Rust's aliasing rules invalidates every
/// pointer taken from it before. Moving a `StableBox` moves only a raw pointer.
pub(crate) struct StableBox<T>(NonNull<T>);

impl<T> StableBox<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(NonNull::from(Box::leak(Box::new(value))))
    }

    /// The value's address: valid for shared access until this box drops.
    pub(crate) fn as_non_null(&self) -> NonNull<T> {
        self.0
    }
}

impl<T> std::ops::Deref for StableBox<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the pointer came from `Box::leak` and is freed only on drop; only shared
        // references are ever made from it.
        unsafe { self.0.as_ref() }
    }
}

impl<T> Drop for StableBox<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `Box::leak` in `new` and is freed only here, once.
        drop(unsafe { Box::from_raw(self.0.as_ptr()) });
    }
}

// SAFETY: a `StableBox` owns its value like a `Box`, and its pointers are used for shared
// access from any thread: hence the bounds of `Arc`.
unsafe impl<T: Send + Sync> Send for StableBox<T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Send + Sync> Sync for StableBox<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_taken_before_a_move_stay_valid() {
        let mut boxes = Vec::new();
        let mut pointers = Vec::new();
        for i in 0..100u64 {
            let stable = StableBox::new(i);
            pointers.push(stable.as_non_null());
            boxes.push(stable); // the vector grows and moves its boxes
        }
        for (i, pointer) in pointers.iter().enumerate() {
            // SAFETY: `boxes` still owns every value.
            assert_eq!(unsafe { *pointer.as_ref() }, i as u64);
        }
    }
}
