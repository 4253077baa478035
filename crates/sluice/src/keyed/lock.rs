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
//! the remaining stripes and count with read-modify-writes. That plain store is why a read
//! guard is not `Send`: dropped on another thread, it would write the owned stripe from a
//! thread that does not own it, and could erase the owner's own count.
//!
//! The protocol is Dekker's: a reader increments its stripe and then reads the flag; a writer
//! sets the flag and then reads every stripe; all four operations are sequentially consistent,
//! so at least one side sees the other and they never both proceed (`seq_cst_handshake`
//! marks the two places for the model checker, see `crate::sync`).
//!
//! `loom_tests` below model-checks the protocol (see `crate::sync`).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use crate::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use crate::sync::{
    ConstPtr, MutPtr, UnsafeCell, lock, seq_cst_handshake, spin_loop, thread_local, yield_now,
};

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
        spin_loop();
        *round += 1;
    } else {
        yield_now();
    }
}

/// Slot numbers for live threads: the lowest one given back by an ended thread first, else a
/// new one.
struct SlotNumbers {
    free: Mutex<Vec<usize>>,
    next: std::sync::atomic::AtomicUsize,
}

impl SlotNumbers {
    const fn new() -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            next: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn take(&self) -> usize {
        let mut free = lock(&self.free);
        let lowest = free
            .iter()
            .enumerate()
            .min_by_key(|(_, slot)| **slot)
            .map(|(i, _)| i);
        match lowest {
            Some(i) => free.swap_remove(i),
            None => self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    fn give_back(&self, slot: usize) {
        lock(&self.free).push(slot);
    }
}

/// The process's slot numbers.
static SLOT_NUMBERS: SlotNumbers = SlotNumbers::new();

/// A live thread's slot, given back when the thread ends.
struct ReaderSlot(usize);

impl ReaderSlot {
    fn take() -> Self {
        ReaderSlot(SLOT_NUMBERS.take())
    }
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        SLOT_NUMBERS.give_back(self.0);
    }
}

thread_local! {
    static SLOT: ReaderSlot = ReaderSlot::take();
}

/// This thread's slot; `usize::MAX` (a shared stripe) while the thread's locals are being torn
/// down.
#[inline]
fn this_slot() -> usize {
    SLOT.try_with(|slot| slot.0).unwrap_or(usize::MAX)
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

    /// The stripe of the thread holding `slot`, and whether that thread owns it.
    #[inline]
    fn stripe(&self, slot: usize) -> (&AtomicUsize, bool) {
        if slot < self.owned {
            (&self.stripes[slot].0, true)
        } else {
            let shared = self.stripes.len() - self.owned;
            (&self.stripes[self.owned + (slot & (shared - 1))].0, false)
        }
    }

    #[inline]
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        self.read_as(this_slot())
    }

    /// [`Self::read`] by the thread holding `slot`. Counting in an owned stripe is sound only
    /// on the thread whose slot owns it, and the guard stays on that thread (it is not `Send`).
    #[inline]
    fn read_as(&self, slot: usize) -> ReadGuard<'_, T> {
        let (stripe, owned) = self.stripe(slot);
        stripe.fetch_add(1, Ordering::SeqCst);
        seq_cst_handshake();
        if self.writing.load(Ordering::SeqCst) {
            self.wait_out_writer(stripe, owned);
        }
        let reader = Reader {
            stripe,
            owned,
            _not_send: PhantomData,
        };
        ReadGuard {
            value: self.value.get(),
            _reader: reader,
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
            seq_cst_handshake();
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
        let writer = Writer(&self.writing);
        seq_cst_handshake();
        for stripe in &self.stripes {
            let mut round = 0;
            while stripe.0.load(Ordering::SeqCst) != 0 {
                backoff(&mut round);
            }
        }
        WriteGuard {
            value: self.value.get_mut(),
            _writer: writer,
        }
    }

    /// Bytes this lock holds on the heap (its stripes).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.stripes.len() * size_of::<Stripe>()
    }
}

/// Uncounts a reader from its stripe. An owned stripe may be left only by the thread whose
/// slot owns it.
#[inline]
fn leave(stripe: &AtomicUsize, owned: bool) {
    if owned {
        // Only the owning thread writes an owned stripe (`read_as`, and `Reader` is not
        // `Send`), so nothing can come between the load and the store; the store releases
        // the reader's reads to the writer that sees it.
        stripe.store(stripe.load(Ordering::Relaxed) - 1, Ordering::Release);
    } else {
        stripe.fetch_sub(1, Ordering::Release);
    }
}

