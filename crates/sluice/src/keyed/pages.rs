//! A table's slots in memory of their own, on huge pages where the table is large.
//!
//! A lookup among a million keys reads one random entry, and with 4 KiB pages that read also
//! misses the processor's cache of page translations: the page tables are walked (on a virtual
//! machine, two sets of them) before the read itself starts. A 2 MiB page covers 512 times as
//! much, so the translations of a whole table stay cached. Linux backs memory with them where
//! `madvise(MADV_HUGEPAGE)` asks, when its transparent huge pages are set to `madvise` (a
//! common default) or `always`; it can only for whole 2 MiB pages of one mapping, so a large
//! array is allocated on a 2 MiB boundary and only its whole 2 MiB pages are marked (marking a
//! part page would back memory the array does not use). Elsewhere, and below 2 MiB, this is an
//! ordinary allocation.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::NonNull;

/// A huge page, and the size from which an array is put on them.
const HUGE_PAGE: usize = 2 << 20;

/// A fixed number of values, each made by `T::default()`, allocated (and for an array of
/// [`HUGE_PAGE`] or more, aligned and marked) as the module says.
pub(crate) struct Slots<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: `Slots<T>` owns its values as a `Box<[T]>` would: sending or sharing it sends or
// shares them, and nothing else refers to its memory.
unsafe impl<T: Send> Send for Slots<T> {}
// SAFETY: as for `Send`; `&Slots<T>` gives out only `&T`.
unsafe impl<T: Sync> Sync for Slots<T> {}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Self {
            ptr: NonNull::dangling(),
            len: 0,
        }
    }
}

impl<T: Default> Slots<T> {
    /// `len` default values.
    pub(crate) fn new(len: usize) -> Self {
        let layout = Self::layout(len);
        if layout.size() == 0 {
            return Self {
                ptr: NonNull::dangling(),
                len,
            };
        }
        // SAFETY: the layout's size is not zero.
        let raw = unsafe { alloc(layout) };
        let Some(ptr) = NonNull::new(raw.cast::<T>()) else {
            handle_alloc_error(layout)
        };
        if layout.align() == HUGE_PAGE {
            advise_huge(raw, layout.size() / HUGE_PAGE * HUGE_PAGE);
        }
        for i in 0..len {
            // SAFETY: `i < len`, so the place lies inside the allocation, sized and aligned
            // for `len` values of `T`, and is written once before anything reads it. Should
            // `default` panic, the values written so far and the memory leak (never read).
            unsafe { ptr.add(i).write(T::default()) };
        }
        Self { ptr, len }
    }
}

impl<T> Slots<T> {
    /// The layout of `len` values: aligned to a huge page from [`HUGE_PAGE`] bytes on.
    fn layout(len: usize) -> Layout {
        let Ok(layout) = Layout::array::<T>(len) else {
            // As `Vec` does for a length past `isize::MAX` bytes.
            panic!("capacity overflow: {len} slots");
        };
        if layout.size() >= HUGE_PAGE {
            // A power of two, and the size is at least as large: a valid layout.
            layout.align_to(HUGE_PAGE).unwrap_or(layout)
        } else {
            layout
        }
    }
}

impl<T> std::ops::Deref for Slots<T> {
    type Target = [T];

    #[inline]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialized values (or is dangling, well aligned, for
        // none or for zero-sized ones), owned by `self` for the borrow's life.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for Slots<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        let layout = Self::layout(self.len);
        // SAFETY: the values are initialized and owned; each is dropped once, here, and the
        // memory is given back with the layout it was allocated with (none if zero-sized).
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len));
            if layout.size() != 0 {
                dealloc(self.ptr.as_ptr().cast(), layout);
            }
        }
    }
}

/// Asks for huge pages under `[start, start + bytes)`: whole huge pages, from a huge page's
/// boundary.
#[cfg(target_os = "linux")]
fn advise_huge(start: *mut u8, bytes: usize) {
    // SAFETY: the range lies inside one live allocation, and MADV_HUGEPAGE only advises the
    // kernel how to back it: it changes neither the contents nor the validity of any memory.
    // A failure (a kernel without huge pages) leaves ordinary pages, as without the call.
    unsafe {
        libc::madvise(start.cast(), bytes, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_start: *mut u8, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static DROPPED: AtomicUsize = AtomicUsize::new(0);

    /// Counts its drops.
    #[derive(Default)]
    struct Counted(Option<u64>);

    impl Drop for Counted {
        fn drop(&mut self) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Small, empty and huge-page-sized arrays hold what is written to them, and drop each
    /// value exactly once.
    #[test]
    fn slots_hold_their_values_and_drop_each_once() {
        for len in [0, 1, 1000, (3 * HUGE_PAGE) / size_of::<Counted>() + 5] {
            let before = DROPPED.load(Ordering::Relaxed);
            let mut slots = Slots::<Counted>::new(len);
            assert_eq!(slots.len(), len);
            assert!(slots.iter().all(|value| value.0.is_none()));
            for (i, value) in slots.iter_mut().enumerate() {
                value.0 = Some(i as u64);
            }
            assert!(
                slots
                    .iter()
                    .enumerate()
                    .all(|(i, value)| value.0 == Some(i as u64))
            );
            if Slots::<Counted>::layout(len).size() >= HUGE_PAGE {
                assert_eq!(
                    slots.as_ptr() as usize % HUGE_PAGE,
                    0,
                    "huge arrays start on a huge page"
                );
            }
            // Replacing a value drops the old one.
            if len > 0 {
                slots[0] = Counted(None);
                assert_eq!(DROPPED.load(Ordering::Relaxed), before + 1);
            }
            drop(slots);
            assert_eq!(
                DROPPED.load(Ordering::Relaxed),
                before + len + usize::from(len > 0)
            );
        }
    }
}
