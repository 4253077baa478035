//! Every algorithm against a plain reference model, on a manual clock.
//!
//! The models are written from each algorithm's definition, in the most direct form (token
//! counts as exact fractions, logs as lists of timestamps, windows as maps), with no shared
//! code with the implementation. Every field of every decision must match.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use sluice::{
    Algorithm, Decision, FixedWindow, LeakyBucket, ManualClock, Quota, QuotaError, RateLimiter,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};

/// What a model says: allowed, remaining, reset-after, retry-after, delay.
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

trait Model {
    fn check(&mut self, now: u64, cost: u64) -> Expected;
}

fn ceil(a: u128, b: u128) -> u64 {
    u64::try_from(a.div_ceil(b)).unwrap()
}

/// Token bucket: tokens as a fraction with denominator `p`, refilled by `c` per ns. With a
/// maximum delay it is the shaper: a request may borrow up to `max_delay` worth of tokens and
/// wait for them.
struct Bucket {
    cap: u128,
    c: u128,
    p: u128,
    tokens: i128,
    last: u64,
    max_delay: u128,
}

impl Bucket {
    fn new(q: &Quota, start: u64, max_delay: u64) -> Self {
        let (c, p) = q.reduced_rate();
        let (c, p) = (u128::from(c), u128::from(p));
        let cap = u128::from(q.capacity());
        Self {
            cap,
            c,
            p,
            tokens: (cap * p) as i128,
            last: start,
            max_delay: u128::from(max_delay) * c,
        }
    }
}

impl Model for Bucket {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        let full = (self.cap * self.p) as i128;
        if now > self.last {
            self.tokens = (self.tokens + (u128::from(now - self.last) * self.c) as i128).min(full);
            self.last = now;
        }
        let need = (u128::from(cost) * self.p) as i128;
        let remaining = |t: i128| (t.max(0) as u128 / self.p) as u64;
        let reset = |t: i128| ceil((full - t) as u128, self.c);
        let after = self.tokens - need;
        if after < -(self.max_delay as i128) {
            let retry = ceil((-after) as u128 - self.max_delay, self.c);
            return (false, remaining(self.tokens), reset(self.tokens), retry, 0);
        }
        self.tokens = after;
        let delay = if after < 0 {
            ceil((-after) as u128, self.c)
        } else {
            0
        };
        (true, remaining(after), reset(after), 0, delay)
    }
}

/// Leaky bucket as a meter: a water level that drains at the rate.
struct Level {
    cap: u128,
    c: u128,
    p: u128,
    level: u128,
    last: u64,
}

impl Model for Level {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        if now > self.last {
            self.level = self.level.saturating_sub(u128::from(now - self.last) * self.c);
            self.last = now;
        }
        let room = self.cap * self.p;
        let poured = self.level + u128::from(cost) * self.p;
        if poured > room {
            let retry = ceil(poured - room, self.c);
            return (
                false,
                ((room - self.level) / self.p) as u64,
                ceil(self.level, self.c),
                retry,
                0,
            );
        }
        self.level = poured;
        (
            true,
            ((room - poured) / self.p) as u64,
            ceil(poured, self.c),
            0,
            0,
        )
    }
}

/// Fixed window: a count per window index.
struct Windows {
    epoch: u64,
    len: u64,
    limit: u64,
    counts: HashMap<u64, u64>,
}

impl Model for Windows {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        let index = (now - self.epoch) / self.len;
        let until_end = (index + 1) * self.len - (now - self.epoch);
        let used = self.counts.get(&index).copied().unwrap_or(0);
        if used + cost > self.limit {
            let reset = if used == 0 { 0 } else { until_end };
            return (false, self.limit - used, reset, until_end, 0);
        }
        *self.counts.entry(index).or_default() += cost;
        let reset = if used + cost == 0 { 0 } else { until_end };
        (true, self.limit - used - cost, reset, 0, 0)
    }
}

