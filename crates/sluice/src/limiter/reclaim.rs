//! When a limit the direct limiter retired may be freed: hazard pointers, one per thread,
//! shared by every direct limiter of the process.
//!
//! A check loads the limit in force through one pointer and may still read it after a quota
//! change retired it. So it announces the pointer in its thread's slot, then loads the pointer
//! again: if it is still the one announced, it was in force after the announcement could be
//! seen, and a replacement, which publishes the successor before it reads the slots, will find
//! it there and keep that limit (the store of the successor and a check's announcement are
//! ordered by the two barriers below: Dekker's handshake). A retired limit that no slot names
//! may be freed: a check that loads the pointer later finds the successor.
//!
//! A thread holds back at most the one limit it is checking, however long it stalls. A nested
//! check (a clock or an algorithm checking another limiter) announces `EVERY` instead, which
//! keeps every retired limit until it returns, and then gives the outer check its announcement
//! back.
//!
//! The barrier on the check's side costs nothing where the freeing side can make every thread
//! of the process pass a full barrier at once (Linux's `membarrier`, registered when the first
//! direct limiter is built); elsewhere, and where that is refused, both sides fence. Outside a
//! check a thread's slot holds `QUIET` or `FENCED`, saying which: the common path tests that
//! one value for both this and nesting.
//!
//! The announcement is a plain store to the thread's own cache line: no read-modify-write, and
//! nothing shared is written by a check.
//!
//! `loom_tests` model-checks the protocol: there both barriers are `SeqCst` fences, and a
//! freed limit is marked rather than freed, so that any read of it not ordered before the
//! freeing is reported (see `Limit::used`).

use std::cell::Cell;
use std::marker::PhantomData;

use crate::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use crate::sync::{Mutex, lock};

/// A thread's announcement: `idle` outside a check, else the address of the limit it reads
/// (or `EVERY`). On a cache line of its own (128 bytes: adjacent-line prefetch pairs lines).
#[repr(align(128))]
pub(crate) struct Slot {
    hazard: AtomicUsize,
    /// `QUIET`, or `FENCED` where checks must fence.
    idle: usize,
}

/// The announcement of a thread in no check.
const QUIET: usize = 0;
/// The announcement of a nested check: no retired limit may be freed.
const EVERY: usize = 1;
/// The announcement of a thread in no check whose checks must fence.
const FENCED: usize = 2;

/// Every thread's slot.
pub(crate) struct Domain {
    /// Every slot made, and whether a live thread holds it. Slots are never freed (a thread
    /// ending gives its slot to the next), so a thread may keep `&'static` to its own.
    slots: Mutex<Vec<(&'static Slot, bool)>>,
}

impl Domain {
    #[cfg(not(all(test, loom)))]
    const fn new() -> Self {
        Self {
            slots: Mutex::new(Vec::new()),
        }
    }

    #[cfg(all(test, loom))]
    fn new() -> Self {
        Self {
            slots: Mutex::new(Vec::new()),
        }
    }

    /// A free slot, now held.
    fn claim(&self) -> &'static Slot {
        let mut slots = lock(&self.slots);
        if let Some((slot, held)) = slots.iter_mut().find(|(_, held)| !*held) {
            *held = true;
            return slot;
        }
        let idle = if symmetric() { FENCED } else { QUIET };
        let slot: &'static Slot = Box::leak(Box::new(Slot {
            hazard: AtomicUsize::new(idle),
            idle,
        }));
        slots.push((slot, true));
        slot
    }

    #[cfg(not(all(test, loom)))]
    fn give_back(&self, slot: &'static Slot) {
        let mut slots = lock(&self.slots);
        if let Some((_, held)) = slots.iter_mut().find(|(s, _)| std::ptr::eq(*s, slot)) {
            *held = false;
        }
    }

    /// What the threads in a check announce now, once every announcement made before is
    /// visible: call after publishing the successors of the limits to free. `None` if that
    /// cannot be made sure (then nothing may be freed); `Some(None)` if a nested check keeps
    /// every limit.
    pub(crate) fn hazards(&self) -> Option<Option<Vec<usize>>> {
        if !heavy_barrier() {
            return None;
        }
        let slots = lock(&self.slots);
        let mut hazards = Vec::new();
        for (slot, _) in slots.iter() {
            // Acquire: a check's reads of a limit happen before its leaving (a release store).
            match slot.hazard.load(Ordering::Acquire) {
                QUIET | FENCED => {}
                EVERY => return Some(None),
                hazard => hazards.push(hazard),
            }
        }
        Some(Some(hazards))
    }
}

#[cfg(not(all(test, loom)))]
static DOMAIN: Domain = Domain::new();

#[cfg(not(all(test, loom)))]
#[inline(always)]
pub(crate) fn domain() -> &'static Domain {
    &DOMAIN
}

#[cfg(all(test, loom))]
loom::lazy_static! {
    static ref DOMAIN: Domain = Domain::new();
}

#[cfg(all(test, loom))]
pub(crate) fn domain() -> &'static Domain {
    &DOMAIN
}

