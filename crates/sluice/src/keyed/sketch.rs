//! A small count-min sketch of how often keys were seen recently (TinyLFU's filter).

/// Four 4-bit-range counters per key (held in bytes), halved every `10 × width` additions so
/// the counts follow recent traffic.
#[derive(Debug)]
pub(crate) struct FrequencySketch {
    counters: Box<[u8]>,
    mask: usize,
    additions: usize,
    period: usize,
}

const MAX_COUNT: u8 = 15;

impl FrequencySketch {
    /// A sketch for about `expected` distinct keys.
    pub(crate) fn new(expected: usize) -> Self {
        let width = (expected.max(16) * 2).next_power_of_two();
        Self {
            counters: vec![0; width].into_boxed_slice(),
            mask: width - 1,
            additions: 0,
            period: width * 10,
        }
    }

    fn slots(&self, hash: u64) -> [usize; 4] {
        // Four indexes from different bits of a well-mixed hash, spread by odd multipliers.
        let h = hash.rotate_left(17);
        [
            h as usize & self.mask,
            (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask,
            (h.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) >> 29) as usize & self.mask,
            (h.wrapping_mul(0x1656_67B1_9E37_79F9) >> 23) as usize & self.mask,
        ]
    }

    /// Counts one sighting of `hash` and returns its estimated recent frequency.
    pub(crate) fn record(&mut self, hash: u64) -> u8 {
        let slots = self.slots(hash);
        let min = slots.iter().map(|&i| self.counters[i]).min().unwrap_or(0);
        if min < MAX_COUNT {
            // Conservative update: raise only the counters at the minimum.
            for &i in &slots {
                if self.counters[i] == min {
                    self.counters[i] = min + 1;
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.period {
            self.counters.iter_mut().for_each(|c| *c /= 2);
            self.additions /= 2;
        }
        min.saturating_add(1).min(MAX_COUNT)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.counters.len()
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
