//! A read-write lock whose readers do not share a counter, so reads on different cores scale.
//!
//! A plain read-write lock counts its readers in one word: two cores reading the same shard
//! bounce that word's cache line between them on every read, which is why a sharded map with
//! ordinary locks does not get faster with a second thread. Here each reader counts itself in
//! its own stripe (one cache line per stripe, chosen once per thread), and a writer, which is
//! rare on the keyed limiter's path (a new key, an epoch move), raises a flag and waits for
//! every stripe to drain.
//!
//! The protocol is Dekker's: a reader increments its stripe and then reads the flag; a writer
//! sets the flag and then reads every stripe; all four operations are sequentially consistent,
//! so at least one side sees the other and they never both proceed.

use std::cell::{Cell, UnsafeCell};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One reader count on a cache line of its own (128 bytes: adjacent-line prefetch pairs lines).
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicUsize);

pub(crate) struct StripedRwLock<T> {
    stripes: Box<[Stripe]>,
    /// Set while a writer holds the lock or waits for the readers to leave; writers take it
    /// by compare-and-swap, which also serialises them.
    writing: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&T` to readers on many threads and `&mut T` to one writer at a
// time, exactly like `std::sync::RwLock`, hence the same bounds.
unsafe impl<T: Send> Send for StripedRwLock<T> {}
unsafe impl<T: Send + Sync> Sync for StripedRwLock<T> {}

/// Spins briefly, then yields the core: critical sections here are short.
fn backoff(round: &mut u32) {
    if *round < 64 {
        std::hint::spin_loop();
        *round += 1;
    } else {
        std::thread::yield_now();
    }
}

/// This thread's stripe number, assigned round-robin on first use.
fn stripe_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    NUMBER.with(|number| {
        if number.get() == usize::MAX {
            number.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        number.get()
    })
}

impl<T> StripedRwLock<T> {
    /// A lock with `stripes` reader stripes (rounded up to a power of two).
    pub(crate) fn new(value: T, stripes: usize) -> Self {
        let stripes = stripes.max(1).next_power_of_two();
        Self {
            stripes: (0..stripes).map(|_| Stripe::default()).collect(),
            writing: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let stripe = &self.stripes[stripe_number() & (self.stripes.len() - 1)].0;
        let mut round = 0;
        loop {
            stripe.fetch_add(1, Ordering::SeqCst);
            if !self.writing.load(Ordering::SeqCst) {
                return ReadGuard { lock: self, stripe };
            }
            // A writer is in: step back so it can drain the stripes, and wait for it.
            stripe.fetch_sub(1, Ordering::Release);
            while self.writing.load(Ordering::Acquire) {
                backoff(&mut round);
            }
        }
    }

    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let mut round = 0;
        while self
            .writing
            .compare_exchange_weak(false, true, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            backoff(&mut round);
        }
        for stripe in &self.stripes {
            let mut round = 0;
            while stripe.0.load(Ordering::SeqCst) != 0 {
                backoff(&mut round);
            }
        }
        WriteGuard { lock: self }
    }

    /// Bytes this lock holds on the heap (its stripes).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.stripes.len() * size_of::<Stripe>()
    }
}

pub(crate) struct ReadGuard<'a, T> {
    lock: &'a StripedRwLock<T>,
    stripe: &'a AtomicUsize,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: a reader is counted in a stripe and saw no writer, so no writer proceeds
        // until this guard drops (see the module comment).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.stripe.fetch_sub(1, Ordering::Release);
    }
}

pub(crate) struct WriteGuard<'a, T> {
    lock: &'a StripedRwLock<T>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the writer flag is set and every stripe drained: no reader is inside.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`, and only one writer holds the flag.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.writing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn readers_and_writers_exclude_each_other() {
        // Writers keep two fields equal; a reader that ever saw them differ saw a torn write.
        let lock = Arc::new(StripedRwLock::new((0u64, 0u64), 4));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        if t % 2 == 0 {
                            let mut guard = lock.write();
                            guard.0 += 1;
                            std::hint::black_box(&mut *guard);
                            guard.1 += 1;
                        } else {
                            let guard = lock.read();
                            assert_eq!(guard.0, guard.1, "a reader saw a half-done write");
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread panics");
        }
        assert_eq!(*lock.read(), (40_000, 40_000));
    }
}