/// Set where checks must fence: no process-wide barrier. Decided before the first direct
/// limiter is built, so every check (on a limiter built after) sees it.
#[cfg(not(all(test, loom)))]
static SYMMETRIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether checks must fence (never under the model checker, whose fences are all real).
fn symmetric() -> bool {
    #[cfg(not(all(test, loom)))]
    return SYMMETRIC.load(Ordering::Relaxed);
    #[cfg(all(test, loom))]
    false
}

/// Decides once per process, before the first direct limiter exists, whether checks may skip
/// their fence.
pub(crate) fn init() {
    #[cfg(not(all(test, loom)))]
    {
        static INIT: std::sync::Once = std::sync::Once::new();
        INIT.call_once(|| {
            if !membarrier::register() {
                SYMMETRIC.store(true, Ordering::Relaxed);
            }
        });
    }
}

/// Releases the thread's slot when the thread ends. (Not under the model checker, whose
/// threads end after the domain: there each keeps its slot.)
#[cfg(not(all(test, loom)))]
struct Holder(&'static Slot);

#[cfg(not(all(test, loom)))]
impl Holder {
    fn claim() -> Self {
        Self(domain().claim())
    }
}

#[cfg(not(all(test, loom)))]
impl Drop for Holder {
    fn drop(&mut self) {
        let _ = SLOT.try_with(|slot| slot.set(None));
        // A slot left announced (a check that never returned) is kept, never reused.
        if self.0.hazard.load(Ordering::Relaxed) == self.0.idle {
            domain().give_back(self.0);
        }
    }
}

#[cfg(not(all(test, loom)))]
std::thread_local! {
    /// The thread's slot, once claimed (no destructor: readable while the thread ends).
    static SLOT: Cell<Option<&'static Slot>> = const { Cell::new(None) };
    static HOLDER: Holder = Holder::claim();
}

#[cfg(all(test, loom))]
loom::thread_local! {
    static SLOT: Cell<Option<&'static Slot>> = Cell::new(None);
}

/// The thread's slot, claimed on its first check.
#[cold]
#[inline(never)]
fn register() -> &'static Slot {
    // A thread whose locals are being torn down claims one for good: it is never given back,
    // but reads as in no check once that check returns.
    #[cfg(not(all(test, loom)))]
    let slot = HOLDER
        .try_with(|holder| holder.0)
        .unwrap_or_else(|_| domain().claim());
    #[cfg(all(test, loom))]
    let slot = domain().claim();
    let _ = SLOT.try_with(|cell| cell.set(Some(slot)));
    slot
}

/// This thread in a check: the limit it loads through [`Pinned::protect`] is not freed until
/// this drops or protects another. Not `Send`: it writes its thread's slot when dropped.
pub(crate) struct Pinned {
    slot: &'static Slot,
    /// The announcement to restore: the slot's idle value, or an outer check's.
    saved: usize,
    _thread: PhantomData<*const ()>,
}

/// Enters a check on this thread, until the guard drops.
#[inline(always)]
pub(crate) fn pin() -> Pinned {
    let slot = SLOT.with(Cell::get).unwrap_or_else(register);
    Pinned {
        slot,
        saved: slot.hazard.load(Ordering::Relaxed),
        _thread: PhantomData,
    }
}

impl Pinned {
    /// The value of `pointer`, announced: what it points to is not freed until `self` drops or
    /// protects another (if the freeing side scans the slots after publishing a successor,
    /// see `Domain::hazards`).
    #[inline(always)]
    pub(crate) fn protect<T>(&mut self, pointer: &AtomicPtr<T>) -> *mut T {
        if self.saved != QUIET {
            // By value: a reference to `self` passed on would keep it out of registers.
            return protect_fenced_or_nested(self.slot, self.saved, pointer);
        }
        let mut seen = pointer.load(Ordering::Acquire);
        loop {
            // Release, as leaving is: a scan that reads this must find the reads of the limit
            // announced before (this thread's last check) done.
            self.slot.hazard.store(seen as usize, Ordering::Release);
            // The freeing side's `membarrier` stands for a fence here in every thread.
            light_barrier();
            let now = pointer.load(Ordering::Acquire);
            if now == seen {
                return seen;
            }
            seen = now;
        }
    }
}

/// `Pinned::protect` with a fence (no process-wide barrier), or inside another check:
/// announces `EVERY`, which keeps every retired limit, the outer check's among them.
#[cold]
#[inline(never)]
fn protect_fenced_or_nested<T>(slot: &Slot, saved: usize, pointer: &AtomicPtr<T>) -> *mut T {
    let mut seen = pointer.load(Ordering::Acquire);
    let nested = saved != FENCED;
    loop {
        let hazard = if nested { EVERY } else { seen as usize };
        slot.hazard.store(hazard, Ordering::Release);
        if slot.idle == FENCED {
            std::sync::atomic::fence(Ordering::SeqCst);
        } else {
            light_barrier();
        }
        let now = pointer.load(Ordering::Acquire);
        if nested || now == seen {
            return now;
        }
        seen = now;
    }
}

