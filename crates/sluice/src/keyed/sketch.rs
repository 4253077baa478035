//! A small count-min sketch of how often keys were seen recently (TinyLFU's filter).

/// Four 4-bit-range counters per key (held in bytes), halved every `10 × width` additions so
/// the counts follow recent traffic. A key's four counters lie in one 64-byte block (one
/// cache line), one in each quarter of it: a sighting costs one cache miss, not four.
#[derive(Debug)]
pub(crate) struct FrequencySketch {
    blocks: Box<[Block]>,
    mask: usize,
    additions: usize,
    period: usize,
}

#[derive(Debug, Clone, Copy)]
#[repr(align(64))]
struct Block([u8; 64]);

const MAX_COUNT: u8 = 15;

impl FrequencySketch {
    /// A sketch for about `expected` distinct keys.
    pub(crate) fn new(expected: usize) -> Self {
        let width = (expected.max(32) * 2).next_power_of_two();
        let blocks = width / 64;
        Self {
            blocks: vec![Block([0; 64]); blocks].into_boxed_slice(),
            mask: blocks - 1,
            additions: 0,
            period: width * 10,
        }
    }

    /// The key's block, and its counter in each quarter of the block.
    fn slots(&self, hash: u64) -> (usize, [usize; 4]) {
        // The block from the low bits, the counters from four other groups of bits.
        let h = hash.rotate_left(17);
        let block = h as usize & self.mask;
        let at = |quarter: usize| quarter * 16 + ((h >> (32 + 4 * quarter)) & 15) as usize;
        (block, [at(0), at(1), at(2), at(3)])
    }

    /// Starts loading the block of `hash` into the cache (see [`super::shard::prefetch`]).
    pub(crate) fn prefetch(&self, hash: u64) {
        if let Some(block) = self.blocks.get(self.slots(hash).0) {
            super::shard::prefetch(block);
        }
    }

    /// Counts one sighting of `hash` and returns its estimated recent frequency.
    #[inline]
    pub(crate) fn record(&mut self, hash: u64) -> u8 {
        let (block, slots) = self.slots(hash);
        let counters = &mut self.blocks[block].0;
        let min = slots.iter().map(|&i| counters[i]).min().unwrap_or(0);
        if min < MAX_COUNT {
            // Conservative update: raise only the counters at the minimum.
            for &i in &slots {
                if counters[i] == min {
                    counters[i] = min + 1;
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.period {
            self.blocks
                .iter_mut()
                .flat_map(|b| b.0.iter_mut())
                .for_each(|c| *c /= 2);
            self.additions /= 2;
        }
        min.saturating_add(1).min(MAX_COUNT)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.blocks.len() * size_of::<Block>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequent_keys_estimate_higher_than_one_shot_keys() {
        let mut sketch = FrequencySketch::new(1000);
        for _ in 0..10 {
            sketch.record(42);
        }
        for k in 0..500u64 {
            sketch.record(k.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        assert!(sketch.record(42) >= 10);
        assert!(sketch.record(0xDEAD_BEEF_u64.wrapping_mul(0x9E37_79B9_7F4A_7C15)) <= 3);
    }
}
