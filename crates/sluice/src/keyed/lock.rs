//! A read-write lock whose readers do not share a counter, so reads on different cores scale.
//!
//! A plain read-write lock counts its readers in one word: two cores reading the same shard
//! bounce that word's cache line between them on every read, which is why a sharded map with
//! ordinary locks does not get faster with a second thread. Here each reader counts itself in
//! a stripe (one cache line per stripe), and a writer, which is rare on the keyed limiter's
//! path (a new key, an epoch move), raises a flag and waits for every stripe to drain.
//!
//! Each live thread holds a slot number, reused after the thread ends. The first slots own a
//! stripe in every lock: only that thread writes it, so it leaves with a plain store instead
//! of a locked instruction (one of the three a keyed check makes). Threads past those share
//! the remaining stripes and count with read-modify-writes.
//!
//! The protocol is Dekker's: a reader increments its stripe and then reads the flag; a writer
//! sets the flag and then reads every stripe; all four operations are sequentially consistent,
//! so at least one side sees the other and they never both proceed.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::sync::lock;

/// One reader count on a cache line of its own (128 bytes: adjacent-line prefetch pairs lines).
#[repr(align(128))]
#[derive(Default)]
struct Stripe(AtomicUsize);

pub(crate) struct StripedRwLock<T> {
    /// The owned stripes (one per slot below `owned`), then the shared ones.
    stripes: Box<[Stripe]>,
    owned: usize,
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

/// Slots given back by ended threads, handed out again lowest first.
static FREE_SLOTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// A live thread's slot, given back when the thread ends.
struct Slot(usize);

impl Slot {
    fn take() -> Self {
        let mut free = lock(&FREE_SLOTS);
        let lowest = free
            .iter()
            .enumerate()
            .min_by_key(|(_, slot)| **slot)
            .map(|(i, _)| i);
        match lowest {
            Some(i) => Slot(free.swap_remove(i)),
            None => Slot(NEXT_SLOT.fetch_add(1, Ordering::Relaxed)),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&FREE_SLOTS).push(self.0);
    }
}

thread_local! {
    static SLOT: Slot = Slot::take();
}

impl<T> StripedRwLock<T> {
    /// A lock with `owned` stripes owned by the first slots and `shared` (at least one,
    /// rounded up to a power of two) for the others.
    pub(crate) fn new(value: T, owned: usize, shared: usize) -> Self {
        let shared = shared.max(1).next_power_of_two();
        Self {
            stripes: (0..owned + shared).map(|_| Stripe::default()).collect(),
            owned,
            writing: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// This thread's stripe, and whether the thread owns it.
    #[inline]
    fn stripe(&self) -> (&AtomicUsize, bool) {
        // No slot while the thread's locals are being torn down: use a shared stripe.
        let slot = SLOT.try_with(|slot| slot.0).unwrap_or(usize::MAX);
        if slot < self.owned {
            (&self.stripes[slot].0, true)
        } else {
            let shared = self.stripes.len() - self.owned;
            (&self.stripes[self.owned + (slot & (shared - 1))].0, false)
        }
    }

    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let (stripe, owned) = self.stripe();
        stripe.fetch_add(1, Ordering::SeqCst);
        if self.writing.load(Ordering::SeqCst) {
            self.wait_out_writer(stripe, owned);
        }
        ReadGuard {
            lock: self,
            stripe,
            owned,
        }
    }

    /// A reader counted in `stripe` met a writer: steps back so the writer can drain the
    /// stripes, waits for it, and counts itself again; returns counted, with no writer in.
    #[cold]
    #[inline(never)]
    fn wait_out_writer(&self, stripe: &AtomicUsize, owned: bool) {
        let mut round = 0;
        loop {
            leave(stripe, owned);
            while self.writing.load(Ordering::Acquire) {
                backoff(&mut round);
            }
            stripe.fetch_add(1, Ordering::SeqCst);
            if !self.writing.load(Ordering::SeqCst) {
                return;
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

/// Uncounts a reader from its stripe.
#[inline]
fn leave(stripe: &AtomicUsize, owned: bool) {
    if owned {
        // Only this thread writes an owned stripe, so nothing can come between the load and
        // the store; the store releases the reader's reads to the writer that sees it.
        stripe.store(stripe.load(Ordering::Relaxed) - 1, Ordering::Release);
    } else {
        stripe.fetch_sub(1, Ordering::Release);
    }
}

pub(crate) struct ReadGuard<'a, T> {
    lock: &'a StripedRwLock<T>,
    stripe: &'a AtomicUsize,
    owned: bool,
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
        leave(self.stripe, self.owned);
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
        let lock = Arc::new(StripedRwLock::new((0u64, 0u64), 2, 1));
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

    fn all_drained<T>(lock: &StripedRwLock<T>) -> bool {
        lock.stripes.iter().all(|s| s.0.load(Ordering::SeqCst) == 0)
    }

    #[test]
    fn nested_reads_on_owned_and_shared_stripes_leave_nothing_counted() {
        // Slot 0 or 1 owns a stripe in the first lock; no slot owns one in the second.
        for lock in [StripedRwLock::new(1, 64, 2), StripedRwLock::new(1, 0, 2)] {
            {
                let outer = lock.read();
                let inner = lock.read();
                assert_eq!(*outer + *inner, 2);
                assert!(!all_drained(&lock));
            }
            assert!(all_drained(&lock));
            *lock.write() = 3;
            assert_eq!(*lock.read(), 3);
            assert!(all_drained(&lock));
        }
    }

    #[test]
    fn an_ended_threads_slot_is_handed_out_again() {
        let slot = || std::thread::spawn(|| SLOT.with(|slot| slot.0)).join().unwrap();
        let first = slot();
        assert_eq!(slot(), first);
        // Two live threads hold two different slots: the first holds its slot until told.
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let hold = std::thread::spawn(move || {
            held_tx.send(SLOT.with(|slot| slot.0)).unwrap();
            done_rx.recv().unwrap();
        });
        let held = held_rx.recv().unwrap();
        assert_ne!(slot(), held);
        done_tx.send(()).unwrap();
        hold.join().unwrap();
    }
}
