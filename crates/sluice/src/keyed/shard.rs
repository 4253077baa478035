//! One shard of the keyed store: a table of entries found by hash, bounded, with sampled
//! eviction (idle entries first, then the least frequently used, TinyLFU admission).

use std::sync::atomic::{AtomicU64, Ordering};

use super::book::LimitRef;
use super::sketch::FrequencySketch;
use super::table::Table;
use crate::Algorithm;
use crate::algorithm::succeed;

/// The packed bookkeeping of an entry: recent-use count (bits 0–7), a fetch in flight (bit 8),
/// a quota known from the source (bit 9), how many times the state was replaced (bits 10–19,
/// wrapping), and when it was last fetched (bits 20–63: the clock reading itself, to 2^20 ns
/// ≈ 1 ms). Ages are differences of whole readings, so they never wrap (as 32-bit tick counts
/// they did, every 2^52 ns: a refresh period of 2^52 ns read as 0).
pub(crate) mod meta {
    pub(crate) const FREQUENCY: u64 = 0xFF;
    pub(crate) const FETCHING: u64 = 1 << 8;
    pub(crate) const KNOWN: u64 = 1 << 9;
    const GENERATION_SHIFT: u32 = 10;
    const GENERATION: u64 = 0x3FF << GENERATION_SHIFT;
    pub(crate) const MAX_FREQUENCY: u64 = 15;
    /// The use count of a new entry: the check that brought it in.
    pub(crate) const ONE_USE: u64 = 1;
    /// The bits below the fetch time.
    pub(crate) const LOW: u64 = (1 << 20) - 1;

    pub(crate) fn with_fetched_at(meta: u64, now: u64) -> u64 {
        (meta & LOW) | (now & !LOW)
    }

    /// Nanoseconds (whole 2^20) since the last fetch: negative if `now` was read before the
    /// fetch was applied (a check racing the apply: not due).
    #[inline]
    pub(crate) fn age(meta: u64, now: u64) -> i64 {
        (now & !LOW).wrapping_sub(meta & !LOW) as i64
    }

    /// The bookkeeping of a key that has yet to be fetched: as if fetched `refresh` (a
    /// multiple of 2^20 ns) before `now`, so its next check claims the fetch.
    pub(crate) fn due(now: u64, refresh: u64) -> u64 {
        now.wrapping_sub(refresh) & !LOW
    }

    pub(crate) fn generation(meta: u64) -> u64 {
        (meta & GENERATION) >> GENERATION_SHIFT
    }

    pub(crate) fn next_generation(meta: u64) -> u64 {
        (meta & !GENERATION) | (meta.wrapping_add(1 << GENERATION_SHIFT) & GENERATION)
    }
}

/// One key's limit.
pub(crate) struct Entry<K, A: Algorithm> {
    pub(crate) key: K,
    pub(crate) limit: LimitRef<A>,
    /// Clock reading the state's time is relative to.
    pub(crate) epoch: u64,
    pub(crate) meta: AtomicU64,
    pub(crate) state: A::State,
}

impl<K, A: Algorithm> Entry<K, A> {
    pub(crate) fn new(algorithm: &A, key: K, limit: LimitRef<A>, now: u64, meta: u64) -> Self {
        let state = algorithm.new_state(&limit.params);
        Self {
            key,
            limit,
            epoch: now,
            meta: AtomicU64::new(meta),
            state,
        }
    }

    pub(crate) fn since_epoch(&self, now: u64) -> u64 {
        now.saturating_sub(self.epoch)
    }

    /// Moves the entry to another quota (or the same with a new epoch), carrying consumption.
    pub(crate) fn replace_limit(&mut self, algorithm: &A, limit: LimitRef<A>, now: u64) {
        let since = self.since_epoch(now).min(self.limit.horizon);
        let (shift, state) = succeed(algorithm, &self.limit.params, &self.state, &limit.params, since);
        self.state = state;
        self.epoch += shift;
        self.limit = limit;
        // Receipts of the old state must not name the new one, which may keep the epoch.
        let bits = self.meta.get_mut();
        *bits = meta::next_generation(*bits);
    }

    /// The name receipts give the current state, given the entry's bookkeeping: the epoch plus
    /// the replacement count. A replacement adds one to the count and never moves the epoch
    /// back, so the states of one entry get distinct names (until the count wraps, after 2^10
    /// replacements).
    pub(crate) fn tag(&self, bits: u64) -> u64 {
        self.epoch.wrapping_add(meta::generation(bits))
    }

