//! What a keyed limiter costs in memory, measured by a counting global allocator.
//!
//! Run with `cargo run --release -p sluice --example keyed_memory`.
//!
//! 1. **Bytes per entry.** A `KeyedLimiter` (token bucket, capacity 1 000 000, unknown keys get
//!    `10/s` so every key is stored) is given 1 000 000 distinct keys of exactly 32 bytes. The
//!    allocator's live bytes after, minus before (so the limiter's tables, sketch and keys),
//!    minus the stored keys' own heap bytes (32 each), divided by the number of entries, is the
//!    cost of an entry beyond its key's text: `bytes_per_entry`. It is measured with `Box<str>`
//!    keys (16 bytes inline) and `String` keys (24 bytes inline), and set beside the limiter's
//!    own estimate, `heap_bytes()` per entry. The target is at most 64 bytes plus the key.
//!    Shards fill unevenly, so a few keys arrive at a full shard and are refused or replace
//!    another (on the frozen clock nothing is idle): the tables are those of a full capacity
//!    of 1 000 000, divided among the slightly fewer entries held.
//! 2. **A flood of one-shot keys.** Capacity 100 000; 10 000 000 distinct `u64` keys arrive
//!    while 100 hot keys keep requesting (one hot request after every 10 flood keys), on a
//!    manual clock advanced by 1 µs per flood key (a 1M keys/s flood for 10 simulated
//!    seconds). `peak_bytes` is the allocator's peak during the run minus its live bytes
//!    before the limiter was built; the metrics show how the flood was turned away.
//!
//! Both runs use a [`ManualClock`], so they are deterministic and take no real time beyond the
//! checks themselves.

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice::{KeyedLimiter, KeyedMetrics, ManualClock, Quota, TokenBucket};

/// Wraps the system allocator, counting live bytes and their peak.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

