//! Synchronisation helpers shared by the core's modules, and the primitives of the lock-free
//! protocols that the `loom` model checker can stand in for.
//!
//! The striped lock (`keyed::lock`), the direct limiter's limit pointer and replacement mutex
//! (`limiter`) and the GCRA state (`algorithm::gcra`) take their atomics, cell, mutex, spin and
//! thread-local from here. In a normal build they are std's. In the crate's unit tests built
//! with `RUSTFLAGS="--cfg loom"` (see test.sh) they are loom's, so that the `loom_tests`
//! modules explore every interleaving of those operations (up to loom's preemption bound) and
//! loom reports any unsynchronised access to the striped lock's value. Only the unit tests see
//! loom: it is a dev-dependency, so every other build under `--cfg loom` keeps std's.

use std::sync::PoisonError;

#[cfg(not(all(test, loom)))]
mod imp {
    pub(crate) use std::hint::spin_loop;
    pub(crate) use std::sync::Mutex;
    pub(crate) use std::thread::yield_now;
    pub(crate) use std::thread_local;

    pub(crate) mod atomic {
        pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
    }

    /// Nothing: see the loom build's.
    #[inline(always)]
    pub(crate) fn seq_cst_handshake() {}

    /// `std::cell::UnsafeCell` behind the interface of loom's: access goes through a pointer
    /// guard taken for as long as the access lasts, which loom tracks and std compiles away.
    #[derive(Debug)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// A pointer for shared access.
        #[inline]
        pub(crate) fn get(&self) -> ConstPtr<T> {
            ConstPtr(self.0.get())
        }

        /// A pointer for exclusive access.
        #[inline]
        pub(crate) fn get_mut(&self) -> MutPtr<T> {
            MutPtr(self.0.get())
        }
    }

    /// A raw pointer for shared access to an [`UnsafeCell`]'s value.
    #[derive(Debug)]
    pub(crate) struct ConstPtr<T>(*const T);

    impl<T> ConstPtr<T> {
        /// # Safety
        /// As for dereferencing a `*const T`: the cell outlives the reference, and nothing
        /// mutates the value meanwhile.
        #[inline]
        pub(crate) unsafe fn deref(&self) -> &T {
            // SAFETY: forwarded to the caller.
            unsafe { &*self.0 }
        }
    }

    /// A raw pointer for exclusive access to an [`UnsafeCell`]'s value.
    #[derive(Debug)]
    pub(crate) struct MutPtr<T>(*mut T);

    impl<T> MutPtr<T> {
        /// # Safety
        /// As for dereferencing a `*mut T`: the cell outlives the reference, and nothing else
        /// accesses the value meanwhile.
        #[inline]
        #[allow(clippy::mut_from_ref)] // the pointer is the exclusive access, as loom's is
        pub(crate) unsafe fn deref(&self) -> &mut T {
            // SAFETY: forwarded to the caller.
            unsafe { &mut *self.0 }
        }

        /// Calls `f` with the raw pointer, which must not outlive the call.
        #[inline]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0)
        }
    }
}

#[cfg(all(test, loom))]
mod imp {
    pub(crate) use loom::cell::{ConstPtr, MutPtr, UnsafeCell};
    pub(crate) use loom::hint::spin_loop;
    pub(crate) use loom::sync::Mutex;
    pub(crate) use loom::thread::yield_now;
    pub(crate) use loom::thread_local;

    pub(crate) mod atomic {
        pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
    }

    pub(crate) fn seq_cst_handshake() {
        loom::sync::atomic::fence(loom::sync::atomic::Ordering::SeqCst);
    }
}

pub(crate) use imp::*;

// `imp::seq_cst_handshake`, documented once for both builds:
//
// Placed between the two `SeqCst` accesses of each side of a Dekker handshake (in
// `keyed::lock`: a reader increments its stripe, then reads the writer flag; a writer sets the
// flag, then reads the stripes). The handshake rests on the single total order of `SeqCst`
// accesses, by which at least one side sees the other. loom does not model that order (it
// takes `SeqCst` accesses as `AcqRel`, a documented limitation) and would report the outcome
// the order rules out, both sides reading the other's old value. Under loom this is therefore
// a `SeqCst` fence, which gives the handshake the same guarantee (the fence form of Dekker's);
// in every other build it is nothing, the accesses being `SeqCst` themselves.

/// A mutex that [`lock`] takes: std's, and loom's in the loom tests.
pub(crate) trait Lock {
    type Guard<'a>
    where
        Self: 'a;

    fn lock_tolerant(&self) -> Self::Guard<'_>;
}

impl<T> Lock for std::sync::Mutex<T> {
    type Guard<'a>
        = std::sync::MutexGuard<'a, T>
    where
        T: 'a;

    fn lock_tolerant(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(all(test, loom))]
impl<T> Lock for loom::sync::Mutex<T> {
    type Guard<'a>
        = loom::sync::MutexGuard<'a, T>
    where
        T: 'a;

    fn lock_tolerant(&self) -> Self::Guard<'_> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Locks `mutex`, taking over the data of a thread that panicked while holding it: every
/// mutex here guards data that a panic cannot leave half-written (a push, a swap, a counter),
/// so refusing it would only turn one failure into many.
pub(crate) fn lock<M: Lock>(mutex: &M) -> M::Guard<'_> {
    mutex.lock_tolerant()
}

/// Runs `test` under loom in every interleaving of its threads with at most
/// `LOOM_MAX_PREEMPTIONS` preemptions (5 when unset: all the loom tests then take about a
/// second; 10 takes several).
#[cfg(all(test, loom))]
pub(crate) fn model(test: impl Fn() + Send + Sync + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(5);
    builder.check(test);
}

/// Runs `test` under [`model`], which must fail: returns the failure's message.
#[cfg(all(test, loom))]
pub(crate) fn model_failure(test: impl Fn() + Send + Sync + 'static) -> String {
    let payload = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model(test)))
        .expect_err("loom found no failure");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}
