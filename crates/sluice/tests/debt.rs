//! Charges after the fact (`charge_n`) against models that let tokens go below zero, on a
//! manual clock, for every algorithm, on the direct and the keyed limiter.
//!
//! The models are written from each algorithm's definition with debt added in its most direct
//! form (a signed token count, a running count that windows repay one limit at a time, a log of
//! one timestamp per unit), sharing no code with the implementation; retry and reset times of
//! the window models are found by scanning forward. Every field of every decision and every
//! charge must match.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use sluice::{
    Algorithm, Charge, Clock, Decision, FixedWindow, KeyedLimiter, LeakyBucket, ManualClock, Quota,
    RateLimiter, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

/// allowed, remaining, reset-after, retry-after, delay.
type Expected = (bool, u64, u64, u64, u64);

fn observed(d: &Decision) -> Expected {
    (
        d.is_allowed(),
        d.remaining(),
        d.reset_after_nanos(),
        d.retry_after_nanos(),
        d.delay_nanos(),
    )
}

/// charged, debt, and the peek after.
type ExpectedCharge = (u64, u64, Expected);

fn charged(c: &Charge) -> ExpectedCharge {
    (c.charged(), c.debt(), observed(c.decision()))
}

trait Model {
    fn check(&mut self, now: u64, cost: u64) -> Expected;
    /// Consumes up to `cost`, never below the floor; answers what it took and the debt.
    fn charge(&mut self, now: u64, cost: u64) -> (u64, u64);
}

fn ceil(a: u128, b: u128) -> u64 {
    u64::try_from(a.div_ceil(b)).unwrap()
}

/// Token bucket (and the leaky bucket, a meter or a shaper): tokens as a signed fraction of
/// denominator `p`, refilled by `c` per ns up to the capacity. A shaper admits down to
/// `-max_delay`; a charge takes down to the lower of that and `-debt`.
struct Bucket {
    cap: i128,
    c: i128,
    p: i128,
    tokens: i128,
    last: u64,
    max_delay: i128,
    debt: i128,
}

impl Bucket {
    fn new(q: &Quota, start: u64, max_delay_ns: u64) -> Self {
        let (c, p) = q.reduced_rate();
        let (c, p) = (i128::from(c), i128::from(p));
        let cap = i128::from(q.capacity());
        Self {
            cap,
            c,
            p,
            tokens: cap * p,
            last: start,
            max_delay: i128::from(max_delay_ns) * c,
            debt: i128::from(q.max_debt()) * p,
        }
    }

    fn refill(&mut self, now: u64) {
        if now > self.last {
            self.tokens = (self.tokens + i128::from(now - self.last) * self.c).min(self.cap * self.p);
            self.last = now;
        }
    }

    fn units(&self, scaled: i128) -> u64 {
        ceil(scaled.max(0) as u128, self.p as u128)
    }
}

impl Model for Bucket {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        self.refill(now);
        let full = self.cap * self.p;
        let remaining = |t: i128| (t.max(0) / self.p) as u64;
        let reset = |t: i128| ceil((full - t) as u128, self.c as u128);
        let after = self.tokens - i128::from(cost) * self.p;
        if after < -self.max_delay {
            let retry = ceil((-after - self.max_delay) as u128, self.c as u128);
            return (false, remaining(self.tokens), reset(self.tokens), retry, 0);
        }
        self.tokens = after;
        let delay = if after < 0 {
            ceil((-after) as u128, self.c as u128)
        } else {
            0
        };
        (true, remaining(after), reset(after), 0, delay)
    }

    fn charge(&mut self, now: u64, cost: u64) -> (u64, u64) {
        self.refill(now);
        let floor = -self.max_delay.max(self.debt);
        let after = (self.tokens - i128::from(cost) * self.p).max(floor.min(self.tokens));
        let taken = self.units(self.tokens - after);
        self.tokens = after;
        (taken, self.units(-after))
    }
}

/// Fixed window: the units counted against the window in force; each window that begins
/// repays one limit of what the earlier ones counted past theirs.
struct Windows {
    epoch: u64,
    len: u64,
    limit: u64,
    debt: u64,
    index: u64,
    used: u64,
}

