//! Quotas: parsing, exact rates, and clear errors for impossible ones.

use std::time::Duration;

use sluice::{Quota, QuotaError};

fn parse(text: &str) -> Result<Quota, QuotaError> {
    text.parse()
}

#[test]
fn parses_the_written_forms() {
    let cases = [
        ("100/s", 100, Duration::from_secs(1), 100),
        ("1.1/s", 11, Duration::from_secs(10), 2),
        ("0.1/s", 1, Duration::from_secs(10), 1),
        ("5000/h", 5000, Duration::from_secs(3600), 5000),
        ("10/min burst 20", 10, Duration::from_secs(60), 20),
        ("1/day", 1, Duration::from_secs(86_400), 1),
        ("5/10s", 5, Duration::from_secs(10), 5),
        (" 3 / 250ms  burst 1 ", 3, Duration::from_millis(250), 1),
        (
            "1000000000/s",
            1_000_000_000,
            Duration::from_secs(1),
            1_000_000_000,
        ),
    ];
    for (text, count, period, capacity) in cases {
        let q = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            (q.count(), q.period(), q.capacity()),
            (count, period, capacity),
            "{text}"
        );
    }
}

#[test]
fn rates_are_held_in_lowest_terms() {
    assert_eq!(parse("1.1/s").unwrap().reduced_rate(), (11, 10_000_000_000));
    assert_eq!(parse("100/s").unwrap().reduced_rate(), (1, 10_000_000));
    assert_eq!(parse("3/s").unwrap().reduced_rate(), (3, 1_000_000_000));
    assert_eq!(parse("1000000000/s").unwrap().reduced_rate(), (1, 1));
}

#[test]
fn display_round_trips() {
    for text in [
        "100/s",
        "11/10s burst 2",
        "10/min burst 20",
        "1/day",
        "5/10s",
        "7/250ms burst 3",
    ] {
        let q = parse(text).unwrap();
        assert_eq!(q.to_string(), text);
        assert_eq!(parse(&q.to_string()).unwrap(), q);
    }
}

#[test]
fn zero_rate_without_burst_denies_everything() {
    let q = parse("0/s").unwrap();
    assert!(q.is_deny_all());
    assert_eq!(q.capacity(), 0);
}

#[test]
fn malformed_and_impossible_quotas_say_what_is_wrong() {
    let cases = [
        ("", "missing '/'"),
        ("100", "missing '/'"),
        ("abc/s", "decimal number"),
        ("-1/s", "decimal number"),
        ("1.2.3/s", "decimal number"),
        ("10/fortnight", "unknown period unit"),
        ("10/s burst x", "burst must be a whole number"),
        ("10/0s", "longer than zero"),
        ("10/s burst 0", "capacity 0"),
        ("0/s burst 3", "never refill"),
        ("99999999999999999999999/s", "too many digits"),
        ("1.00000000000000000000001/s", "too many decimals"),
        ("1/99999999999day", "584 years"),
        // Seven decimals of a day: 10000001 per 10^7 days, which no u64 of ns holds.
        (
            "1.0000001/day",
            "10000001 per 10000000 × 1day, a period beyond 584 years",
        ),
        ("1/day burst 1000000000", "cannot be held exactly"),
    ];
    for (text, needle) in cases {
        let err = parse(text).expect_err(text).to_string();
        assert!(
            err.contains(needle),
            "{text:?}: {err:?} should mention {needle:?}"
        );
    }
}

#[test]
fn constructors_agree_with_parsing() {
    use std::num::NonZeroU64;
    let n = NonZeroU64::new(42).unwrap();
    assert_eq!(Quota::per_second(n), parse("42/s").unwrap());
    assert_eq!(Quota::per_minute(n), parse("42/min").unwrap());
    assert_eq!(Quota::per_hour(n), parse("42/h").unwrap());
    assert_eq!(
        Quota::new(42, Duration::from_secs(1)).unwrap(),
        parse("42/s").unwrap()
    );
    assert_eq!(Quota::new(1, Duration::ZERO), Err(QuotaError::ZeroPeriod));
}

/// Decimals whose period in nanoseconds would pass 2^64 − 1 as written are read in lowest
/// terms: `1.000000/day` is 1 per day (it was refused as "period exceeds 584 years"), and
/// what fits as written is kept as written.
#[test]
fn decimals_that_reduce_fit_where_the_written_period_does_not() {
    let day = Duration::from_secs(86_400);
    let q = parse("1.000000/day").unwrap();
    assert_eq!((q.count(), q.period(), q.capacity()), (1, day, 1));
    assert_eq!(q, parse("1/day").unwrap());
    let q = parse("2.500000/day").unwrap();
    assert_eq!((q.count(), q.period(), q.capacity()), (5, 2 * day, 3));
    assert_eq!(q.reduced_rate(), parse("5/2day").unwrap().reduced_rate());
    // Fits as written: unchanged (11 per 10 s, shown so).
    assert_eq!(parse("1.1/s").unwrap().to_string(), "11/10s burst 2");
}
