//! The keyed benchmarks' cases, shared by `keyed` (criterion, one side at a time) and
//! `keyed_paired` (both sides alternately in one process): the limiters on each side, their
//! quota, the key sequences and the checks.
//!
//! Both sides use a token bucket (GCRA) of `1e9/s`, burst 1 000 000, so no check is ever
//! denied: every check is an admitted check that writes its key's state. Keys are `u64`.
//! governor runs twice: on its default hasher (std's SipHash `RandomState`, what its users get)
//! and on sluice's (foldhash's `fast::RandomState`), so that one ratio compares the stores alone.

#![allow(dead_code)] // each bench target uses part of this module

use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::time::Duration;

use criterion::black_box;
use governor::clock::{DefaultClock, FakeRelativeClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use sluice::{KeyedLimiter, ManualClock, MonotonicClock, Quota, StaticQuotas, TokenBucket};

/// The limit of every key: never exhausted by a benchmark loop.
const RATE: u32 = 1_000_000_000;
const BURST: u32 = 1_000_000;
const SLUICE_QUOTA: &str = "1000000000/s burst 1000000";

pub const HOT_KEYS: u64 = 1000;
const RANDOM_KEYS: u64 = 1_000_000;
pub const NEW_KEY_CAPACITY: usize = 100_000;
/// governor sweeps its map (`retain_recent`) once per this many new keys.
const GOVERNOR_RETAIN_EVERY: u64 = 100_000;
/// The manual clocks' step per check in `new_key`.
const NEW_KEY_STEP: Duration = Duration::from_micros(1);

pub type Sluice<C = MonotonicClock> = KeyedLimiter<u64, TokenBucket, StaticQuotas<u64>, C>;
pub type Governor<C = DefaultClock, S = SipHash> = governor::RateLimiter<
    u64,
    DashMapStateStore<u64, S>,
    C,
    NoOpMiddleware<<C as governor::clock::Clock>::Instant>,
>;

/// governor's default hasher.
pub type SipHash = std::hash::RandomState;
/// sluice's hasher, given to governor for the equal-hasher comparison.
pub type FoldHash = foldhash::quality::RandomState;

pub fn sluice_on<C: sluice::Clock + 'static>(capacity: usize, clock: C) -> Sluice<C> {
    let quota: Quota = SLUICE_QUOTA.parse().expect("valid quota");
    KeyedLimiter::builder(TokenBucket, quota)
        .capacity(capacity)
        .unknown_key_quota(quota)
        .clock(clock)
        .build()
        .expect("valid quota")
}

pub fn governor_on<C: governor::clock::Clock, S: BuildHasher + Default + Clone>(clock: C) -> Governor<C, S> {
    let quota = governor::Quota::per_second(nonzero(RATE)).allow_burst(nonzero(BURST));
    governor::RateLimiter::dashmap_with_clock_and_hasher(quota, clock, S::default())
}

fn nonzero(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("rates are positive")
}

pub fn sluice_check<C: sluice::Clock + 'static>(limiter: &Sluice<C>, key: u64) -> bool {
    black_box(black_box(limiter).check(&black_box(key))).is_allowed()
}

pub fn governor_check<C: governor::clock::Clock, S: BuildHasher + Clone>(
    limiter: &Governor<C, S>,
    key: u64,
) -> bool {
    black_box(black_box(limiter).check_key(&black_box(key))).is_ok()
}

/// The single-thread cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// 1000 keys, cycled in order; all present after the first round.
    Hot1k,
    /// 1 000 000 keys, all inserted before measuring, then chosen uniformly at random (the
    /// same sequence on both sides). sluice's capacity is 2 000 000: with exactly 1 000 000
    /// the uneven fill of its shards would evict some keys.
    Random1m,
    /// A key never seen before on every check. sluice has capacity 100 000, so once full
    /// every check also evicts (an idle entry: at `1e9/s` a used bucket is full again within
    /// a microsecond). governor's map grows without bound, so it calls `retain_recent` every
    /// 100 000 checks (inside the measurement). Manual clocks advance 1 µs per check.
    NewKey,
}

impl Case {
    pub const ALL: [Case; 3] = [Case::Hot1k, Case::Random1m, Case::NewKey];

    pub fn name(self) -> &'static str {
        match self {
            Case::Hot1k => "hot_1k",
            Case::Random1m => "random_1m",
            Case::NewKey => "new_key",
        }
    }

    fn keys(self) -> Keys {
        match self {
            Case::Hot1k => Keys::Cycle(Cycle::new(HOT_KEYS)),
            Case::Random1m => Keys::Random(Random::new(RANDOM_KEYS)),
            // Past the keys stored while filling (see `SluiceCase::new`).
            Case::NewKey => Keys::Fresh(2 * NEW_KEY_CAPACITY as u64),
        }
    }
}

/// A case's key sequence.
enum Keys {
    Cycle(Cycle),
    Random(Random),
    Fresh(u64),
}

impl Keys {
    fn next(&mut self) -> u64 {
        match self {
            Keys::Cycle(cycle) => cycle.next(),
            Keys::Random(random) => random.next(),
            Keys::Fresh(next) => {
                *next += 1;
                *next
            }
        }
    }
}