/// Shared access to the value, counted in a stripe until dropped. Neither `Send` nor `Sync`:
/// see [`Reader`].
pub(crate) struct ReadGuard<'a, T> {
    /// Declared (so dropped) before `_reader`: the access ends before the reader is uncounted.
    value: ConstPtr<T>,
    _reader: Reader<'a>,
}

/// A reader counted in a stripe, uncounted on drop.
///
/// Not `Send` (nor `Sync`), through the raw-pointer marker: leaving an owned stripe is a plain
/// load and store, sound only because no thread but the owner ever writes that stripe. A
/// reader dropped on another thread would do that load and store beside the owner's own
/// increments; an increment falling between them is lost, the stripe then reads zero while
/// the owner is inside, and a writer proceeds beside it.
struct Reader<'a> {
    stripe: &'a AtomicUsize,
    owned: bool,
    _not_send: PhantomData<*const ()>,
}

impl Drop for Reader<'_> {
    #[inline]
    fn drop(&mut self) {
        leave(self.stripe, self.owned);
    }
}

// `ReadGuard` must stay `!Send` (see `Reader`): this fails to compile if it were `Send`,
// because the call below would then match both impls.
const _: fn() = || {
    trait AmbiguousIfSend<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfSend<()> for T {}
    struct IsSend;
    impl<T: ?Sized + Send> AmbiguousIfSend<IsSend> for T {}
    <ReadGuard<'static, u64> as AmbiguousIfSend<_>>::check();
};

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the reader is counted in a stripe and saw no writer, so no writer proceeds
        // until this guard drops (see the module comment), and the guard, which borrows the
        // lock, cannot outlive the value.
        unsafe { self.value.deref() }
    }
}

/// Exclusive access to the value; clears the writer flag on drop.
pub(crate) struct WriteGuard<'a, T> {
    /// Declared (so dropped) before `_writer`: the access ends before the flag is cleared.
    value: MutPtr<T>,
    _writer: Writer<'a>,
}

// SAFETY: unlike a reader's stripe, the writer flag is cleared by one atomic store, correct
// from any thread; while it lives the guard is exclusive access to `T`, like a `&mut T` beside
// a `&StripedRwLock<T>`, hence the bounds the guard had before it held a pointer.
unsafe impl<T: Send + Sync> Send for WriteGuard<'_, T> {}
// SAFETY: as for `Send`; through `&WriteGuard` only `&T` is reachable.
unsafe impl<T: Send + Sync> Sync for WriteGuard<'_, T> {}

/// The held writer flag, cleared on drop.
struct Writer<'a>(&'a AtomicBool);

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the writer flag is set and every stripe drained: no reader is inside, and
        // readers that come meanwhile wait (see the module comment). A shared reference is
        // made straight from the pointer, so several may coexist.
        self.value.with(|value| unsafe { &*value })
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`, and only one writer holds the flag; `&mut self` keeps every
        // other reference from this guard dead meanwhile.
        unsafe { self.value.deref() }
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

    /// Numbers given back are handed out again, lowest first; numbers in use are never handed
    /// out twice. (On a registry of its own: the process's is shared with every test thread.)
    #[test]
    fn a_given_back_slot_is_handed_out_again_lowest_first() {
        let numbers = SlotNumbers::new();
        let (a, b, c) = (numbers.take(), numbers.take(), numbers.take());
        assert_eq!((a, b, c), (0, 1, 2));
        numbers.give_back(c);
        numbers.give_back(a);
        assert_eq!(numbers.take(), a);
        assert_eq!(numbers.take(), c);
        assert_eq!(numbers.take(), 3);
    }

    /// A thread's slot is given back when it ends: a thread that ends while another lives
    /// leaves the live one's slot alone, and the process's numbers stay in use at most once.
    #[test]
    fn live_threads_hold_distinct_slots() {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let hold = std::thread::spawn(move || {
            held_tx.send(SLOT.with(|slot| slot.0)).unwrap();
            done_rx.recv().unwrap();
        });
        let held = held_rx.recv().unwrap();
        let other = std::thread::spawn(|| SLOT.with(|slot| slot.0)).join().unwrap();
        assert_ne!(other, held);
        done_tx.send(()).unwrap();
        hold.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests;
