//! Quota and duration text.

use sluice::{Quota, parse_duration};

/// `data` as quota text and as duration text: parsing never panics; a parsed quota prints as
/// text that parses back to the same quota, with its rate in lowest terms and a capacity of
/// 0 only when it denies everything; a parsed duration reads back from its nanoseconds, and
/// is exactly what its decimal number times its unit is (or it is refused).
///
/// # Example
/// ```
/// sluice_invariants::quota(b"1.1/s burst 3");
/// sluice_invariants::quota(b"\xff/\x00");
/// ```
pub fn quota(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match text.parse::<Quota>() {
        Ok(q) => {
            let shown = q.to_string();
            assert_eq!(shown.parse::<Quota>(), Ok(q), "{text:?} prints as {shown:?}");
            assert_eq!(q.is_deny_all(), q.capacity() == 0, "{text:?}");
            let (c, p) = q.reduced_rate();
            assert_eq!(
                u128::from(c) * u128::from(q.period_nanos()),
                u128::from(q.count()) * u128::from(p),
                "{text:?}: the reduced rate is another rate"
            );
            assert!(q.fill_time_nanos() >= 1);
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match parse_duration(&text) {
        Ok(d) => {
            let nanos = format!("{}ns", d.as_nanos());
            assert_eq!(parse_duration(&nanos), Ok(d), "{text:?} is {nanos}");
            if let Some(exact) = exact_nanos(&text) {
                assert_eq!(Some(d.as_nanos()), exact, "{text:?}");
            }
        }
        Err(e) => {
            assert!(!e.to_string().is_empty());
            if let Some(Some(exact)) = exact_nanos(&text) {
                assert!(
                    exact > u128::from(u64::MAX),
                    "{text:?} is {exact} ns, yet refused: {e}"
                );
            }
        }
    }
}

/// The nanoseconds `DIGITS[.DIGITS]UNIT` stands for, worked out apart from the parser, for
/// the common units: `Some(None)` when that is not a whole number; `None` for other text.
fn exact_nanos(text: &str) -> Option<Option<u128>> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let unit: u128 = match unit.trim() {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.len() > 30 || whole.len() > 30 {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let value: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    let scaled = value.checked_mul(unit)?;
    Some((scaled % scale == 0).then_some(scaled / scale))
}
