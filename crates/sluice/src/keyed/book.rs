//! The quota book: every quota a keyed limiter has compiled, shared by the keys that have it.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::stable::StableBox;
use crate::sync::lock;
use crate::{Algorithm, Quota, QuotaError};

/// A quota compiled once for an algorithm, shared by every key that has it.
#[derive(Debug)]
pub(crate) struct Compiled<A: Algorithm> {
    pub(crate) quota: Quota,
    pub(crate) params: A::Params,
    pub(crate) horizon: u64,
    /// The first time past its epoch at which a check leaves the read-locked path: just past
    /// the horizon, or at once for a pooled quota. One comparison serves both, so the hot path
    /// pays nothing for the pool.
    pub(crate) divert: u64,
    /// The failsafe quota under a failsafe pool: checks under it also draw on the pool.
    pub(crate) pooled: bool,
}

/// A compiled quota in the limiter's book, as its entries hold it.
///
/// The book keeps every compiled quota in a [`StableBox`] and never removes one while the
/// limiter lives, and these references are held only by the limiter's own entries and fields:
/// a plain pointer does, where a counted one cost two atomic operations per new key.
pub(crate) struct LimitRef<A: Algorithm>(NonNull<Compiled<A>>);

impl<A: Algorithm> LimitRef<A> {
    pub(crate) fn same(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<A: Algorithm> Clone for LimitRef<A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<A: Algorithm> Copy for LimitRef<A> {}

impl<A: Algorithm> std::ops::Deref for LimitRef<A> {
    type Target = Compiled<A>;

    #[inline]
    fn deref(&self) -> &Compiled<A> {
        // SAFETY: the book owns the pointee until the limiter (which owns every `LimitRef`) is
        // dropped; it is never written after it is booked.
        unsafe { self.0.as_ref() }
    }
}

// SAFETY: a `LimitRef` is a shared reference to a `Compiled<A>` (see `Deref`).
unsafe impl<A: Algorithm> Send for LimitRef<A> where Compiled<A>: Sync {}
// SAFETY: as for `Send`.
unsafe impl<A: Algorithm> Sync for LimitRef<A> where Compiled<A>: Sync {}

impl<A: Algorithm> std::fmt::Debug for LimitRef<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("LimitRef").field(&self.quota).finish()
    }
}

/// The fewest distinct quotas a limiter books: an eighth of its capacity, and at least this.
/// Booked quotas live as long as the limiter, so a source that hands out ever-new quota
/// values would grow the book without end; past the cap a new value is refused.
const MIN_BOOKED_QUOTAS: usize = 1024;

/// Every quota compiled so far, each compiled once and kept for the limiter's life.
pub(crate) struct QuotaBook<A: Algorithm> {
    compiled: Mutex<HashMap<Quota, StableBox<Compiled<A>>>>,
    /// The limiter's own quotas (failsafe, pooled failsafe, unknown-key), each compiled apart
    /// from the source's even when equal in value, so an entry on one is told from an entry
    /// the source gave the same quota (what the pool and `KeyedLimiter::migrate_into` need).
    own: Mutex<Vec<StableBox<Compiled<A>>>>,
    /// The most distinct quotas booked (see [`MIN_BOOKED_QUOTAS`]).
    max: usize,
}

/// Why a quota could not be booked.
#[derive(Debug)]
pub(crate) enum BookError {
    /// The algorithm cannot hold it.
    Quota(QuotaError),
    /// The book holds its most distinct quotas already.
    Full { held: usize },
}

impl<A: Algorithm> QuotaBook<A> {
    /// A book for a limiter of `capacity` keys.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            compiled: Mutex::new(HashMap::new()),
            own: Mutex::new(Vec::new()),
            max: (capacity / 8).max(MIN_BOOKED_QUOTAS),
        }
    }

    /// `quota` compiled, booking it on first use, within the book's bound: for quotas from a
    /// source.
    pub(crate) fn book(&self, algorithm: &A, quota: Quota) -> Result<LimitRef<A>, BookError> {
        let mut compiled = lock(&self.compiled);
        if compiled.len() >= self.max && !compiled.contains_key(&quota) {
            return Err(BookError::Full { held: compiled.len() });
        }
        Self::compile(&mut compiled, algorithm, quota).map_err(BookError::Quota)
    }

    /// `quota` compiled for one of the limiter's own quotas, beyond the bound and apart from
    /// the source's: each call books a new one (a builder makes a handful).
    pub(crate) fn book_own(&self, algorithm: &A, quota: Quota) -> Result<LimitRef<A>, QuotaError> {
        Ok(self.keep_own(Self::compiled(algorithm, quota)?))
    }

    /// `quota` compiled as the pooled failsafe quota: one of the limiter's own, whose checks
    /// always take the slow path (`divert` 0) to draw on the pool.
    pub(crate) fn book_pooled(&self, algorithm: &A, quota: Quota) -> Result<LimitRef<A>, QuotaError> {
        Ok(self.keep_own(Compiled {
            divert: 0,
            pooled: true,
            ..Self::compiled(algorithm, quota)?
        }))
    }

    fn keep_own(&self, compiled: Compiled<A>) -> LimitRef<A> {
        let booked = StableBox::new(compiled);
        let limit = LimitRef(booked.as_non_null());
        lock(&self.own).push(booked);
        limit
    }

    fn compile(
        compiled: &mut HashMap<Quota, StableBox<Compiled<A>>>,
        algorithm: &A,
        quota: Quota,
    ) -> Result<LimitRef<A>, QuotaError> {
        if let Some(booked) = compiled.get(&quota) {
            return Ok(LimitRef(booked.as_non_null()));
        }
        let booked = StableBox::new(Self::compiled(algorithm, quota)?);
        let limit = LimitRef(booked.as_non_null());
        compiled.insert(quota, booked);
        Ok(limit)
    }

    fn compiled(algorithm: &A, quota: Quota) -> Result<Compiled<A>, QuotaError> {
        let params = algorithm.params(&quota)?;
        let horizon = algorithm.horizon(&params);
        Ok(Compiled {
            quota,
            params,
            horizon,
            divert: horizon.saturating_add(1),
            pooled: false,
        })
    }
}