/// Sliding window log: one timestamp per admitted unit.
struct UnitLog {
    len: u64,
    limit: u64,
    admitted: Vec<u64>,
}

impl Model for UnitLog {
    fn check(&mut self, now: u64, cost: u64) -> Expected {
        let live: Vec<u64> = self
            .admitted
            .iter()
            .copied()
            .filter(|&at| now - at < self.len)
            .collect();
        let used = live.len() as u64;
        // `len - (now - at)`: `at + len` may pass u64::MAX near the end of the range.
        let reset = live.iter().max().map_or(0, |&at| self.len - (now - at));
        if used + cost > self.limit {
            // The oldest `used + cost - limit` units must leave the window first.
            let mut sorted = live.clone();
            sorted.sort_unstable();
            let last_to_leave = sorted[(used + cost - self.limit - 1) as usize];
            return (
                false,
                self.limit - used,
                reset,
                self.len - (now - last_to_leave),
                0,
            );
        }
        self.admitted.extend(std::iter::repeat_n(now, cost as usize));
        let reset = if cost > 0 { self.len } else { reset };
        (true, self.limit - used - cost, reset, 0, 0)
    }
}

/// Sliding window counter: counts per window, the previous weighted by what remains of it.
/// Retry-after and reset-after are found by scanning time nanosecond by nanosecond.
struct WeightedWindows {
    epoch: u64,
    len: u64,
    limit: u64,
    counts: HashMap<u64, u64>,
}

impl WeightedWindows {
    /// `previous × (len − elapsed) / len` rounded up, plus the current count.
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
        let index = (now - self.epoch) / self.len;
        *self.counts.entry(index).or_default() += cost;
        (true, self.limit - used - cost, reset_from(self), 0, 0)
    }
}

/// Runs `ops` (clock advance, cost) through a limiter and a model; every decision must match.
fn run<A: Algorithm>(algorithm: A, quota: Quota, start: u64, model: &mut dyn Model, ops: &[(u64, u64)]) {
    let clock = ManualClock::new(start);
    let limiter = RateLimiter::with_clock(algorithm, quota, clock.clone()).unwrap();
    for (step, &(advance, cost)) in ops.iter().enumerate() {
        clock.advance_nanos(advance);
        let now = clock_now(&clock);
        let cost = cost.min(quota.capacity());
        let got = limiter.check_n(cost).unwrap();
        assert_eq!(
            observed(&got),
            model.check(now, cost),
            "step {step} at t={now} cost={cost} quota={quota}"
        );
    }
}

fn clock_now(clock: &ManualClock) -> u64 {
    use sluice::Clock;
    clock.now()
}

/// Quotas across the range: 1/day to 10^9/s, integral and fractional emission intervals.
fn quota_strategy() -> impl Strategy<Value = Quota> {
    let rates = prop_oneof![
        Just("1/day"),
        Just("1/h"),
        Just("0.1/s"),
        Just("1.1/s"),
        Just("3/s"),
        Just("7/100ns"),
        Just("1000003/s"),
        Just("1000000000/s"),
        Just("5/13ns"),
    ];
    (rates, 1u64..=12).prop_map(|(rate, burst)| rate.parse::<Quota>().unwrap().with_capacity(burst).unwrap())
}

/// Clock advances at the scale of the quota's emission interval, with frozen stretches.
fn ops_strategy(quota: Quota) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let (c, p) = quota.reduced_rate();
    let interval = (p / c).max(1);
    let advance = prop_oneof![
        3 => Just(0u64),
        4 => 0..=interval.saturating_mul(2),
        1 => 0..=interval.saturating_mul(quota.capacity() + 3),
    ];
    prop::collection::vec((advance, 0..=quota.capacity() + 1), 1..120)
}

fn small_window_quota() -> impl Strategy<Value = Quota> {
    (1u64..=8, 1u64..=40, 1u64..=8).prop_map(|(count, period, burst)| {
        Quota::new(count, Duration::from_nanos(period))
            .unwrap()
            .with_capacity(burst)
            .unwrap()
    })
}