impl Windows {
    fn go_to(&mut self, now: u64) {
        let index = (now - self.epoch) / self.len;
        while self.index < index {
            self.index += 1;
            self.used = self.used.saturating_sub(self.limit);
            if self.used == 0 {
                self.index = index;
            }
        }
    }

    /// Time from `now` until the window in which at most `most` of the present count is left.
    fn until_left(&self, now: u64, most: u64) -> u64 {
        let until_end = (self.index + 1) * self.len - (now - self.epoch);
        let mut left = self.used;
        let mut after = until_end;
        loop {
            left = left.saturating_sub(self.limit);
            if left <= most {
                return after;
            }
            after += self.len;
        }
    }
}

impl Model for Windows {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        self.go_to(now);
        let until_end = (self.index + 1) * self.len - (now - self.epoch);
        let reset = |m: &Self| if m.used == 0 { 0 } else { m.until_left(now, 0) };
        if self.used + cost > self.limit {
            let retry = self.until_left(now, self.limit - cost);
            return (false, self.limit.saturating_sub(self.used), reset(self), retry, 0);
        }
        self.used += cost;
        let reset = if self.used == 0 { 0 } else { until_end };
        (true, self.limit - self.used, reset, 0, 0)
    }

    fn charge(&mut self, now: u64, cost: u64) -> (u64, u64) {
        self.go_to(now);
        let taken = cost.min((self.limit + self.debt).saturating_sub(self.used));
        self.used += taken;
        (taken, self.used.saturating_sub(self.limit))
    }
}

/// Sliding window log: one timestamp per unit admitted or charged.
struct UnitLog {
    len: u64,
    limit: u64,
    debt: u64,
    units: Vec<u64>,
}

impl UnitLog {
    fn live(&mut self, now: u64) -> Vec<u64> {
        self.units.retain(|&at| now - at < self.len);
        let mut live = self.units.clone();
        live.sort_unstable();
        live
    }
}

impl Model for UnitLog {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        let live = self.live(now);
        let used = live.len() as u64;
        let reset = live.last().map_or(0, |&at| self.len - (now - at));
        if used + cost > self.limit {
            let last_to_leave = live[(used + cost - self.limit - 1) as usize];
            let retry = self.len - (now - last_to_leave);
            return (false, self.limit.saturating_sub(used), reset, retry, 0);
        }
        self.units.extend(std::iter::repeat_n(now, cost as usize));
        let reset = if cost > 0 { self.len } else { reset };
        (true, self.limit - used - cost, reset, 0, 0)
    }

    fn charge(&mut self, now: u64, cost: u64) -> (u64, u64) {
        let used = self.live(now).len() as u64;
        let taken = cost.min((self.limit + self.debt).saturating_sub(used));
        self.units.extend(std::iter::repeat_n(now, taken as usize));
        (taken, (used + taken).saturating_sub(self.limit))
    }
}

/// Sliding window counter: counts per window, the previous weighted by what remains of it;
/// retry and reset found by scanning time nanosecond by nanosecond.
struct WeightedWindows {
    epoch: u64,
    len: u64,
    limit: u64,
    debt: u64,
    counts: HashMap<u64, u64>,
}

impl WeightedWindows {
    fn used_at(&self, now: u64) -> u64 {
        let rel = now - self.epoch;
        let index = rel / self.len;
        let elapsed = rel % self.len;
        let previous = if index == 0 {
            0
        } else {
            self.counts.get(&(index - 1)).copied().unwrap_or(0)
        };
        let current = self.counts.get(&index).copied().unwrap_or(0);
        (previous * (self.len - elapsed)).div_ceil(self.len) + current
    }

    fn count(&mut self, now: u64, units: u64) {
        *self.counts.entry((now - self.epoch) / self.len).or_default() += units;
    }
}

