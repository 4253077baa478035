//! A shard's table: entries stored in place, found from their key's hash by linear probing.
//!
//! Beside the slots lies one control byte per slot: empty (0), or occupied with the slot's
//! distance from the hash's home slot (2 bits, 3 meaning "3 or more") and a 5-bit tag from the
//! hash. A lookup reads the control bytes from the home slot on, and an entry only where the
//! tag matches; the entry's place follows from the hash alone, so its read is not held up by
//! the control byte's (an index of positions into a vector of entries makes the second read
//! wait for the first, and at a million keys both miss the cache). The control bytes, one per
//! slot, are small enough to stay in the cache where the entries cannot.
//!
//! The table is at most [`MAX_LOAD`] full. Removal shifts the rest of the run back rather than
//! leaving tombstones, so probes stay short under constant churn (evictions); the stored
//! distance tells the shift where a later slot's home is without hashing its key (a key that
//! is not a plain number may sit behind a pointer).
//!
//! Slots are numbered `0..n` for any `n` (not only powers of two): a full table of a given
//! capacity takes no more than it needs. Home slots come from the hash's high bits by a
//! multiply-shift; tags from its low bits. Probes read the control bytes eight at a time, as
//! one word (the first eight are repeated after the last, so a word may run past the end).

use super::pages::Slots;
use super::shard::prefetch_all;

/// The most entries one shard's table holds: a growing table is rebuilt under its shard's
/// write lock, so a larger capacity takes more shards rather than longer pauses.
pub(crate) const MAX_ENTRIES: usize = 1 << 20;

/// The fullest the table gets: 4 entries in 5 slots.
const MAX_LOAD: (usize, usize) = (4, 5);

const OCCUPIED: u8 = 0x80;
const DISTANCE_SHIFT: u32 = 5;
const DISTANCE: u8 = 0b11 << DISTANCE_SHIFT;
/// A stored distance of this means "this or more": the home is found by hashing the entry.
const FAR: usize = 3;
const TAG: u8 = 0x1F;
const EMPTY: u8 = 0;