fn start_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0..u64::MAX / 2, Just(u64::MAX - (1 << 50))]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn token_bucket_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        run(TokenBucket, quota, start, &mut Bucket::new(&quota, start, 0), &ops);
    }

    #[test]
    fn leaky_meter_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let (c, p) = quota.reduced_rate();
        let mut model = Level { cap: quota.capacity().into(), c: c.into(), p: p.into(), level: 0, last: start };
        run(LeakyBucket::meter(), quota, start, &mut model, &ops);
    }

    #[test]
    fn leaky_shaper_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy(), delay_intervals in 0u64..6) {
        let (c, p) = quota.reduced_rate();
        let max_delay = delay_intervals * (p / c).max(1);
        let shaper = LeakyBucket::shaper(Duration::from_nanos(max_delay));
        run(shaper, quota, start, &mut Bucket::new(&quota, start, max_delay), &ops);
    }

    #[test]
    fn fixed_window_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let mut model = Windows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), counts: HashMap::new() };
        run(FixedWindow, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_log_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let mut model = UnitLog { len: quota.fill_time_nanos(), limit: quota.capacity(), admitted: Vec::new() };
        run(SlidingWindowLog, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_counter_matches_model((quota, ops) in small_window_quota().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let mut model = WeightedWindows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), counts: HashMap::new() };
        run(SlidingWindowCounter, quota, start, &mut model, &ops);
    }

    /// Over any interval of length T, a token bucket admits at most burst + rate × T.
    #[test]
    fn token_bucket_never_exceeds_burst_plus_rate((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), ops_strategy(q))), start in start_strategy()) {
        let clock = ManualClock::new(start);
        let limiter = RateLimiter::with_clock(TokenBucket, quota, clock.clone()).unwrap();
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for &(advance, cost) in &ops {
            clock.advance_nanos(advance);
            let cost = cost.min(quota.capacity());
            if limiter.check_n(cost).unwrap().is_allowed() && cost > 0 {
                admitted.push((clock_now(&clock), cost));
            }
        }
        let (c, p) = quota.reduced_rate();
        for i in 0..admitted.len() {
            let mut total = 0u128;
            for &(at, cost) in &admitted[i..] {
                total += u128::from(cost);
                let span = u128::from(at - admitted[i].0);
                // total ≤ capacity + span × c / p, compared without division.
                prop_assert!(total * u128::from(p) <= u128::from(quota.capacity()) * u128::from(p) + span * u128::from(c));
            }
        }
    }
}

/// Long runs that cross the epoch horizon of a large irreducible rate (which moves the epoch
/// every ~38 minutes of clock time) still match the model exactly.
#[test]
fn token_bucket_stays_exact_across_epoch_moves() {
    let quota: Quota = "1000003/s burst 5".parse().unwrap();
    let start = 12_345;
    let mut model = Bucket::new(&quota, start, 0);
    let hour = 3_600_000_000_000u64;
    let ops: Vec<(u64, u64)> = (0..2000u64)
        .map(|i| (if i % 50 == 0 { hour } else { i % 1700 }, i % 6))
        .collect();
    run(TokenBucket, quota, start, &mut model, &ops);
}

/// A clock jump of more than 2^64 / c ns past the epoch (5 hours at `1000003/s`) before the
/// next check or quota change: the scaled time of the jump does not fit a u64, and the bucket
/// is simply full after it (the product overflowed before).
#[test]
fn token_bucket_survives_a_clock_jump_past_the_scaled_range() {
    let quota: Quota = "1000003/s burst 11".parse().unwrap();
    let hours = |h: u64| h * 3_600_000_000_000;
    for change in [None, Some(quota), Some("1/s burst 3".parse::<Quota>().unwrap())] {
        let clock = ManualClock::new(0);
        let limiter = RateLimiter::with_clock(TokenBucket, quota, clock.clone()).unwrap();
        assert!(limiter.check_n(11).unwrap().is_allowed());
        clock.advance_nanos(hours(6));
        if let Some(next) = change {
            limiter.set_quota(next).unwrap();
        }
        let full = limiter.quota().capacity();
        assert_eq!(limiter.check_n(0).unwrap().remaining(), full, "{change:?}");
    }
}

