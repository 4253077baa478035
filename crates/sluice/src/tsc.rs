//! [`MonotonicClock`](crate::MonotonicClock)'s fast path: nanoseconds from the CPU's
//! time-stamp counter, scaled against std's `Instant`.
//!
//! Reading the counter costs about half of a `clock_gettime` call (the vDSO reads the same
//! counter, fences it and converts it). It is used only where it is as trustworthy as the
//! kernel's clock: on x86_64 with an *invariant* counter (constant rate, running in every
//! power state) that Linux itself has chosen as its clock source, which it does only after
//! checking that the cores' counters agree. Elsewhere every reading is an `Instant`.
//!
//! The scale (nanoseconds per tick) is measured against `Instant` over the first
//! [`CALIBRATION`] of the process: until then readings come from `Instant`, then from the
//! counter, anchored at the moment of the switch so that the two agree there. An error of a
//! 100 ns bracket over 50 ms is 2 ppm, below the drift the kernel's own clock is allowed (NTP
//! slews it by up to 500 ppm).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long readings come from `Instant` while the counter's rate is measured.
const CALIBRATION: Duration = Duration::from_millis(50);

/// Readings after the switch: `anchor_nanos + (ticks − anchor_ticks) × nanos_per_tick`, the
/// rate in 32.32 fixed point.
#[derive(Debug, Clone, Copy)]
struct Scale {
    anchor_nanos: u64,
    anchor_ticks: u64,
    nanos_per_tick: u64,
}

impl Scale {
    #[inline]
    fn nanos(&self, ticks: u64) -> u64 {
        // A core whose counter reads a hair behind the anchor's reads the anchor.
        let elapsed = u128::from(ticks.saturating_sub(self.anchor_ticks));
        let nanos = (elapsed * u128::from(self.nanos_per_tick)) >> 32;
        self.anchor_nanos
            .saturating_add(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// Where readings come from once the process's clock is settled.
#[derive(Debug, Clone, Copy)]
enum Source {
    Counter(Scale),
    Instant,
}

/// The process's origin: the first reading, with the counter's value then if it is usable.
struct Origin {
    instant: Instant,
    ticks: Option<u64>,
}

fn origin() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        if counter_usable() {
            let (instant, ticks) = paired_reading();
            Origin {
                instant,
                ticks: Some(ticks),
            }
        } else {
            Origin {
                instant: Instant::now(),
                ticks: None,
            }
        }
    })
}

static SOURCE: OnceLock<Source> = OnceLock::new();

/// Nanoseconds since the process's origin.
#[inline]
pub(crate) fn now() -> u64 {
    match SOURCE.get() {
        Some(source) => source.read(),
        None => unsettled_now(),
    }
}

impl Source {
    #[inline]
    fn read(&self) -> u64 {
        match self {
            Source::Counter(scale) => scale.nanos(read_counter()),
            Source::Instant => instant_nanos(origin().instant),
        }
    }
}

/// A reading before the source is settled: from `Instant`, settling it once the counter has
/// run long enough to be measured (or at once if it is not usable).
#[cold]
fn unsettled_now() -> u64 {
    let origin = origin();
    let Some(start_ticks) = origin.ticks else {
        SOURCE.get_or_init(|| Source::Instant);
        return instant_nanos(origin.instant);
    };
    let nanos = instant_nanos(origin.instant);
    if nanos < CALIBRATION.as_nanos() as u64 {
        return nanos;
    }
    SOURCE
        .get_or_init(|| {
            let (anchor, anchor_ticks) = paired_reading();
            let anchor_nanos = nanos_between(origin.instant, anchor);
            let ticks = anchor_ticks.saturating_sub(start_ticks);
            // A counter that did not move (or a rate beyond 2^32 ns per tick) is not a clock.
            match ((u128::from(anchor_nanos) << 32) / u128::from(ticks.max(1))).try_into() {
                Ok(nanos_per_tick) if ticks > 0 && nanos_per_tick > 0 => Source::Counter(Scale {
                    anchor_nanos,
                    anchor_ticks,
                    nanos_per_tick,
                }),
                _ => Source::Instant,
            }
        })
        .read()
}

/// An `Instant` and the counter at the same moment: the counter read either side of the
/// `Instant`, the tightest of several tries, midpoint. A try the thread was preempted in is
/// wide, so it is not the one chosen: both ends of the calibration are paired this way.
fn paired_reading() -> (Instant, u64) {
    tightest_pair(read_counter, Instant::now)
}

