//! A shard's hash index: from a key's hash to its place in the shard's entry vector.
//!
//! Open addressing with linear probing over one array of `u32` slots, each holding an 8-bit
//! tag from the hash's top bits, the slot's distance from the hash's home slot (4 bits, 15
//! meaning "15 or more") and the entry's position plus one (20 bits; 0 is an empty slot). A
//! lookup reads consecutive slots of one cache line, usually the first, then the entry whose
//! tag matches; a general-purpose table (control bytes apart from the buckets) reads a line
//! more. The table is at most half full, and removal shifts the rest of the run back rather
//! than leaving tombstones, so probes stay short under constant churn (evictions). The stored
//! distance tells the shift where each later slot's home is without reading (and hashing)
//! its entry: an eviction would otherwise take a cache miss per slot it shifts.

/// Entries a shard can index: positions are held in 20 bits.
pub(crate) const MAX_ENTRIES: usize = (1 << 20) - 1;

const POSITION: u32 = (1 << 20) - 1;
const DISTANCE_SHIFT: u32 = 20;
const DISTANCE: u32 = 0xF << DISTANCE_SHIFT;
/// A stored distance of this means "this or more": the home is found by hashing the entry.
const FAR: usize = 15;
const TAG: u32 = 0xFF << 24;
const EMPTY: u32 = 0;

#[derive(Debug, Default)]
pub(crate) struct Index {
    slots: Box<[u32]>,
    len: usize,
}

fn tag(hash: u64) -> u32 {
    ((hash >> 56) as u32) << 24
}

/// `value` with its distance from home set to `distance` (saturating at [`FAR`]).
#[inline]
fn with_distance(value: u32, distance: usize) -> u32 {
    (value & !DISTANCE) | ((distance.min(FAR) as u32) << DISTANCE_SHIFT)
}

fn position_in(value: u32) -> usize {
    (value & POSITION) as usize - 1
}

impl Index {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn home(&self, hash: u64) -> usize {
        hash as usize & self.mask()
    }

    /// The position of the entry with this hash for which `is_it` holds.
    #[inline]
    pub(crate) fn find(&self, hash: u64, mut is_it: impl FnMut(usize) -> bool) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let tag = tag(hash);
        let mut slot = self.home(hash);
        loop {
            let value = self.slots[slot];
            if value == EMPTY {
                return None;
            }
            if value & TAG == tag && is_it(position_in(value)) {
                return Some(position_in(value));
            }
            slot = (slot + 1) & self.mask();
        }
    }

    /// Indexes `position` under `hash` (not indexed yet). `hash_at` gives the hash of the entry
    /// at a position, for rebuilding when the table grows.
    #[inline]
    pub(crate) fn insert(&mut self, hash: u64, position: usize, hash_at: impl Fn(usize) -> u64) {
        debug_assert!(position < MAX_ENTRIES);
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow(&hash_at);
        }
        self.place(hash, position);
        self.len += 1;
    }

    #[inline]
    fn place(&mut self, hash: u64, position: usize) {
        let mut slot = self.home(hash);
        let mut distance = 0;
        while self.slots[slot] != EMPTY {
            slot = (slot + 1) & self.mask();
            distance += 1;
        }
        self.slots[slot] = with_distance(tag(hash) | (position as u32 + 1), distance);
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, hash_at: &impl Fn(usize) -> u64) {
        let size = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; size].into_boxed_slice());
        for value in old.iter().copied().filter(|&v| v != EMPTY) {
            self.place(hash_at(position_in(value)), position_in(value));
        }
    }

    /// Removes the pointer to `position` (indexed under `hash`). Later slots of the run move
    /// back where their own home allows, so no probe ever crosses a hole it should not.
    /// `hash_at` is asked only for a slot [`FAR`] or more from its home.
    pub(crate) fn remove(&mut self, hash: u64, position: usize, hash_at: impl Fn(usize) -> u64) {
        let Some(mut hole) = self.slot_of(hash, position) else {
            return;
        };
        self.len -= 1;
        let mask = self.mask();
        let mut slot = hole;
        loop {
            slot = (slot + 1) & mask;
            let value = self.slots[slot];
            if value == EMPTY {
                break;
            }
            let distance = match ((value & DISTANCE) >> DISTANCE_SHIFT) as usize {
                FAR => slot.wrapping_sub(self.home(hash_at(position_in(value)))) & mask,
                near => near,
            };
            // The value may fill the hole if its home is not strictly between the hole and
            // its slot (cyclically): then a probe from its home still passes the hole.
            let gap = slot.wrapping_sub(hole) & mask;
            if gap <= distance {
                self.slots[hole] = with_distance(value, distance - gap);
                hole = slot;
            }
        }
        self.slots[hole] = EMPTY;
    }

    fn slot_of(&self, hash: u64, position: usize) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let wanted = tag(hash) | (position as u32 + 1);
        let mut slot = self.home(hash);
        loop {
            match self.slots[slot] {
                EMPTY => return None,
                value if value & !DISTANCE == wanted => return Some(slot),
                _ => slot = (slot + 1) & self.mask(),
            }
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.slots.len() * size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Every slot's stored distance is its distance from its home (or `FAR` for farther).
    fn assert_distances(index: &Index, hash_at: impl Fn(usize) -> u64) {
        for (slot, &value) in index.slots.iter().enumerate() {
            if value != EMPTY {
                let distance = slot.wrapping_sub(index.home(hash_at(position_in(value)))) & index.mask();
                let stored = ((value & DISTANCE) >> DISTANCE_SHIFT) as usize;
                assert_eq!(stored, distance.min(FAR), "slot {slot}");
            }
        }
    }

    /// Random inserts and removals against a plain map, with a hash that collides a lot
    /// (few distinct homes), so long runs, wrap-around and back-shifting are exercised.
    #[test]
    fn matches_a_map_under_churn() {
        let hash_of_key = |key: u64| key.wrapping_mul(0x9E37_79B9_7F4A_7C15) & 0xFF00_0000_0000_003F;
        let mut keys: Vec<u64> = Vec::new(); // position -> key
        let mut free: Vec<usize> = Vec::new(); // positions unindexed, to be reused
        let mut model: HashMap<u64, usize> = HashMap::new();
        let mut index = Index::default();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let key = state % 500;
            let hash = hash_of_key(key);
            let found = index.find(hash, |p| keys[p] == key);
            assert_eq!(found, model.get(&key).copied(), "lookup of {key}");
            match found {
                None => {
                    // As the shard does: a place freed by an eviction first, else a new one.
                    let position = free.pop().unwrap_or(keys.len());
                    if position == keys.len() {
                        keys.push(key);
                    } else {
                        keys[position] = key;
                    }
                    index.insert(hash, position, |p| hash_of_key(keys[p]));
                    model.insert(key, position);
                }
                Some(position) if state & 1 == 0 => {
                    index.remove(hash, position, |p| hash_of_key(keys[p]));
                    model.remove(&key);
                    free.push(position);
                }
                Some(_) => {}
            }
            assert_eq!(index.len, model.len());
            assert_distances(&index, |p| hash_of_key(keys[p]));
        }
        for (key, position) in &model {
            assert_eq!(
                index.find(hash_of_key(*key), |p| keys[p] == *key),
                Some(*position)
            );
        }
    }
}