/// `0, 1, ..., n - 1, 0, 1, ...` without a division.
pub struct Cycle {
    next: u64,
    n: u64,
}

impl Cycle {
    pub fn new(n: u64) -> Self {
        Self { next: 0, n }
    }

    pub fn next(&mut self) -> u64 {
        let key = self.next;
        self.next += 1;
        if self.next == self.n {
            self.next = 0;
        }
        key
    }
}

/// Uniform keys in `0..n` from xorshift64 (fixed seed, so both sides see the same sequence).
struct Random {
    state: u64,
    n: u64,
}

impl Random {
    fn new(n: u64) -> Self {
        Self {
            state: 0x9E37_79B9_7F4A_7C15,
            n,
        }
    }

    fn next(&mut self) -> u64 {
        let mut x = self.state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.state = x;
        // The top 32 bits scaled to 0..n (n < 2^32), without a division.
        ((x >> 32) * self.n) >> 32
    }
}

/// Advances a manual clock by [`NEW_KEY_STEP`] (the real clocks advance by themselves).
pub trait Step {
    fn step(&self) {}
}

impl Step for MonotonicClock {}
impl Step for DefaultClock {}

impl Step for ManualClock {
    fn step(&self) {
        self.advance(NEW_KEY_STEP);
    }
}

impl Step for FakeRelativeClock {
    fn step(&self) {
        self.advance(NEW_KEY_STEP);
    }
}

/// One side of a case, set up (and asserted) as the case says.
pub trait Side {
    /// One check of the case's next key; whether it was admitted.
    fn check(&mut self) -> bool;
    /// Asserts what the case promises once measured (a new-key store stays bounded).
    fn verify(&self);
}

/// A case on sluice's side.
pub struct SluiceCase<C: sluice::Clock + 'static> {
    limiter: Sluice<C>,
    clock: C,
    keys: Keys,
}

impl<C: sluice::Clock + Step + Clone + 'static> SluiceCase<C> {
    pub fn new(case: Case, clock: C) -> Self {
        let capacity = match case {
            Case::Random1m => 2 * RANDOM_KEYS as usize,
            Case::Hot1k | Case::NewKey => NEW_KEY_CAPACITY,
        };
        let limiter = sluice_on(capacity, clock.clone());
        match case {
            Case::Hot1k => {}
            Case::Random1m => {
                for key in 0..RANDOM_KEYS {
                    assert!(limiter.check(&key).is_allowed());
                }
                assert_eq!(limiter.metrics().entries, RANDOM_KEYS, "sluice holds every key");
            }
            Case::NewKey => {
                // Full, so that every new key evicts one.
                for key in 0..2 * NEW_KEY_CAPACITY as u64 {
                    clock.step();
                    assert!(limiter.check(&key).is_allowed());
                }
            }
        }
        Self {
            limiter,
            clock,
            keys: case.keys(),
        }
    }
}

impl<C: sluice::Clock + Step + Clone + 'static> Side for SluiceCase<C> {
    #[inline]
    fn check(&mut self) -> bool {
        if let Keys::Fresh(_) = self.keys {
            self.clock.step();
        }
        sluice_check(&self.limiter, self.keys.next())
    }

    fn verify(&self) {
        if let Keys::Fresh(_) = self.keys {
            let metrics = self.limiter.metrics();
            assert!(
                metrics.entries <= NEW_KEY_CAPACITY as u64 && metrics.evicted_idle > 0,
                "sluice stays bounded by evicting: {metrics:?}"
            );
        }
    }
}

/// A case on governor's side, with hasher `S`.
pub struct GovernorCase<C: governor::clock::Clock, S: BuildHasher + Clone = SipHash> {
    limiter: Governor<C, S>,
    clock: C,
    keys: Keys,
}

impl<C: governor::clock::Clock + Step + Clone, S: BuildHasher + Default + Clone> GovernorCase<C, S> {
    pub fn new(case: Case, clock: C) -> Self {
        let limiter = governor_on(clock.clone());
        if case == Case::Random1m {
            for key in 0..RANDOM_KEYS {
                assert!(limiter.check_key(&key).is_ok());
            }
            assert_eq!(limiter.len(), RANDOM_KEYS as usize, "governor holds every key");
        }
        let keys = match case {
            // governor starts empty: its map is swept, not full.
            Case::NewKey => Keys::Fresh(0),
            _ => case.keys(),
        };
        Self { limiter, clock, keys }
    }
}

impl<C: governor::clock::Clock + Step + Clone, S: BuildHasher + Clone> Side for GovernorCase<C, S> {
    #[inline]
    fn check(&mut self) -> bool {
        if let Keys::Fresh(next) = self.keys {
            self.clock.step();
            // Unbounded map: swept every 100 000 new keys, the sweep inside the measurement.
            if (next + 1) % GOVERNOR_RETAIN_EVERY == 0 {
                self.limiter.retain_recent();
            }
        }
        governor_check(&self.limiter, self.keys.next())
    }

    fn verify(&self) {
        if let Keys::Fresh(_) = self.keys {
            assert!(
                self.limiter.len() <= GOVERNOR_RETAIN_EVERY as usize,
                "governor's sweep keeps it bounded"
            );
        }
    }
}