/// [`paired_reading`] on given clocks: of 16 tries, each an `instant` bracketed by two
/// `counter` readings, the one with the narrowest bracket (a counter that went back between
/// its readings, as across cores, gives a huge width and is never chosen).
fn tightest_pair(mut counter: impl FnMut() -> u64, mut instant: impl FnMut() -> Instant) -> (Instant, u64) {
    let mut best = None::<(u64, Instant, u64)>;
    for _ in 0..16 {
        let before = counter();
        let at = instant();
        let after = counter();
        let width = after.wrapping_sub(before);
        if best.is_none_or(|(narrowest, _, _)| width < narrowest) {
            best = Some((width, at, before.wrapping_add(width / 2)));
        }
    }
    best.map_or_else(|| (instant(), counter()), |(_, at, ticks)| (at, ticks))
}

/// Nanoseconds from `origin` to now, saturating (at 584 years).
fn instant_nanos(origin: Instant) -> u64 {
    nanos_between(origin, Instant::now())
}

/// Nanoseconds from `earlier` to `later` (0 if `later` is earlier), saturating.
fn nanos_between(earlier: Instant, later: Instant) -> u64 {
    let elapsed = later.saturating_duration_since(earlier);
    // u64 arithmetic: cheaper than `as_nanos`' u128.
    elapsed
        .as_secs()
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(elapsed.subsec_nanos()))
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn read_counter() -> u64 {
    // SAFETY: RDTSC exists on every x86_64 processor and has no side effects.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_counter() -> u64 {
    0
}

/// Whether the counter may stand in for the kernel's clock (see the module's comment).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn counter_usable() -> bool {
    use std::arch::x86_64::__cpuid;
    const INVARIANT_TSC: u32 = 1 << 8;
    // Leaf 0x8000_0007 is read only if the processor reports it.
    let invariant = __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & INVARIANT_TSC != 0;
    invariant
        && std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|source| source.trim() == "tsc")
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn counter_usable() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::saturating_nanos;

    #[test]
    fn scale_is_linear_from_its_anchor_and_never_goes_below_it() {
        // 2.5 ns per tick (a 400 MHz counter).
        let scale = Scale {
            anchor_nanos: 1_000,
            anchor_ticks: 10_000,
            nanos_per_tick: 5 << 31,
        };
        assert_eq!(scale.nanos(10_000), 1_000);
        assert_eq!(scale.nanos(10_004), 1_010);
        assert_eq!(scale.nanos(9_000), 1_000);
        assert_eq!(scale.nanos(u64::MAX), u64::MAX);
    }

    /// A preemption between the counter and `Instant` widens that try's bracket: the pairing
    /// takes the narrowest try, whichever it is, and its midpoint. Fails if either side of the
    /// bracket is not read (then the widths, and the pick, differ).
    #[test]
    fn the_pairing_takes_the_narrowest_bracket_whatever_else_was_preempted() {
        let origin = Instant::now();
        // (before, after) per try: wide (preempted), back (another core), narrow at try 5.
        let brackets: Vec<(u64, u64)> = (0..16u64)
            .map(|i| match i {
                5 => (5_000, 5_010),
                7 => (7_000, 6_990),
                _ => (i * 1_000, i * 1_000 + 400 + i),
            })
            .collect();
        let mut readings = brackets.iter().flat_map(|&(before, after)| [before, after]);
        let mut tries = 0u32;
        let (at, ticks) = tightest_pair(
            || readings.next().unwrap_or(0),
            || {
                tries += 1;
                origin + Duration::from_micros(u64::from(tries))
            },
        );
        assert_eq!((at, ticks), (origin + Duration::from_micros(6), 5_005));
    }

    /// Over the switch from `Instant` to the counter and beyond, readings never go back and
    /// keep pace with `Instant` (whichever source this machine settles on).
    #[test]
    fn tracks_instant_across_the_switch() {
        let start = Instant::now();
        let first = now();
        let mut last = first;
        while start.elapsed() < CALIBRATION * 3 {
            let reading = now();
            assert!(reading >= last, "went back from {last} to {reading}");
            last = reading;
        }
        assert!(SOURCE.get().is_some(), "the source settles after the calibration");
        // Each clock reading is bracketed by two of `Instant`, so a preemption next to a
        // reading widens the bracket instead of skewing the comparison.
        let (before_start, start_reading, after_start) = (Instant::now(), now(), Instant::now());
        std::thread::sleep(Duration::from_millis(200));
        let (before_end, end_reading, after_end) = (Instant::now(), now(), Instant::now());
        let by_clock = end_reading - start_reading;
        let shortest = saturating_nanos(before_end.saturating_duration_since(after_start));
        let longest = saturating_nanos(after_end.saturating_duration_since(before_start));
        // Both measure the same interval; 1% is far beyond a calibration error (ppm) and far
        // below a wrong scale.
        assert!(
            by_clock >= shortest - shortest / 100 && by_clock <= longest + longest / 100,
            "{by_clock} ns by the clock, between {shortest} and {longest} ns by Instant"
        );
    }
}
