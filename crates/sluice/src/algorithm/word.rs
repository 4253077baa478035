//! The compare-and-swap loop of the single-word algorithms' refunds, written once: each gives
//! a pure step from the word it read to its answer and the word to write. The checks keep
//! their own loops: answering a `Decision` through a closure and `Step` cost a denied check
//! twice its time (`cargo bench -p sluice --bench direct -- token_bucket`), so the hot path
//! is written out in `gcra.rs` and `fixed_window.rs`.

use super::RETIRED;
use crate::sync::atomic::{AtomicU64, Ordering};

/// What a step makes of the word it read.
pub(crate) enum Step<T> {
    /// Answer, writing nothing (a denial, a peek, nothing to give back).
    Answer(T),
    /// Write this word, then answer, if no other thread wrote first.
    Write(u64, T),
}

/// Runs `step` on `word` until it answers without writing or its write lands; a step that
/// lost a race runs again on the word that won. `None` if the word is retired.
#[inline(always)]
pub(crate) fn update<T>(word: &AtomicU64, mut step: impl FnMut(u64) -> Step<T>) -> Option<T> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        if current == RETIRED {
            return None;
        }
        match step(current) {
            Step::Answer(answer) => return Some(answer),
            Step::Write(next, answer) => {
                match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Some(answer),
                    Err(seen) => current = seen,
                }
            }
        }
    }
}

/// Marks `word` retired and returns its last value.
pub(crate) fn retire(word: &AtomicU64) -> u64 {
    word.swap(RETIRED, Ordering::AcqRel)
}