    /// Counts a use, cheaply: plain stores until the count saturates, then nothing. Returns
    /// the bookkeeping as it now stands.
    #[inline]
    pub(crate) fn touch(&self) -> u64 {
        let m = self.meta.load(Ordering::Relaxed);
        if m & meta::FREQUENCY < meta::MAX_FREQUENCY {
            self.meta.store(m + 1, Ordering::Relaxed);
            return m + 1;
        }
        m
    }

    fn frequency(&self) -> u64 {
        self.meta.load(Ordering::Relaxed) & meta::FREQUENCY
    }

    fn age(&self) {
        let m = self.meta.load(Ordering::Relaxed);
        let f = m & meta::FREQUENCY;
        self.meta
            .store((m & !meta::FREQUENCY) | (f / 2), Ordering::Relaxed);
    }
}

/// A hint to the processor to start loading `value`'s cache line; nothing else happens.
#[inline]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and cannot fault.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// [`prefetch`] of every cache line `value` touches (an entry may straddle two).
#[inline]
pub(crate) fn prefetch_all<T>(value: &T) {
    prefetch(value);
    #[cfg(target_arch = "x86_64")]
    if size_of::<T>() > 1 {
        let last = std::ptr::from_ref(value)
            .cast::<i8>()
            .wrapping_add(size_of::<T>() - 1);
        // SAFETY: as in `prefetch`; the address is computed, never dereferenced.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(last) };
    }
}

/// Where a newcomer goes.
pub(crate) enum Room {
    /// Where its probe ends (if the shard was full, an entry off its path was evicted, and
    /// counted).
    Free,
    /// The entry at this place, on the newcomer's own path, was chosen to go (and counted):
    /// the newcomer takes its place, so nothing else moves.
    Replace(usize),
    /// The newcomer is refused (admission lost to every sampled entry).
    Refused,
}

/// How many entries an eviction looks at.
const SAMPLE: usize = 8;

/// The use count of an entry not used since it was stored (stores count as one use).
const COLD: u64 = 1;

pub(crate) struct Shard<K, A: Algorithm> {
    table: Table<Entry<K, A>>,
    sketch: FrequencySketch,
    capacity: usize,
    /// Entries stored so far: a lookup that missed under the read lock need not look again
    /// under the write lock if this has not moved (nothing else can bring a key in).
    pub(crate) inserts: u64,
    /// Outcomes of `make_room`, counted under the write lock (no shared atomic to bump).
    pub(crate) evicted_idle: u64,
    pub(crate) evicted_frequency: u64,
    pub(crate) refused: u64,
}