/// The smallest table allocated at the first insert.
const MIN_SLOTS: usize = 16;
/// Control bytes read at once (a word), and so the fewest slots a table has.
const GROUP: usize = 8;
const LOW_BITS: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` that is zero, and maybe of some bytes above a zero
/// byte (a borrow): exact up to and including the lowest zero byte.
#[inline]
fn zero_bytes(word: u64) -> u64 {
    word.wrapping_sub(LOW_BITS) & !word & HIGH_BITS
}

/// The number of the byte whose high bit is the lowest set in `mask`.
#[inline]
fn first_byte(mask: u64) -> usize {
    mask.trailing_zeros() as usize / 8
}

/// The bytes of `mask` below byte `n`, for `n` from 1 to 8.
#[inline]
fn below(mask: u64, n: usize) -> u64 {
    mask & (u64::MAX >> (64 - 8 * n))
}

pub(crate) struct Table<E> {
    /// One byte per slot, then the first [`GROUP`] again.
    ctrl: Box<[u8]>,
    slots: Slots<Option<E>>,
    len: usize,
    /// The most slots the table grows to: enough for its capacity at [`MAX_LOAD`].
    max_slots: usize,
}

#[inline]
fn control(hash: u64, distance: usize) -> u8 {
    OCCUPIED | ((distance.min(FAR) as u8) << DISTANCE_SHIFT) | (hash as u8 & TAG)
}

#[inline]
fn with_distance(ctrl: u8, distance: usize) -> u8 {
    (ctrl & !DISTANCE) | ((distance.min(FAR) as u8) << DISTANCE_SHIFT)
}

#[inline]
fn distance_of(ctrl: u8) -> usize {
    ((ctrl & DISTANCE) >> DISTANCE_SHIFT) as usize
}

impl<E> Table<E> {
    /// An empty table that will hold up to `capacity` entries (it allocates as they come).
    pub(crate) fn new(capacity: usize) -> Self {
        let (num, den) = MAX_LOAD;
        Self {
            ctrl: Box::default(),
            slots: Slots::default(),
            len: 0,
            max_slots: capacity.saturating_mul(den).div_ceil(num).max(capacity + 1),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The control bytes of `slot` and the seven after it (round the table), byte `i` of the
    /// word being slot `slot + i`'s.
    #[inline(always)]
    fn group(&self, slot: usize) -> u64 {
        let mut bytes = [0u8; GROUP];
        bytes.copy_from_slice(&self.ctrl[slot..slot + GROUP]);
        u64::from_le_bytes(bytes)
    }

    fn set_ctrl(&mut self, slot: usize, ctrl: u8) {
        self.ctrl[slot] = ctrl;
        if slot < GROUP {
            let n = self.slot_count();
            self.ctrl[n + slot] = ctrl;
        }
    }

    /// `slot + by` round the table (`by` at most the table's size).
    #[inline(always)]
    fn ahead(&self, slot: usize, by: usize) -> usize {
        let n = self.slot_count();
        let to = slot + by;
        if to >= n { to - n } else { to }
    }

    /// The place a probe for `hash` starts from.
    #[inline(always)]
    pub(crate) fn home(&self, hash: u64) -> usize {
        ((u128::from(hash) * self.slot_count() as u128) >> 64) as usize
    }

    #[inline]
    fn next(&self, slot: usize) -> usize {
        if slot + 1 == self.slot_count() {
            0
        } else {
            slot + 1
        }
    }

    /// `to - from`, counted forward round the table.
    #[inline]
    fn gap(&self, from: usize, to: usize) -> usize {
        if to >= from {
            to - from
        } else {
            to + self.slot_count() - from
        }
    }

    /// The place of the entry with this hash for which `is_it` holds.
    #[inline(always)]
    pub(crate) fn find(&self, hash: u64, is_it: impl FnMut(&E) -> bool) -> Option<usize> {
        self.probe(hash, is_it).map(|(slot, _)| slot)
    }

    /// The entry with this hash for which `is_it` holds.
    #[inline(always)]
    pub(crate) fn lookup(&self, hash: u64, is_it: impl FnMut(&E) -> bool) -> Option<&E> {
        self.probe(hash, is_it).map(|(_, entry)| entry)
    }

    #[inline(always)]
    fn probe(&self, hash: u64, mut is_it: impl FnMut(&E) -> bool) -> Option<(usize, &E)> {
        if self.len == 0 {
            return None;
        }
        let mut slot = self.home(hash);
        // The entry most likely sits at home: its read starts beside the control byte's, and
        // is looked at before any word of control bytes is.
        prefetch_all(&self.slots[slot]);
        let tag = OCCUPIED | (hash as u8 & TAG);
        if self.ctrl[slot] & (OCCUPIED | TAG) == tag
            && let Some(entry) = &self.slots[slot]
            && is_it(entry)
        {
            return Some((slot, entry));
        }
        let wanted = LOW_BITS * u64::from(tag);
        loop {
            let group = self.group(slot);
            let empties = zero_bytes(group);
            // Every bit below the first empty place's (all of them if none).
            let before_empty = (empties & empties.wrapping_neg()).wrapping_sub(1);
            let mut matches =
                zero_bytes((group & (LOW_BITS * u64::from(OCCUPIED | TAG))) ^ wanted) & before_empty;
            while matches != 0 {
                let at = self.ahead(slot, first_byte(matches));
                if let Some(entry) = &self.slots[at]
                    && is_it(entry)
                {
                    return Some((at, entry));
                }
                matches &= matches - 1;
            }
            if empties != 0 {
                return None;
            }
            slot = self.ahead(slot, GROUP);
        }
    }

    /// The entry at `slot`, a place [`Self::find`] gave since the last change.
    #[inline]
    pub(crate) fn get(&self, slot: usize) -> Option<&E> {
        self.slots.get(slot).and_then(Option::as_ref)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, slot: usize) -> Option<&mut E> {
        self.slots.get_mut(slot).and_then(Option::as_mut)
    }

    /// Stores `entry` under `hash` (not stored yet) and returns it where it now lies. `hash_of` gives an
    /// entry's hash, for rebuilding when the table grows. The caller keeps the length within
    /// the capacity the table was made for.
    #[inline]
    pub(crate) fn insert(&mut self, hash: u64, entry: E, hash_of: impl Fn(&E) -> u64) -> &mut E {
        let (num, den) = MAX_LOAD;
        let slots = self.slot_count();
        if (self.len + 1) * den > slots * num && slots < self.max_slots || self.len + 1 >= slots {
            self.grow(&hash_of);
        }
        self.len += 1;
        self.place(hash, entry)
    }

    #[inline]
    fn place(&mut self, hash: u64, entry: E) -> &mut E {
        let home = self.home(hash);
        let mut distance = 0;
        let slot = loop {
            let empties = zero_bytes(self.group(self.ahead(home, distance)));
            if empties != 0 {
                distance += first_byte(empties);
                break self.ahead(home, distance);
            }
            distance += GROUP;
        };
        self.set_ctrl(slot, control(hash, distance));
        self.slots[slot].insert(entry)
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, hash_of: &impl Fn(&E) -> u64) {
        let size = (self.slot_count() * 2)
            .max(MIN_SLOTS)
            .min(self.max_slots.max(self.len + 2))
            .max(GROUP);
        self.ctrl = vec![EMPTY; size + GROUP].into_boxed_slice();
        let mut old = std::mem::replace(&mut self.slots, Slots::new(size));
        for entry in old.iter_mut().filter_map(Option::take) {
            self.place(hash_of(&entry), entry);
        }
    }

    /// Takes the entry at `slot` out. Later slots of the run move back where their own home
    /// allows, so no probe ever crosses a hole it should not. `hash_of` is asked only for an
    /// entry [`FAR`] or more from its home.
    pub(crate) fn remove(&mut self, slot: usize, hash_of: impl Fn(&E) -> u64) -> Option<E> {
        let removed = self.slots.get_mut(slot)?.take()?;
        self.len -= 1;
        let mut hole = slot;
        let mut next = self.next(hole);
        loop {
            let ctrl = self.ctrl[next];
            if ctrl == EMPTY {
                break;
            }
            let distance = match distance_of(ctrl) {
                FAR => match &self.slots[next] {
                    Some(entry) => self.gap(self.home(hash_of(entry)), next),
                    None => 0,
                },
                near => near,
            };
            // The entry may fill the hole if its home is not strictly between the hole and its
            // slot (cyclically): then a probe from its home still passes the hole.
            let gap = self.gap(hole, next);
            if gap <= distance {
                self.set_ctrl(hole, with_distance(ctrl, distance - gap));
                self.slots[hole] = self.slots[next].take();
                hole = next;
            }
            next = self.next(next);
        }
        self.set_ctrl(hole, EMPTY);
        Some(removed)
    }

    /// The places of the entries from `hash`'s home on, round the table once, each with
    /// whether it lies on the path of a probe for `hash` (before the first empty place).
    pub(crate) fn held_from(&self, hash: u64) -> HeldFrom<'_, E> {
        let mut held = HeldFrom {
            table: self,
            base: 0,
            looked: 0,
            held: 0,
            first_empty: GROUP,
            on_path: true,
            left: self.slot_count(),
        };
        if self.len > 0 {
            held.load(self.home(hash));
        }
        held
    }

    /// Puts `entry` of `hash` in the place of the entry at `slot`, which lies on the path of a
    /// probe for `hash` (no empty place between its home and `slot`), and drops the old one.
    pub(crate) fn replace(&mut self, slot: usize, hash: u64, entry: E) -> &mut E {
        let distance = self.gap(self.home(hash), slot);
        debug_assert!(self.slots[slot].is_some(), "the place is held");
        self.set_ctrl(slot, control(hash, distance));
        self.slots[slot].insert(entry)
    }

    /// The most places held in a row (round the table), and the table's size.
    #[cfg(test)]
    pub(crate) fn longest_run(&self) -> (usize, usize) {
        let n = self.slot_count();
        let (mut longest, mut run) = (0, 0);
        for slot in 0..2 * n {
            run = if self.ctrl[slot % n] == EMPTY { 0 } else { run + 1 };
            longest = longest.max(run.min(n));
        }
        (longest, n)
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &E> {
        self.slots.iter().flatten()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut E> {
        self.slots.iter_mut().flatten()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.ctrl.len() + self.slot_count() * size_of::<Option<E>>()
    }
}

/// See [`Table::held_from`].
pub(crate) struct HeldFrom<'a, E> {
    table: &'a Table<E>,
    /// The first place of the word in hand, and how many of its bytes count.
    base: usize,
    looked: usize,
    /// The word's bytes of held places not yet given.
    held: u64,
    /// The word's first empty place, as a byte number ([`GROUP`] for none).
    first_empty: usize,
    /// No empty place was met before this word.
    on_path: bool,
    /// Places not yet put in a word: once round the table at most.
    left: usize,
}

impl<E> HeldFrom<'_, E> {
    fn load(&mut self, base: usize) {
        let word = self.table.group(base);
        self.looked = self.left.min(GROUP);
        self.left -= self.looked;
        self.base = base;
        self.held = below(word & HIGH_BITS, self.looked);
        let empties = below(zero_bytes(word), self.looked);
        self.first_empty = if empties == 0 { GROUP } else { first_byte(empties) };
    }
}

impl<E> Iterator for HeldFrom<'_, E> {
    type Item = (usize, bool);

    #[inline]
    fn next(&mut self) -> Option<(usize, bool)> {
        loop {
            if self.held != 0 {
                let byte = first_byte(self.held);
                self.held &= self.held - 1;
                return Some((
                    self.table.ahead(self.base, byte),
                    self.on_path && byte < self.first_empty,
                ));
            }
            if self.left == 0 {
                return None;
            }
            self.on_path &= self.first_empty == GROUP;
            let next = self.table.ahead(self.base, self.looked);
            self.load(next);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Every occupied slot's stored distance is its distance from home (or `FAR` for
    /// farther), every run from a home to its entry is unbroken, and the length is right.
    fn assert_sound(table: &Table<u64>, hash_of: impl Fn(&u64) -> u64) {
        let mut held = 0;
        for slot in 0..table.slot_count() {
            let ctrl = table.ctrl[slot];
            match &table.slots[slot] {
                None => assert_eq!(ctrl, EMPTY, "slot {slot}"),
                Some(key) => {
                    held += 1;
                    let hash = hash_of(key);
                    let home = table.home(hash);
                    let distance = table.gap(home, slot);
                    assert_eq!(ctrl, control(hash, distance), "slot {slot}");
                    let mut at = home;
                    while at != slot {
                        assert_ne!(table.ctrl[at], EMPTY, "a hole between {key}'s home and slot");
                        at = table.next(at);
                    }
                }
            }
        }
        assert_eq!(held, table.len);
        let n = table.slot_count();
        if n > 0 {
            assert_eq!(table.ctrl[n..], table.ctrl[..GROUP], "the mirrored control bytes");
        }
    }

    /// Consecutive numbers as keys, hashed as the keyed store hashes them, fill a table 4/5
    /// full with runs no longer than random keys make (about 300 of 5 120 places at most), for
    /// every seed tried. (foldhash's fast hasher alone made runs of 600 to 1 800 for about one
    /// seed in sixty.)
    #[test]
    fn consecutive_numbers_spread_like_random_keys_for_any_seed() {
        use std::hash::{Hash, Hasher};
        for seed in 0..300u64 {
            let shared = foldhash::SharedSeed::from_u64(seed);
            let hash_of = |key: &u64| {
                let mut hasher = super::super::seeded_key_hasher(seed.rotate_left(29), &shared);
                key.hash(&mut hasher);
                hasher.finish()
            };
            let mut table = Table::new(4096);
            for key in 0..4096u64 {
                table.insert(hash_of(&key), key, hash_of);
            }
            let (longest, slots) = table.longest_run();
            assert!(
                longest * 8 < slots,
                "seed {seed}: a run of {longest} places in {slots}"
            );
        }
    }

    /// Random inserts and removals against a plain map, with a hash that collides a lot
    /// (few distinct homes, few tags), so long runs, wrap-around, far distances and
    /// back-shifting are exercised, through growth up to the capacity, and then replacing
    /// entries in place.
    #[test]
    fn matches_a_map_under_churn() {
        let hash_of = |key: &u64| (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) & 0xF800_0000_0000_0083) | 1;
        let mut model: HashMap<u64, usize> = HashMap::new();
        const CAPACITY: usize = 300;
        let mut table = Table::new(CAPACITY);
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..100_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = state % 500;
            let hash = hash_of(&key);
            let found = table.find(hash, |k| *k == key);
            assert_eq!(found.is_some(), model.contains_key(&key), "lookup of {key}");
            if let Some(slot) = found {
                assert_eq!(table.get(slot), Some(&key));
            }
            match found {
                // A full table: the newcomer takes the place of an entry on its path, if the
                // sample has one (as an eviction does).
                None if model.len() == CAPACITY => {
                    let sample: Vec<(usize, bool)> = table.held_from(hash).take(8).collect();
                    assert_eq!(sample.len(), 8);
                    let mut on_path = true;
                    let mut at = table.home(hash);
                    for &(place, said) in &sample {
                        assert!(table.get(place).is_some(), "sampled places are held");
                        // Every place from home to this one, round the table, held or not.
                        while at != place {
                            on_path &= table.ctrl[at] != EMPTY;
                            at = table.next(at);
                        }
                        assert_eq!(said, on_path, "place {place} on the path");
                        at = table.next(at);
                    }
                    let on_path: Vec<usize> = sample
                        .iter()
                        .filter(|(_, on)| *on)
                        .map(|(place, _)| *place)
                        .collect();
                    if !on_path.is_empty() {
                        let place = on_path[(state >> 8) as usize % on_path.len()];
                        let Some(&old) = table.get(place) else {
                            unreachable!()
                        };
                        assert_eq!(*table.replace(place, hash, key), key);
                        model.remove(&old);
                        model.insert(key, 0);
                    }
                }
                None => {
                    assert_eq!(*table.insert(hash, key, hash_of), key);
                    model.insert(key, 0);
                }
                Some(slot) if state & 1 == 0 => {
                    assert_eq!(table.remove(slot, hash_of), Some(key));
                    model.remove(&key);
                }
                _ => {}
            }
            assert_sound(&table, hash_of);
            assert!(table.slot_count() <= table.max_slots);
        }
        let mut held: Vec<u64> = table.iter().copied().collect();
        held.sort_unstable();
        let mut expected: Vec<u64> = model.keys().copied().collect();
        expected.sort_unstable();
        assert_eq!(held, expected);
    }

    /// A full table of a given capacity takes no more slots than its load allows.
    #[test]
    fn a_full_table_is_at_most_four_fifths_full_and_no_bigger() {
        for capacity in [1, 2, 7, 100, 1000, 4096] {
            let mut table = Table::new(capacity);
            for key in 0..capacity as u64 {
                let hash = key.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                table.insert(hash, key, |k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            }
            assert_eq!(table.len(), capacity);
            assert!(
                table.slot_count() <= (capacity * 5).div_ceil(4).max(capacity + 2).max(GROUP),
                "{capacity}"
            );
            for key in 0..capacity as u64 {
                assert!(
                    table
                        .find(key.wrapping_mul(0x9E37_79B9_7F4A_7C15), |k| *k == key)
                        .is_some()
                );
            }
        }
    }
}