impl Model for WeightedWindows {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        let used = self.used_at(now);
        let reset_from = |m: &Self| (0..=2 * m.len).find(|&dt| m.used_at(now + dt) == 0).unwrap();
        if used + cost > self.limit {
            let retry = (1..=2 * self.len)
                .find(|&dt| self.used_at(now + dt) + cost <= self.limit)
                .unwrap();
            return (false, self.limit.saturating_sub(used), reset_from(self), retry, 0);
        }
        self.count(now, cost);
        (true, self.limit - used - cost, reset_from(self), 0, 0)
    }

    fn charge(&mut self, now: u64, cost: u64) -> (u64, u64) {
        let used = self.used_at(now);
        let taken = cost.min((self.limit + self.debt).saturating_sub(used));
        self.count(now, taken);
        (taken, (used + taken).saturating_sub(self.limit))
    }
}

/// One step: advance the clock, then check or charge a cost.
#[derive(Debug, Clone, Copy)]
enum Op {
    Check(u64, u64),
    Charge(u64, u64),
}

/// Runs `ops` through a direct limiter, a keyed one (one key) and the model: every decision
/// and every charge must match.
fn run<A: Algorithm + Clone>(algorithm: A, quota: Quota, start: u64, model: &mut dyn Model, ops: &[Op]) {
    let clock = ManualClock::new(start);
    let direct = RateLimiter::with_clock(algorithm.clone(), quota, clock.clone()).unwrap();
    let keyed = KeyedLimiter::<String, A, _, _>::builder(algorithm, quota)
        .unknown_key_quota(quota)
        .clock(clock.clone())
        .build()
        .unwrap();
    // A peek stores the key now, so its windows start where the direct limiter's do.
    let _ = keyed.check_n("k", 0).unwrap();
    for (step, &op) in ops.iter().enumerate() {
        match op {
            Op::Check(advance, cost) => {
                clock.advance_nanos(advance);
                let now = clock.now();
                let cost = cost.min(quota.capacity());
                let expected = model.check(now, cost);
                let got = direct.check_n(cost).unwrap();
                assert_eq!(
                    observed(&got),
                    expected,
                    "step {step} check {cost} at t={now} quota={quota}"
                );
                let got = keyed.check_n("k", cost).unwrap();
                assert_eq!(
                    observed(&got),
                    expected,
                    "step {step} keyed check {cost} at t={now}"
                );
            }
            Op::Charge(advance, cost) => {
                clock.advance_nanos(advance);
                let now = clock.now();
                let (taken, debt) = model.charge(now, cost);
                let expected = (taken, debt, model.check(now, 0));
                let got = direct.charge_n(cost);
                assert_eq!(
                    charged(&got),
                    expected,
                    "step {step} charge {cost} at t={now} quota={quota}"
                );
                let got = keyed.charge_n("k", cost);
                assert_eq!(
                    charged(&got),
                    expected,
                    "step {step} keyed charge {cost} at t={now}"
                );
                let balance = if debt > 0 {
                    -(debt as i64)
                } else {
                    expected.2.1 as i64
                };
                assert_eq!(got.balance(), balance);
            }
        }
    }
}

/// Quotas across the range, with debts from none to a few capacities.
fn quota_strategy() -> impl Strategy<Value = Quota> {
    let rates = prop_oneof![
        Just("1/day"),
        Just("0.1/s"),
        Just("1.1/s"),
        Just("3/s"),
        Just("7/100ns"),
        Just("1000003/s"),
        Just("5/13ns"),
    ];
    (rates, 1u64..=12, prop::option::of(0u64..=30)).prop_map(|(rate, burst, debt)| {
        let quota = rate.parse::<Quota>().unwrap().with_capacity(burst).unwrap();
        match debt {
            Some(debt) => quota.with_max_debt(debt).unwrap(),
            None => quota,
        }
    })
}

/// Windows a few nanoseconds long, so the scanning models stay quick.
fn small_window_quota() -> impl Strategy<Value = Quota> {
    (1u64..=8, 1u64..=40, 1u64..=8, 0u64..=20).prop_map(|(count, period, burst, debt)| {
        Quota::new(count, Duration::from_nanos(period))
            .unwrap()
            .with_capacity(burst)
            .unwrap()
            .with_max_debt(debt)
            .unwrap()
    })
}