impl<K, A: Algorithm> Shard<K, A> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            table: Table::new(capacity),
            sketch: FrequencySketch::new(capacity),
            capacity,
            inserts: 0,
            evicted_idle: 0,
            evicted_frequency: 0,
            refused: 0,
        }
    }

    /// The place of the entry of `key`, if held: valid until the shard next changes.
    #[inline(always)]
    pub(crate) fn find<Q>(&self, hash: u64, key: &Q) -> Option<usize>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.table.find(hash, |entry| entry.key.borrow() == key)
    }

    /// The entry of `key`, if held.
    #[inline(always)]
    pub(crate) fn get<Q>(&self, hash: u64, key: &Q) -> Option<&Entry<K, A>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + ?Sized,
    {
        self.table.lookup(hash, |entry| entry.key.borrow() == key)
    }

    /// The entry of `key`, if held, to change.
    #[inline]
    pub(crate) fn get_mut<Q>(&mut self, hash: u64, key: &Q) -> Option<&mut Entry<K, A>>
    where
        K: std::borrow::Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let at = self.find(hash, key)?;
        self.table.get_mut(at)
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// See [`Table::longest_run`].
    #[cfg(test)]
    pub(crate) fn longest_run(&self) -> (usize, usize) {
        self.table.longest_run()
    }

    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = &Entry<K, A>> {
        self.table.iter()
    }

    pub(crate) fn entries_mut(&mut self) -> impl Iterator<Item = &mut Entry<K, A>> {
        self.table.iter_mut()
    }

    /// Starts loading what making room for a newcomer with hash `hash` reads first that the
    /// lookup which missed has not (its sketch block: the lookup already read the newcomer's
    /// place in the table, where an eviction sample starts), so the miss overlaps the way to
    /// the write lock.
    pub(crate) fn prefetch_room(&self, hash: u64) {
        self.sketch.prefetch(hash);
    }

    /// Makes room for a newcomer with hash `hash`, evicting per the policy if full.
    #[inline]
    pub(crate) fn make_room(
        &mut self,
        algorithm: &A,
        hash: u64,
        now: u64,
        hash_of: impl Fn(&K) -> u64,
    ) -> Room {
        if !self.is_full() {
            return Room::Free;
        }
        // The sample: the entries from the newcomer's own place on. A random place, as the
        // hash is; the one the newcomer's insert reads anyway; and an entry before the first
        // empty place is on the newcomer's path, so the newcomer can take its place outright.
        // (A hand sweeping round the table made each eviction's hole pull the run behind it
        // back past the hand, which then skipped those entries: they outlived their turn,
        // piled up in long runs, and an eviction shifted thousands.)
        let mut victim = None::<(usize, bool, u64)>;
        let mut idle = None;
        for (place, on_path) in self.table.held_from(hash).take(SAMPLE) {
            let Some(entry) = self.table.get(place) else {
                continue;
            };
            let frequency = entry.frequency();
            // An idle entry's state says nothing, but a key in use still carries its fetched
            // quota (evicted, it would start over on the failsafe quota): only an idle entry
            // not used since it came (or aged down to that) goes at once; others compete on
            // frequency below. (The sketch's estimate is no guide here: a flood of one-shot
            // keys inflates it.)
            let since = entry.since_epoch(now).min(entry.limit.horizon);
            if frequency <= COLD && algorithm.is_idle(&entry.limit.params, &entry.state, since) {
                idle = Some((place, on_path));
                break;
            }
            if victim.is_none_or(|(_, _, f)| frequency < f) {
                victim = Some((place, on_path, frequency));
            }
        }
        if let Some((place, on_path)) = idle {
            self.evicted_idle += 1;
            return self.evict(place, on_path, &hash_of);
        }
        let Some((place, on_path, frequency)) = victim else {
            self.refused += 1;
            return Room::Refused;
        };
        // Sightings count only where a newcomer contests a place: one that takes an idle
        // entry's, or a free one, is let in whatever its history (and a flood of one-shot keys
        // through idle places leaves no counts to contest with later).
        let newcomer = u64::from(self.sketch.record(hash));
        if newcomer <= frequency {
            // Survivors of a sample age, so a once-hot key can leave in time.
            for (place, _) in self.table.held_from(hash).take(SAMPLE) {
                if let Some(entry) = self.table.get(place) {
                    entry.age();
                }
            }
            self.refused += 1;
            return Room::Refused;
        }
        self.evicted_frequency += 1;
        self.evict(place, on_path, &hash_of)
    }

    /// Evicts the entry at `place`: left for the newcomer to overwrite if it lies on the
    /// newcomer's path, else removed.
    fn evict(&mut self, place: usize, on_path: bool, hash_of: &impl Fn(&K) -> u64) -> Room {
        if on_path {
            return Room::Replace(place);
        }
        drop(self.table.remove(place, |e| hash_of(&e.key)));
        Room::Free
    }

    /// Whether the shard holds as many entries as it may.
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.capacity
    }

    /// Stores `entry` where `room` says (the caller made room) and returns it where it now
    /// lies.
    #[inline]
    pub(crate) fn insert(
        &mut self,
        room: Room,
        hash: u64,
        entry: Entry<K, A>,
        hash_of: impl Fn(&K) -> u64,
    ) -> &Entry<K, A>
    where
        K: Eq,
    {
        // The slow path skips its second lookup on the `inserts` count: a key stored twice
        // would mean that count missed a way in.
        debug_assert!(self.find(hash, &entry.key).is_none(), "a key is stored once");
        self.inserts += 1;
        match room {
            Room::Replace(place) => self.table.replace(place, hash, entry),
            Room::Free | Room::Refused => {
                debug_assert!(self.len() < self.capacity, "room was made");
                self.table.insert(hash, entry, |e| hash_of(&e.key))
            }
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + self.sketch.heap_bytes()
    }
}