fn shrank(by: usize) {
    CURRENT.fetch_sub(by, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; only counters are updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

/// Restarts the peak from the bytes live now, and returns them.
fn reset_peak() -> usize {
    let now = live_bytes();
    PEAK.store(now, Ordering::Relaxed);
    now
}

const KEYS: usize = 1_000_000;
const KEY_LEN: usize = 32;

/// Key `i`: its decimal digits, zero-padded to exactly [`KEY_LEN`] bytes.
fn key_text(i: usize) -> String {
    let key = format!("{i:032}");
    debug_assert_eq!(key.len(), KEY_LEN);
    key
}

/// Per-entry figures of run 1 for one key type.
struct EntryCost {
    entries: u64,
    refused: u64,
    evicted: u64,
    bytes_per_entry: f64,
    heap_bytes_per_entry: f64,
    /// The process's memory on transparent huge pages with the limiter full (Linux).
    huge_pages_kib: Option<u64>,
}

/// `AnonHugePages` of this process, from `/proc/self/smaps_rollup` (Linux only).
fn huge_pages_kib() -> Option<u64> {
    let rollup = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = rollup.lines().find(|line| line.starts_with("AnonHugePages:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Stores [`KEYS`] keys of [`KEY_LEN`] bytes in a limiter keyed by `K` and measures an entry.
fn entry_cost<K>() -> Result<EntryCost, Box<dyn Error>>
where
    K: std::borrow::Borrow<str> + From<String> + std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    let before = live_bytes();
    let limiter = KeyedLimiter::<K, _>::builder(TokenBucket, "10/s".parse()?)
        .capacity(KEYS)
        .unknown_key_quota("10/s".parse()?)
        .clock(ManualClock::new(0))
        .build()?;
    for i in 0..KEYS {
        // The limiter stores its own copy of the key (exactly 32 bytes); ours is dropped.
        let key = key_text(i);
        assert!(limiter.check(key.as_str()).is_allowed());
    }
    let after = live_bytes();
    // Shards fill unevenly, so a few keys find theirs full: refused, or replacing another.
    let metrics = limiter.metrics();
    let entries = metrics.entries;
    let beyond_keys = (after - before) as f64 - (entries as usize * KEY_LEN) as f64;
    let cost = EntryCost {
        entries,
        refused: metrics.refused,
        evicted: metrics.evicted_idle + metrics.evicted_frequency,
        bytes_per_entry: beyond_keys / entries as f64,
        heap_bytes_per_entry: limiter.heap_bytes() as f64 / entries as f64,
        huge_pages_kib: huge_pages_kib(),
    };
    drop(limiter);
    Ok(cost)
}

fn print_entry_cost(label: &str, size_of_key: usize, cost: &EntryCost) {
    println!(
        "  {label:<9} (key inline {size_of_key:>2} B): bytes_per_entry: {:.1}   heap_bytes()/entries: {:.1}   entries: {} (refused {}, evicted {})   on huge pages: {}",
        cost.bytes_per_entry,
        cost.heap_bytes_per_entry,
        cost.entries,
        cost.refused,
        cost.evicted,
        cost.huge_pages_kib
            .map_or("unknown".to_string(), |kib| format!("{kib} KiB")),
    );
}

const FLOOD_KEYS: u64 = 10_000_000;
const FLOOD_CAPACITY: usize = 100_000;
const HOT_KEYS: u64 = 100;
/// One hot request after this many flood keys.
const HOT_EVERY: u64 = 10;
/// Flood keys start here, far from the hot keys `0..HOT_KEYS`.
const FLOOD_BASE: u64 = 1 << 40;

/// Run 2: the flood of one-shot keys against 100 hot keys.
fn flood() -> Result<(), Box<dyn Error>> {
    let baseline = reset_peak();
    let clock = ManualClock::new(0);
    let quota: Quota = "10/s".parse()?;
    let limiter = KeyedLimiter::<u64, _>::builder(TokenBucket, quota)
        .capacity(FLOOD_CAPACITY)
        .unknown_key_quota(quota)
        .clock(clock.clone())
        .build()?;
    let built = live_bytes() - baseline;

    let mut hot = 0;
    let mut hot_allowed = 0u64;
    let mut hot_checks = 0u64;
    for i in 0..FLOOD_KEYS {
        clock.advance(Duration::from_micros(1));
        let _ = limiter.check(&(FLOOD_BASE + i));
        if i % HOT_EVERY == HOT_EVERY - 1 {
            hot_checks += 1;
            hot_allowed += u64::from(limiter.check(&hot).is_allowed());
            hot = (hot + 1) % HOT_KEYS;
        }
    }
    let peak = PEAK.load(Ordering::Relaxed) - baseline;
    let end = live_bytes() - baseline;
    let held_hot = (0..HOT_KEYS).filter(|k| limiter.quota_of(k).is_some()).count();
    let KeyedMetrics {
        entries,
        evicted_idle,
        evicted_frequency,
        refused,
        ..
    } = limiter.metrics();

    println!(
        "  {FLOOD_KEYS} flood keys + {hot_checks} hot checks ({HOT_KEYS} hot keys), capacity {FLOOD_CAPACITY}"
    );
    println!(
        "  peak_bytes: {peak}   ({:.1} per unit of capacity)",
        peak as f64 / FLOOD_CAPACITY as f64
    );
    println!(
        "  bytes after build: {built}   bytes at end: {end}   heap_bytes(): {}",
        limiter.heap_bytes()
    );
    println!("  entries: {entries}");
    println!("  evicted_idle: {evicted_idle}");
    println!("  evicted_frequency: {evicted_frequency}");
    println!("  refused: {refused}");
    // Each hot key's own limit (10/s, burst 10) admits at most 10 + 10 × 10 s = 110 in the run;
    // more would mean it was evicted and came back with a full bucket.
    let hot_limit = HOT_KEYS * (10 + 10 * FLOOD_KEYS / 1_000_000);
    println!("  hot keys held at end: {held_hot}/{HOT_KEYS}");
    println!("  hot checks allowed: {hot_allowed}/{hot_checks} (their limits admit at most {hot_limit})");
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let started = Instant::now();

    println!("1. {KEYS} distinct keys of {KEY_LEN} bytes, capacity {KEYS} (target: <= 64 B + key)");
    let boxed = entry_cost::<Box<str>>()?;
    print_entry_cost("Box<str>", size_of::<Box<str>>(), &boxed);
    let string = entry_cost::<String>()?;
    print_entry_cost("String", size_of::<String>(), &string);
    println!("bytes_per_entry: {:.0}", boxed.bytes_per_entry);

    println!();
    println!("2. flood of one-shot u64 keys (clock +1 us per flood key)");
    flood()?;

    println!();
    println!("elapsed: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