/// Idle spells of many horizons (6 h and 100 h against 38 minutes; 2^50 ns against 2^41 for
/// the window), and a quota change after one before any check moved the epoch: the carry-over
/// took the scaled time of such an instant with a plain multiplication, which wrapped past 8
/// horizons (found by `leaky_meter_quota_changes_match_model` in a debug build: "attempt to
/// multiply with overflow"). Decisions still match the models.
#[test]
fn idle_spells_of_many_horizons_and_a_change_after_one_stay_exact() {
    let hour = 3_600_000_000_000u64;
    let quota: Quota = "1000003/s burst 5".parse().unwrap();
    let ops = [(0, 5), (6 * hour, 5), (1, 1), (100 * hour, 3), (0, 3)];
    run(TokenBucket, quota, 0, &mut Bucket::new(&quota, 0, 0), &ops);
    let (c, p) = quota.reduced_rate();
    let mut level = Level {
        cap: quota.capacity().into(),
        c: c.into(),
        p: p.into(),
        level: 0,
        last: 0,
    };
    run(LeakyBucket::meter(), quota, 0, &mut level, &ops);
    let next: Quota = "7/100ns burst 5".parse().unwrap();
    let changes = [
        (0, 5, None),
        (6 * hour, 2, Some(next)),
        (100 * hour, 1, Some(quota)),
        (1, 4, None),
    ];
    run_with_changes(TokenBucket, quota, 0, &mut Bucket::new(&quota, 0, 0), &changes);

    let wide: Quota = "1048576/ns".parse().unwrap();
    let window = |q: &Quota| Windows {
        epoch: 0,
        len: q.fill_time_nanos(),
        limit: q.capacity(),
        counts: HashMap::new(),
    };
    let ops = [(0, 1 << 20), (1 << 50, 1 << 20), (1, 1)];
    run(FixedWindow, wide, 0, &mut window(&wide), &ops);
    let changes = [
        (0, 1 << 20, None),
        (1 << 50, 1, Some(wide.with_capacity(3).unwrap())),
        (1, 3, None),
    ];
    run_with_changes(FixedWindow, wide, 0, &mut window(&wide), &changes);
}

/// A clock that runs into the end of the u64 range: checks keep working, never panic.
#[test]
fn every_algorithm_survives_the_end_of_time() {
    fn drive<A: Algorithm>(algorithm: A) {
        let clock = ManualClock::new(u64::MAX - 5_000_000_000);
        let limiter = RateLimiter::with_clock(algorithm, "3/s".parse().unwrap(), clock.clone()).unwrap();
        for _ in 0..20 {
            let _ = limiter.check_n(2).unwrap();
            clock.advance(Duration::from_millis(700));
        }
        // Saturated at u64::MAX the clock stands still: the capacity runs out and stays out.
        let denial = (0..=3).map(|_| limiter.check()).find(|d| !d.is_allowed());
        let denial = denial.expect("a frozen clock must exhaust a capacity of 3");
        assert!(denial.retry_after_nanos() > 0);
        assert!(!limiter.check().is_allowed());
    }
    drive(TokenBucket);
    drive(LeakyBucket::meter());
    drive(LeakyBucket::shaper(Duration::from_secs(1)));
    drive(FixedWindow);
    drive(SlidingWindowLog);
    drive(SlidingWindowCounter);
}