impl Drop for Pinned {
    #[inline(always)]
    fn drop(&mut self) {
        self.slot.hazard.store(self.saved, Ordering::Release);
    }
}

/// Orders a check's announcement before its second load of the pointer, where the freeing
/// side makes every thread pass a barrier (a real fence under the model checker).
#[inline(always)]
fn light_barrier() {
    #[cfg(all(test, loom))]
    loom::sync::atomic::fence(Ordering::SeqCst);
    #[cfg(not(all(test, loom)))]
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
}

/// Orders a replacement's store of the successor before its reading of the slots; `false`
/// if it could not.
fn heavy_barrier() -> bool {
    #[cfg(all(test, loom))]
    {
        loom::sync::atomic::fence(Ordering::SeqCst);
        true
    }
    #[cfg(not(all(test, loom)))]
    if SYMMETRIC.load(Ordering::Relaxed) {
        std::sync::atomic::fence(Ordering::SeqCst);
        true
    } else {
        membarrier::run()
    }
}

/// The process-wide barrier: every running thread of the process executes a full memory
/// barrier before the call returns (a thread not running passes one when switched out).
#[cfg(not(all(test, loom)))]
mod membarrier {
    #[cfg(target_os = "linux")]
    mod imp {
        // From <linux/membarrier.h>.
        const QUERY: libc::c_int = 0;
        const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
        const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

        fn call(command: libc::c_int) -> libc::c_long {
            // SAFETY: `membarrier(cmd, flags, cpu_id)` reads and writes no memory of ours; an
            // unknown or refused command only returns -1.
            unsafe { libc::syscall(libc::SYS_membarrier, command, 0 as libc::c_uint, 0 as libc::c_int) }
        }

        pub(crate) fn register() -> bool {
            let supported = call(QUERY);
            supported > 0
                && supported & libc::c_long::from(PRIVATE_EXPEDITED) != 0
                && call(REGISTER_PRIVATE_EXPEDITED) == 0
        }

        pub(crate) fn run() -> bool {
            call(PRIVATE_EXPEDITED) == 0
        }
    }

    #[cfg(not(target_os = "linux"))]
    mod imp {
        pub(crate) fn register() -> bool {
            false
        }

        pub(crate) fn run() -> bool {
            false
        }
    }

    pub(crate) use imp::{register, run};
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_nested_check_keeps_every_limit_and_gives_the_outer_its_announcement_back() {
        init();
        let limit = AtomicPtr::new(Box::into_raw(Box::new(7u64)));
        let mut outer = pin();
        let announced = outer.protect(&limit);
        assert_eq!(outer.slot.hazard.load(Ordering::Relaxed), announced as usize);
        assert!(
            domain()
                .hazards()
                .is_some_and(|h| h.is_some_and(|h| h.contains(&(announced as usize))))
        );
        {
            let mut inner = pin();
            assert_eq!(inner.protect(&limit), announced);
            assert_eq!(inner.slot.hazard.load(Ordering::Relaxed), EVERY);
            assert!(domain().hazards().is_some_and(|h| h.is_none()));
        }
        assert_eq!(outer.slot.hazard.load(Ordering::Relaxed), announced as usize);
        drop(outer);
        assert_eq!(
            SLOT.with(Cell::get).unwrap().hazard.load(Ordering::Relaxed),
            QUIET
        );
        // SAFETY: made by `Box::into_raw` above, freed once, no guard left.
        drop(unsafe { Box::from_raw(limit.load(Ordering::Relaxed)) });
    }

    /// The path where no process-wide barrier exists (here forced on a slot of its own).
    #[test]
    fn a_fenced_slot_announces_what_it_loads_and_goes_back_to_fenced() {
        let slot: &'static Slot = Box::leak(Box::new(Slot {
            hazard: AtomicUsize::new(FENCED),
            idle: FENCED,
        }));
        let mut pinned = Pinned {
            slot,
            saved: FENCED,
            _thread: PhantomData,
        };
        let limit = AtomicPtr::new(Box::into_raw(Box::new(7u64)));
        let seen = pinned.protect(&limit);
        assert_eq!(seen, limit.load(Ordering::Relaxed));
        assert_eq!(slot.hazard.load(Ordering::Relaxed), seen as usize);
        drop(pinned);
        assert_eq!(slot.hazard.load(Ordering::Relaxed), FENCED);
        // SAFETY: made by `Box::into_raw` above, freed once, no guard left.
        drop(unsafe { Box::from_raw(seen) });
    }

    #[test]
    fn threads_that_ended_give_their_slots_to_new_ones() {
        init();
        let check = || std::thread::spawn(|| drop(pin())).join().unwrap();
        check();
        let made = lock(&domain().slots).len();
        for _ in 0..100 {
            check();
        }
        // Other tests' threads may take slots meanwhile; a hundred threads one after another
        // need at most a few more.
        assert!(lock(&domain().slots).len() <= made + 8, "slots are reused");
    }
}
