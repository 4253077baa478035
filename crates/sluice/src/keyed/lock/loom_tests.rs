//! The striped lock's protocol under loom (`test.sh` runs these with `--cfg loom`), which
//! runs each test's threads in every interleaving (up to its preemption bound) and fails on any access to the value that a reader and the writer
//! make at once or without happening-before between them.
//!
//! Each test has two threads, so that at most one of them ever spins waiting for the
//! other: loom's scheduler may otherwise alternate forever between two threads that both
//! spin on a third, and report the exploration as too long.

use super::*;
use crate::sync::{model, model_failure};
use loom::sync::Arc;
use loom::thread;

/// A lock whose slot 0 owns a stripe and whose other slots share the one left.
fn owned_and_shared() -> Arc<StripedRwLock<(u64, u64)>> {
    Arc::new(StripedRwLock::new((0, 0), 1, 1))
}

fn all_drained<T>(lock: &StripedRwLock<T>) -> bool {
    lock.stripes.iter().all(|s| s.0.load(Ordering::SeqCst) == 0)
}

/// The writer keeps both fields equal; a reader that saw them differ saw a half-done write.
fn write_once(lock: &StripedRwLock<(u64, u64)>) {
    let mut guard = lock.write();
    guard.0 += 1;
    guard.1 += 1;
}

fn read_whole(lock: &StripedRwLock<(u64, u64)>, slot: usize) -> u64 {
    let guard = lock.read_as(slot);
    assert_eq!(guard.0, guard.1, "a reader saw a half-done write");
    guard.0
}

/// A reader on an owned stripe (left with a plain store) and, separately, one on a shared
/// stripe (left with a read-modify-write) race a writer: the reader sees the value before
/// or after the write, never during it, and nothing stays counted.
#[test]
fn loom_a_reader_on_an_owned_or_a_shared_stripe_excludes_a_writer() {
    for slot in [0, 1] {
        model(move || {
            let lock = owned_and_shared();
            let writer = {
                let lock = Arc::clone(&lock);
                thread::spawn(move || write_once(&lock))
            };
            assert!(read_whole(&lock, slot) <= 1);
            writer.join().unwrap();
            assert!(all_drained(&lock));
            assert_eq!(*lock.read_as(slot), (1, 1));
        });
    }
}

/// Two readers, one on the owned stripe and one on the shared stripe, interleave with two
/// writes made by the second reader's thread: every read sees a whole value.
#[test]
fn loom_owned_and_shared_readers_interleave_with_writes() {
    model(|| {
        let lock = owned_and_shared();
        let other = {
            let lock = Arc::clone(&lock);
            thread::spawn(move || {
                write_once(&lock);
                let seen = read_whole(&lock, 1);
                write_once(&lock);
                seen
            })
        };
        let seen = read_whole(&lock, 0);
        assert!(seen <= 2);
        assert!((1..=2).contains(&other.join().unwrap()));
        assert!(all_drained(&lock));
        assert_eq!(*lock.read_as(0), (2, 2));
    });
}

/// A reader that arrives while a writer holds the lock steps back (`wait_out_writer`),
/// and is let in only once the write is whole, including when a second write comes
/// before it is in. The reader takes its slot from the thread-local like every reader.
#[test]
fn loom_a_reader_meeting_a_writer_waits_it_out() {
    model(|| {
        // Every slot on the one shared stripe, so whichever slot the thread gets counts.
        let lock = Arc::new(StripedRwLock::new((0u64, 0u64), 0, 1));
        let mut guard = lock.write();
        let reader = {
            let lock = Arc::clone(&lock);
            thread::spawn(move || {
                let guard = lock.read();
                assert_eq!(guard.0, guard.1, "a reader saw a half-done write");
                guard.0
            })
        };
        guard.0 += 1;
        guard.1 += 1;
        drop(guard);
        write_once(&lock);
        let seen = reader.join().unwrap();
        assert!(
            seen == 1 || seen == 2,
            "the reader got in before the first write ended"
        );
        assert!(all_drained(&lock));
    });
}

/// Whether loom's failure is a reader and a writer in the value at once.
fn is_overlap(failure: &str) -> bool {
    failure.contains("currently reading from cell")
        || failure.contains("currently writing to cell")
        || failure.contains("Concurrent read and write accesses")
}

/// The writer's protocol tried once, without waiting: takes the flag and, if every
/// stripe then reads 0, writes. The tests of a broken rule below use it so that a stripe
/// the break leaves counted forever fails the write instead of spinning it forever.
fn try_write_once(lock: &StripedRwLock<(u64, u64)>) {
    if lock
        .writing
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::Relaxed)
        .is_err()
    {
        return;
    }
    let _writer = Writer(&lock.writing);
    seq_cst_handshake();
    if lock.stripes.iter().all(|s| s.0.load(Ordering::SeqCst) == 0) {
        let value = lock.value.get_mut();
        // SAFETY: as in `write`: the flag is held and every stripe read 0.
        let value = unsafe { value.deref() };
        value.0 += 1;
        value.1 += 1;
    }
}

/// Lets a read guard cross threads, which its type forbids.
struct ForceSend<T>(T);
// SAFETY: it is not; this wrapper exists to show what `ReadGuard: !Send` prevents.
unsafe impl<T> Send for ForceSend<T> {}

/// The rule a read guard's `!Send` enforces, broken: the owner of stripe 0 hands a guard
/// to another thread, which leaves the owned stripe with its plain load and store while
/// the owner counts a second read. The owner's count can fall between that load and store
/// and be lost, and loom finds the other thread's write then getting in beside the
/// owner's read.
#[test]
fn loom_catches_a_read_guard_dropped_on_another_thread() {
    let failure = model_failure(|| {
        // Leaked, so that a guard borrowing it can be sent to another thread.
        let lock: &'static StripedRwLock<(u64, u64)> = Box::leak(Box::new(StripedRwLock::new((0, 0), 1, 1)));
        let moved = ForceSend(lock.read_as(0));
        let other = thread::spawn(move || {
            drop(moved);
            try_write_once(lock);
        });
        read_whole(lock, 0);
        other.join().unwrap();
    });
    assert!(is_overlap(&failure), "loom failed otherwise: {failure}");
}

/// The same lost update from two threads that both count in one owned stripe (as two live
/// threads holding one slot would): a write gets in beside a read. The same two threads on
/// the shared stripe, which is left with a read-modify-write, pass.
#[test]
fn loom_catches_an_owned_stripe_shared_by_two_threads() {
    let two_readers_then_a_write = |slot| {
        move || {
            let lock = owned_and_shared();
            let other = {
                let lock = Arc::clone(&lock);
                thread::spawn(move || {
                    read_whole(&lock, slot);
                    try_write_once(&lock);
                })
            };
            read_whole(&lock, slot);
            other.join().unwrap();
        }
    };
    let failure = model_failure(two_readers_then_a_write(0));
    assert!(is_overlap(&failure), "loom failed otherwise: {failure}");
    model(two_readers_then_a_write(1));
}