#[test]
fn cost_above_capacity_is_an_error_and_zero_peeks() {
    let clock = ManualClock::new(0);
    let limiter = RateLimiter::with_clock(TokenBucket, "5/s".parse().unwrap(), clock).unwrap();
    assert_eq!(
        limiter.check_n(6),
        Err(sluice::CheckError::CostExceedsCapacity { cost: 6, capacity: 5 })
    );
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 5);
    assert_eq!(limiter.check_n(0).unwrap().remaining(), 5);
    assert_eq!(limiter.check_n(3).unwrap().remaining(), 2);
}

#[test]
fn deny_all_denies_every_cost() {
    let limiter = RateLimiter::with_clock(FixedWindow, Quota::deny_all(), ManualClock::new(0)).unwrap();
    for cost in [1, 2, 1000] {
        let d = limiter.check_n(cost).unwrap();
        assert!(!d.is_allowed());
        assert!(d.retry_after_nanos() > 0);
    }
    assert!(!limiter.check().is_allowed());
}

// ---------------------------------------------------------------------------------------------
// Refunds: giving back a take leaves every algorithm as if the take had never happened.
// ---------------------------------------------------------------------------------------------

/// A model that can also give back `cost` admitted at `taken_at`, at `now`.
trait RefundModel: Model {
    fn refund(&mut self, now: u64, taken_at: u64, cost: u64);
}

impl RefundModel for Bucket {
    fn refund(&mut self, now: u64, _: u64, cost: u64) {
        let full = (self.cap * self.p) as i128;
        if now > self.last {
            self.tokens = (self.tokens + (u128::from(now - self.last) * self.c) as i128).min(full);
            self.last = now;
        }
        self.tokens = (self.tokens + (u128::from(cost) * self.p) as i128).min(full);
    }
}

impl RefundModel for Level {
    fn refund(&mut self, now: u64, _: u64, cost: u64) {
        if now > self.last {
            self.level = self.level.saturating_sub(u128::from(now - self.last) * self.c);
            self.last = now;
        }
        self.level = self.level.saturating_sub(u128::from(cost) * self.p);
    }
}

impl RefundModel for Windows {
    fn refund(&mut self, _: u64, taken_at: u64, cost: u64) {
        let index = (taken_at - self.epoch) / self.len;
        *self.counts.get_mut(&index).unwrap() -= cost;
    }
}

impl RefundModel for UnitLog {
    fn refund(&mut self, _: u64, taken_at: u64, cost: u64) {
        for _ in 0..cost {
            let i = self.admitted.iter().rposition(|&at| at == taken_at).unwrap();
            self.admitted.remove(i);
        }
    }
}

impl RefundModel for WeightedWindows {
    fn refund(&mut self, _: u64, taken_at: u64, cost: u64) {
        let index = (taken_at - self.epoch) / self.len;
        *self.counts.get_mut(&index).unwrap() -= cost;
    }
}

/// Runs `ops` (clock advance, cost, action) through a limiter, taking through [`Link`] and
/// giving back an earlier admitted take when `action` says so; every decision must match the
/// model, which gives back the same take.
fn run_with_refunds<A: Algorithm>(
    algorithm: A,
    quota: Quota,
    start: u64,
    model: &mut dyn RefundModel,
    ops: &[(u64, u64, u8)],
) {
    use sluice::{Link, Receipt};
    let clock = ManualClock::new(start);
    let limiter = RateLimiter::with_clock(algorithm, quota, clock.clone()).unwrap();
    let mut outstanding: Vec<(Receipt, u64, u64)> = Vec::new();
    for (step, &(advance, cost, action)) in ops.iter().enumerate() {
        clock.advance_nanos(advance);
        let now = clock_now(&clock);
        if action % 3 == 0 && !outstanding.is_empty() {
            let (receipt, taken_at, cost) = outstanding.remove(usize::from(action) % outstanding.len());
            limiter.give_back(receipt, cost);
            model.refund(now, taken_at, cost);
            continue;
        }
        let cost = cost.min(quota.capacity());
        let (got, receipt) = limiter.take(cost).unwrap();
        assert_eq!(
            observed(&got),
            model.check(now, cost),
            "step {step} at t={now} cost={cost} quota={quota}"
        );
        if got.is_allowed() && cost > 0 {
            outstanding.push((receipt, now, cost));
        }
    }
}

