//! Quota and duration text.

use sluice::{Quota, parse_duration};

/// `data` as quota text and as duration text: parsing never panics; a parsed quota prints as
/// text that parses back to the same quota, with its rate in lowest terms and a capacity of
/// 0 only when it denies everything; a parsed duration reads back from its nanoseconds.
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
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
