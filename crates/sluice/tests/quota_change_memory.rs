//! A direct limiter whose quota changes often keeps its memory flat: the limits it retires
//! are freed once no check can be reading them. Measured by a counting allocator (alone in its
//! test binary, so no other test allocates meanwhile).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use sluice::{ManualClock, Quota, RateLimiter, TokenBucket};

/// The system allocator, counting the bytes held.
struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to `System` with the same arguments; the count changes
// nothing that is allocated.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::alloc`'s contract.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded as is; the caller upholds `GlobalAlloc::dealloc`'s contract.
        unsafe { System.dealloc(block, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A million quota changes, with another thread checking all along, hold no more memory at
/// the end than after the first ten thousand. Before retired limits were freed each change
/// kept one, some 10^8 bytes here.
#[test]
fn a_million_quota_changes_keep_memory_flat() {
    let limiter = RateLimiter::with_clock(TokenBucket, "10/s".parse().unwrap(), ManualClock::new(0)).unwrap();
    let quotas: [Quota; 2] = ["10/s".parse().unwrap(), "20/s".parse().unwrap()];
    let done = AtomicBool::new(false);
    let (warm, end) = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let _ = limiter.check();
            }
        });
        let change = |n: usize| {
            for i in 0..n {
                limiter.set_quota(quotas[i % 2]).unwrap();
            }
            HELD.load(Ordering::Relaxed)
        };
        let warm = change(10_000);
        let end = change(1_000_000);
        done.store(true, Ordering::Relaxed);
        (warm, end)
    });
    assert!(
        end - warm < 16 * 1024,
        "{} bytes more after a million changes than after ten thousand",
        end - warm
    );
    assert_eq!(limiter.quota(), quotas[1]);
}