fn refund_ops(quota: Quota) -> impl Strategy<Value = Vec<(u64, u64, u8)>> {
    ops_strategy(quota).prop_flat_map(|ops| {
        let n = ops.len();
        (Just(ops), prop::collection::vec(any::<u8>(), n)).prop_map(|(ops, actions)| {
            ops.into_iter()
                .zip(actions)
                .map(|((a, c), x)| (a, c, x))
                .collect()
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn token_bucket_refund_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), refund_ops(q))), start in start_strategy()) {
        run_with_refunds(TokenBucket, quota, start, &mut Bucket::new(&quota, start, 0), &ops);
    }

    #[test]
    fn leaky_meter_refund_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), refund_ops(q))), start in start_strategy()) {
        let (c, p) = quota.reduced_rate();
        let mut model = Level { cap: quota.capacity().into(), c: c.into(), p: p.into(), level: 0, last: start };
        run_with_refunds(LeakyBucket::meter(), quota, start, &mut model, &ops);
    }

    #[test]
    fn leaky_shaper_refund_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), refund_ops(q))), start in start_strategy(), delay_intervals in 0u64..6) {
        let (c, p) = quota.reduced_rate();
        let max_delay = delay_intervals * (p / c).max(1);
        let shaper = LeakyBucket::shaper(Duration::from_nanos(max_delay));
        run_with_refunds(shaper, quota, start, &mut Bucket::new(&quota, start, max_delay), &ops);
    }

    #[test]
    fn fixed_window_refund_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), refund_ops(q))), start in start_strategy()) {
        let mut model = Windows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), counts: HashMap::new() };
        run_with_refunds(FixedWindow, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_log_refund_matches_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), refund_ops(q))), start in start_strategy()) {
        let mut model = UnitLog { len: quota.fill_time_nanos(), limit: quota.capacity(), admitted: Vec::new() };
        run_with_refunds(SlidingWindowLog, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_counter_refund_matches_model((quota, ops) in small_window_quota().prop_flat_map(|q| (Just(q), refund_ops(q))), start in start_strategy()) {
        let mut model = WeightedWindows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), counts: HashMap::new() };
        run_with_refunds(SlidingWindowCounter, quota, start, &mut model, &ops);
    }
}

// ---------------------------------------------------------------------------------------------
// Quota changes: what was consumed and still counts stays consumed (capped at the new
// capacity) and recovers at the new rate. The bucket models carry it exactly at the same rate
// and in whole units, rounded up, at another; the window models keep one grid per window
// length, from the start, across every change.
// ---------------------------------------------------------------------------------------------

/// A model whose quota can change at `now`.
trait QuotaModel: Model {
    fn set_quota(&mut self, now: u64, quota: &Quota);
}

impl Bucket {
    fn refill(&mut self, now: u64) {
        let full = (self.cap * self.p) as i128;
        if now > self.last {
            self.tokens = (self.tokens + (u128::from(now - self.last) * self.c) as i128).min(full);
            self.last = now;
        }
    }
}

/// What a bucket-like model carries into a new quota (`c`, `p`, capacity `cap`), given what it
/// consumed in units of `1/old_p` of a unit at rate `old_c / old_p`: in units of `1/p`, at most
/// `most`.
fn carried(consumed: u128, (old_c, old_p): (u128, u128), (c, p): (u128, u128), most: u128) -> u128 {
    if (old_c, old_p) == (c, p) {
        // The same rate: exactly what was consumed.
        consumed.min(most)
    } else {
        // Another rate: whole units, a partly consumed one counting as consumed.
        let units = consumed.div_ceil(old_p);
        (units * p).min(most)
    }
}