/// Clock advances at the scale of the emission interval; charges up to a few times the
/// capacity plus the debt, so the floor is reached.
fn ops_strategy(quota: Quota) -> impl Strategy<Value = Vec<Op>> {
    let (c, p) = quota.reduced_rate();
    let interval = (p / c).max(1);
    let advance = move || {
        prop_oneof![
            3 => Just(0u64),
            4 => 0..=interval.saturating_mul(2),
            1 => 0..=interval.saturating_mul(quota.capacity() + quota.max_debt() + 3),
        ]
    };
    let most = 2 * (quota.capacity() + quota.max_debt()) + 1;
    let op = prop_oneof![
        3 => (advance(), 0..=quota.capacity() + 1).prop_map(|(a, c)| Op::Check(a, c)),
        1 => (advance(), 0..=most).prop_map(|(a, c)| Op::Charge(a, c)),
    ];
    prop::collection::vec(op, 1..100)
}

fn start_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..u64::MAX / 2]
}

fn windows(quota: &Quota, start: u64) -> Windows {
    Windows {
        epoch: start,
        len: quota.fill_time_nanos(),
        limit: quota.capacity(),
        debt: quota.max_debt(),
        index: 0,
        used: 0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn token_bucket_debt_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        run(TokenBucket, quota, start, &mut Bucket::new(&quota, start, 0), &ops);
    }

    #[test]
    fn leaky_meter_debt_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        run(LeakyBucket::meter(), quota, start, &mut Bucket::new(&quota, start, 0), &ops);
    }

    #[test]
    fn leaky_shaper_debt_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy(), delay_intervals in 0u64..6) {
        let (c, p) = quota.reduced_rate();
        let max_delay = delay_intervals * (p / c).max(1);
        let shaper = LeakyBucket::shaper(Duration::from_nanos(max_delay));
        run(shaper, quota, start, &mut Bucket::new(&quota, start, max_delay), &ops);
    }

    #[test]
    fn fixed_window_debt_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        run(FixedWindow, quota, start, &mut windows(&quota, start), &ops);
    }

    #[test]
    fn sliding_log_debt_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let mut model = UnitLog { len: quota.fill_time_nanos(), limit: quota.capacity(), debt: quota.max_debt(), units: Vec::new() };
        run(SlidingWindowLog, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_counter_debt_matches_model((quota, ops) in small_window_quota().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let mut model = WeightedWindows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), debt: quota.max_debt(), counts: HashMap::new() };
        run(SlidingWindowCounter, quota, start, &mut model, &ops);
    }
}

/// A key charged before any check is stored by the charge and charged in full.
#[test]
fn a_key_never_checked_is_stored_and_charged() {
    let quota: Quota = "10/s".parse().unwrap();
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, quota)
        .unknown_key_quota(quota)
        .clock(ManualClock::new(0))
        .build()
        .unwrap();
    let charge = limiter.charge_n("new", 12);
    assert_eq!((charge.charged(), charge.debt()), (12, 2));
    assert_eq!(limiter.check("new").retry_after_nanos(), 300_000_000);
    assert!(limiter.check("other").is_allowed());
}

/// A key on the failsafe quota charges the failsafe pool too: the pool's debt holds back
/// every other key on the failsafe quota.
#[test]
fn a_failsafe_key_charges_the_pool() {
    let clock = ManualClock::new(0);
    // Fetches are never run: every key stays on the failsafe quota.
    let never =
        sluice::FnSource(|_: &String| async { sluice::FetchResult::Err(sluice::FetchError::new("down")) });
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse().unwrap())
        .source(never)
        .failsafe_pool("20/s".parse().unwrap())
        .clock(clock.clone())
        .spawner(|_task| {})
        .build()
        .unwrap();
    assert!(limiter.check("a").is_allowed());
    let charge = limiter.charge_n("a", 25);
    assert_eq!(charge.charged(), 19, "the key's own floor: 9 left, 10 below");
    // The pool had 19 left and took 25: 6 below empty, so b, on the failsafe quota, waits.
    let denied = limiter.check("b");
    assert!(!denied.is_allowed());
    assert_eq!(
        denied.retry_after_nanos(),
        350_000_000,
        "7 units of the pool at 20/s"
    );
}
