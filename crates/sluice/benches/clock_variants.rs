mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use common::{Case, GovernorCase, Side, SipHash, SluiceCase, Step};
use sluice::{Clock, ManualClock, MonotonicClock};

#[derive(Clone)]
struct RdtscZero;
impl Clock for RdtscZero {
    fn now(&self) -> u64 {
        let t = unsafe { std::arch::x86_64::_rdtsc() };
        std::hint::black_box(t) & 0
    }
}
impl Step for RdtscZero {}

#[derive(Clone)]
struct Ticking(Arc<AtomicU64>);
fn step() -> u64 {
    std::env::var("STEP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}
static STEP_N: std::sync::LazyLock<u64> = std::sync::LazyLock::new(step);
impl Clock for Ticking {
    fn now(&self) -> u64 {
        let t = self.0.load(Ordering::Relaxed) + *STEP_N;
        self.0.store(t, Ordering::Relaxed);
        t
    }
}
impl Step for Ticking {}

#[derive(Clone)]
struct StdClock(Instant);
impl Clock for StdClock {
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}
impl Step for StdClock {}

#[derive(Clone)]
struct Frozen(u64);
impl Clock for Frozen {
    fn now(&self) -> u64 {
        std::hint::black_box(self.0)
    }
}
impl Step for Frozen {}

#[derive(Clone)]
struct RawTsc;
impl Clock for RawTsc {
    fn now(&self) -> u64 {
        unsafe { std::arch::x86_64::_rdtsc() }
    }
}
impl Step for RawTsc {}

#[derive(Clone)]
struct Offset(u64);
impl Clock for Offset {
    fn now(&self) -> u64 {
        MonotonicClock.now() - self.0
    }
}
impl Step for Offset {}

#[derive(Clone)]
struct ScaledLocal {
    anchor: u64,
    per_tick: u64,
}
impl Clock for ScaledLocal {
    fn now(&self) -> u64 {
        let t = unsafe { std::arch::x86_64::_rdtsc() };
        let elapsed = u128::from(t.saturating_sub(self.anchor));
        ((elapsed * u128::from(self.per_tick)) >> 32) as u64
    }
}
impl Step for ScaledLocal {}

#[derive(Clone)]
struct TscSub(u64);
impl Clock for TscSub {
    fn now(&self) -> u64 {
        unsafe { std::arch::x86_64::_rdtsc() }.wrapping_sub(self.0)
    }
}
impl Step for TscSub {}

#[derive(Clone)]
struct TscHalf;
impl Clock for TscHalf {
    fn now(&self) -> u64 {
        (unsafe { std::arch::x86_64::_rdtsc() }) >> 1
    }
}
impl Step for TscHalf {}

static PLAIN: ScaledLocal = ScaledLocal {
    anchor: 0,
    per_tick: 1 << 31,
};
static ONCE: std::sync::OnceLock<ScaledLocal> = std::sync::OnceLock::new();

#[derive(Clone)]
struct PlainStatic;
impl Clock for PlainStatic {
    fn now(&self) -> u64 {
        std::hint::black_box(&PLAIN).now()
    }
}
impl Step for PlainStatic {}

#[derive(Clone)]
struct OnceStatic;
impl Clock for OnceStatic {
    fn now(&self) -> u64 {
        match ONCE.get() {
            Some(s) => s.now(),
            None => 0,
        }
    }
}
impl Step for OnceStatic {}

static R_ANCHOR: AtomicU64 = AtomicU64::new(0);
static R_PER: AtomicU64 = AtomicU64::new(0);

#[derive(Clone)]
struct RelaxedStatic;
impl Clock for RelaxedStatic {
    fn now(&self) -> u64 {
        let per = R_PER.load(Ordering::Relaxed);
        if per == 0 {
            return 0;
        }
        ScaledLocal {
            anchor: R_ANCHOR.load(Ordering::Relaxed),
            per_tick: per,
        }
        .now()
    }
}
impl Step for RelaxedStatic {}

#[derive(Clone)]
struct AcquireStatic;
impl Clock for AcquireStatic {
    fn now(&self) -> u64 {
        let per = R_PER.load(Ordering::Acquire);
        if per == 0 {
            return 0;
        }
        ScaledLocal {
            anchor: R_ANCHOR.load(Ordering::Relaxed),
            per_tick: per,
        }
        .now()
    }
}
impl Step for AcquireStatic {}

static LEAKED: std::sync::atomic::AtomicPtr<ScaledLocal> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

#[derive(Clone)]
struct LeakedHeap;
impl Clock for LeakedHeap {
    fn now(&self) -> u64 {
        let p = LEAKED.load(Ordering::Relaxed);
        unsafe { (*p).now() }
    }
}
impl Step for LeakedHeap {}

#[derive(Clone)]
struct HeapScaled(Arc<ScaledLocal>);
impl Clock for HeapScaled {
    fn now(&self) -> u64 {
        self.0.now()
    }
}
impl Step for HeapScaled {}

#[derive(Clone)]
struct FencedManual(ManualClock);
impl Clock for FencedManual {
    fn now(&self) -> u64 {
        unsafe { std::arch::x86_64::_mm_lfence() };
        self.0.now()
    }
}
impl Step for FencedManual {}

fn time(n: u32, mut check: impl FnMut() -> bool) -> f64 {
    let start = Instant::now();
    for _ in 0..n {
        assert!(check());
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn main() {
    let case = Case::Random1m;
    let mut sides: Vec<(&str, Box<dyn Side>)> = Vec::new();
    let which = std::env::var("VARIANT").unwrap_or_default();
    for _ in 0..3 {
        match which.as_str() {
            "mono" => sides.push(("monotonic", Box::new(SluiceCase::new(case, MonotonicClock)))),
            "leaked" => {
                LEAKED.store(
                    Box::into_raw(Box::new(ScaledLocal {
                        anchor: unsafe { std::arch::x86_64::_rdtsc() },
                        per_tick: 1 << 31,
                    })),
                    Ordering::Relaxed,
                );
                sides.push(("leaked", Box::new(SluiceCase::new(case, LeakedHeap))))
            }
            "heap" => sides.push((
                "heap",
                Box::new(SluiceCase::new(
                    case,
                    HeapScaled(Arc::new(ScaledLocal {
                        anchor: unsafe { std::arch::x86_64::_rdtsc() },
                        per_tick: 1 << 31,
                    })),
                )),
            )),
            "plain" => sides.push(("plain", Box::new(SluiceCase::new(case, PlainStatic)))),
            "local" => sides.push((
                "local",
                Box::new(SluiceCase::new(
                    case,
                    ScaledLocal {
                        anchor: unsafe { std::arch::x86_64::_rdtsc() },
                        per_tick: 1 << 31,
                    },
                )),
            )),
            "tick" => sides.push((
                "tick",
                Box::new(SluiceCase::new(case, Ticking(Arc::new(AtomicU64::new(0))))),
            )),
            "rawtsc" => sides.push(("rawtsc", Box::new(SluiceCase::new(case, RawTsc)))),
            "zero" => sides.push(("zero", Box::new(SluiceCase::new(case, RdtscZero)))),
            "lfence" => sides.push((
                "lfence",
                Box::new(SluiceCase::new(case, FencedManual(ManualClock::new(0)))),
            )),
            "gov" => sides.push((
                "gov_fake",
                Box::new(GovernorCase::<_, SipHash>::new(
                    case,
                    governor::clock::FakeRelativeClock::default(),
                )),
            )),
            _ => sides.push(("manual", Box::new(SluiceCase::new(case, ManualClock::new(0))))),
        }
    }

    let n = 250_000;
    let mut results = vec![Vec::new(); sides.len()];
    for round in 0..12 {
        for i in 0..sides.len() {
            let j = (round + i) % sides.len();
            let side = &mut sides[j].1;
            results[j].push(time(n, || side.check()));
        }
    }
    println!("slow {}", sluice::SLOW_COUNT.load(Ordering::Relaxed));
    for (i, (name, _)) in sides.iter().enumerate() {
        let mut v = results[i].clone();
        v.sort_by(f64::total_cmp);
        println!("{name:<12} {:>7.1}", v[v.len() / 2]);
    }
}