impl QuotaModel for Bucket {
    fn set_quota(&mut self, now: u64, quota: &Quota) {
        self.refill(now);
        let (c, p) = quota.reduced_rate();
        let (c, p) = (u128::from(c), u128::from(p));
        let delay_ns = self.max_delay / self.c;
        // Consumption, borrowed tokens included, as a fraction of a unit with denominator `p`.
        let consumed = ((self.cap * self.p) as i128 - self.tokens) as u128;
        let cap = u128::from(quota.capacity());
        // At most the new capacity, and for a shaper what it may borrow besides.
        let most = cap * p + delay_ns * c;
        let carried = carried(consumed, (self.c, self.p), (c, p), most);
        *self = Self {
            cap,
            c,
            p,
            tokens: (cap * p) as i128 - carried as i128,
            last: now,
            max_delay: delay_ns * c,
        };
    }
}

impl QuotaModel for Level {
    fn set_quota(&mut self, now: u64, quota: &Quota) {
        if now > self.last {
            self.level = self.level.saturating_sub(u128::from(now - self.last) * self.c);
            self.last = now;
        }
        let (c, p) = quota.reduced_rate();
        let (c, p) = (u128::from(c), u128::from(p));
        let cap = u128::from(quota.capacity());
        self.level = carried(self.level, (self.c, self.p), (c, p), cap * p);
        (self.cap, self.c, self.p) = (cap, c, p);
    }
}

impl QuotaModel for Windows {
    fn set_quota(&mut self, now: u64, quota: &Quota) {
        // The units of the window holding `now` under the old length, capped at the new limit,
        // go into the window holding `now` under the new length. Windows of every length are
        // counted from the same start (no run here reaches a fixed window's horizon, where the
        // limiter would move it).
        let old_index = (now - self.epoch) / self.len;
        let used = self
            .counts
            .get(&old_index)
            .copied()
            .unwrap_or(0)
            .min(quota.capacity());
        self.len = quota.fill_time_nanos();
        self.limit = quota.capacity();
        self.counts = HashMap::from([((now - self.epoch) / self.len, used)]);
    }
}

impl QuotaModel for UnitLog {
    fn set_quota(&mut self, now: u64, quota: &Quota) {
        // A unit that left the old window is gone, even if the new window is longer.
        let (old_len, new_len) = (self.len, quota.fill_time_nanos());
        self.admitted
            .retain(|&at| now - at < old_len && now - at < new_len);
        // Over the new capacity, the oldest units are forgotten first.
        let excess = self.admitted.len().saturating_sub(quota.capacity() as usize);
        self.admitted.drain(..excess);
        (self.len, self.limit) = (new_len, quota.capacity());
    }
}

impl QuotaModel for WeightedWindows {
    fn set_quota(&mut self, now: u64, quota: &Quota) {
        let (len, limit) = (quota.fill_time_nanos(), quota.capacity());
        // The same window length and limit: nothing changes.
        if (len, limit) == (self.len, self.limit) {
            return;
        }
        // Otherwise the estimate at `now`, capped at the new limit, is all that counts: in the
        // window holding `now` under the new length, counted from the same start.
        let used = self.used_at(now).min(limit);
        (self.len, self.limit) = (len, limit);
        self.counts = HashMap::from([((now - self.epoch) / len, used)]);
    }
}

/// Runs `ops` (clock advance, cost, a quota to change to first) through a limiter and a model;
/// every decision must match.
fn run_with_changes<A: Algorithm>(
    algorithm: A,
    quota: Quota,
    start: u64,
    model: &mut dyn QuotaModel,
    ops: &[(u64, u64, Option<Quota>)],
) {
    let clock = ManualClock::new(start);
    let limiter = RateLimiter::with_clock(algorithm, quota, clock.clone()).unwrap();
    let mut current = quota;
    for (step, &(advance, cost, change)) in ops.iter().enumerate() {
        clock.advance_nanos(advance);
        let now = clock_now(&clock);
        if let Some(next) = change {
            match limiter.set_quota(next) {
                Ok(()) => {
                    model.set_quota(now, &next);
                    current = next;
                }
                // A shaper's maximum delay may not fit the new rate: the old quota stays.
                Err(QuotaError::Overflow(_)) => {}
                Err(e) => panic!("step {step}: {next} refused: {e}"),
            }
        }
        let cost = cost.min(current.capacity());
        let got = limiter.check_n(cost).unwrap();
        assert_eq!(
            observed(&got),
            model.check(now, cost),
            "step {step} at t={now} cost={cost} quota={current}"
        );
    }
}

/// Checks interleaved with changes to quotas from `quotas`, or to one with the same window
/// length (which a fixed window treats apart).
fn change_ops(
    quota: Quota,
    quotas: BoxedStrategy<Quota>,
) -> impl Strategy<Value = Vec<(u64, u64, Option<Quota>)>> {
    let window = quota.fill_time_nanos();
    let same_window = (1u64..=12).prop_map(move |n| {
        Quota::new(n, Duration::from_nanos(window))
            .unwrap()
            .with_capacity(n)
            .unwrap()
    });
    let next = prop_oneof![quotas, same_window].boxed();
    ops_strategy(quota).prop_flat_map(move |ops| {
        let n = ops.len();
        let changes = prop::collection::vec(prop::option::weighted(0.15, next.clone()), n);
        (Just(ops), changes).prop_map(|(ops, changes)| {
            ops.into_iter()
                .zip(changes)
                .map(|((advance, cost), change)| (advance, cost, change))
                .collect()
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn token_bucket_quota_changes_match_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), change_ops(q, quota_strategy().boxed()))), start in start_strategy()) {
        run_with_changes(TokenBucket, quota, start, &mut Bucket::new(&quota, start, 0), &ops);
    }

    #[test]
    fn leaky_meter_quota_changes_match_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), change_ops(q, quota_strategy().boxed()))), start in start_strategy()) {
        let (c, p) = quota.reduced_rate();
        let mut model = Level { cap: quota.capacity().into(), c: c.into(), p: p.into(), level: 0, last: start };
        run_with_changes(LeakyBucket::meter(), quota, start, &mut model, &ops);
    }

    #[test]
    fn leaky_shaper_quota_changes_match_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), change_ops(q, quota_strategy().boxed()))), start in start_strategy(), delay_intervals in 0u64..6) {
        let (c, p) = quota.reduced_rate();
        let max_delay = delay_intervals * (p / c).max(1);
        let shaper = LeakyBucket::shaper(Duration::from_nanos(max_delay));
        run_with_changes(shaper, quota, start, &mut Bucket::new(&quota, start, max_delay), &ops);
    }

    #[test]
    fn fixed_window_quota_changes_match_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), change_ops(q, quota_strategy().boxed()))), start in start_strategy()) {
        let mut model = Windows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), counts: HashMap::new() };
        run_with_changes(FixedWindow, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_log_quota_changes_match_model((quota, ops) in quota_strategy().prop_flat_map(|q| (Just(q), change_ops(q, quota_strategy().boxed()))), start in start_strategy()) {
        let mut model = UnitLog { len: quota.fill_time_nanos(), limit: quota.capacity(), admitted: Vec::new() };
        run_with_changes(SlidingWindowLog, quota, start, &mut model, &ops);
    }

    #[test]
    fn sliding_counter_quota_changes_match_model((quota, ops) in small_window_quota().prop_flat_map(|q| (Just(q), change_ops(q, small_window_quota().boxed()))), start in start_strategy()) {
        let mut model = WeightedWindows { epoch: start, len: quota.fill_time_nanos(), limit: quota.capacity(), counts: HashMap::new() };
        run_with_changes(SlidingWindowCounter, quota, start, &mut model, &ops);
    }
}
