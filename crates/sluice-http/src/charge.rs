//! Paying after the response: the cost a response reports in one of its headers (tokens
//! generated, bytes sent, rows scanned) is charged to the request's key once the inner service
//! has answered, whatever is left ([`sluice::KeyedLimiter::charge_n`]): the key goes below
//! empty, and its next requests are refused until refill has repaid the debt.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName};

use crate::LimitBackend;

/// Which response header carries a request's cost after the fact, the most one response may
/// charge, and whether the header is taken out of the response the client sees.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{ChargeFrom, KeyPart, RateLimitLayer};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse()?).build()?;
/// let layer = RateLimitLayer::builder(limiter)
///     .key([KeyPart::Bearer])
///     .charge_from(ChargeFrom::new("x-usage".parse()?, 100_000).strip(true))
///     .build()?;
/// assert_eq!(layer.charge_counts().unwrap().charged, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChargeFrom {
    header: HeaderName,
    max: u64,
    strip: bool,
}

impl ChargeFrom {
    /// Charges the whole number in response header `header`, at most `max` a response; the
    /// header stays in the response.
    pub fn new(header: HeaderName, max: u64) -> Self {
        Self {
            header,
            max,
            strip: false,
        }
    }

    /// Whether the header is removed from the response once read.
    pub fn strip(mut self, strip: bool) -> Self {
        self.strip = strip;
        self
    }

    /// The header read.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }
}

/// What the layer's charges came to, since it was built.
///
/// # Example
/// ```
/// let counts = sluice_http::ChargeCounts::default();
/// assert_eq!(counts.units, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChargeCounts {
    /// Responses whose cost was charged (by a store that answers later, such as Redis: sent to
    /// it; its failures are logged by the backend).
    pub charged: u64,
    /// Units charged in all (as asked of the backend: each key's floor may take less).
    pub units: u64,
    /// Responses whose cost was above the maximum, charged the maximum.
    pub capped: u64,
    /// Responses whose header was not a whole number (or was sent twice): nothing charged.
    pub malformed: u64,
    /// Responses whose cost the backend did not take (it takes no charges, or failed).
    pub uncharged: u64,
}

/// Where a layer counts its charges ([`ChargeCounts`]): shared by its clones, and by the
/// layers built with it, so a server that rebuilds its layer on a reload keeps counting from
/// where it was ([`crate::RateLimitBuilder::charge_tally`]).
///
/// # Example
/// ```
/// let tally = sluice_http::ChargeTally::default();
/// assert_eq!(tally.counts().charged, 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ChargeTally(Arc<Tallies>);

#[derive(Debug, Default)]
struct Tallies {
    charged: AtomicU64,
    units: AtomicU64,
    capped: AtomicU64,
    malformed: AtomicU64,
    uncharged: AtomicU64,
}

impl ChargeTally {
    /// The counts so far.
    pub fn counts(&self) -> ChargeCounts {
        let t = &self.0;
        ChargeCounts {
            charged: t.charged.load(Ordering::Relaxed),
            units: t.units.load(Ordering::Relaxed),
            capped: t.capped.load(Ordering::Relaxed),
            malformed: t.malformed.load(Ordering::Relaxed),
            uncharged: t.uncharged.load(Ordering::Relaxed),
        }
    }
}

/// The layer's charging: its settings and where it counts.
pub(crate) struct Charger {
    from: ChargeFrom,
    tally: ChargeTally,
}

impl Charger {
    pub(crate) fn new(from: ChargeFrom, tally: ChargeTally) -> Self {
        Self { from, tally }
    }

    /// Reads the cost from a response's `headers` (removing the header if asked) and charges
    /// it to `key`.
    pub(crate) fn settle(&self, backend: &dyn LimitBackend, key: &str, headers: &mut HeaderMap) {
        let Some(cost) = self.cost(headers) else {
            return;
        };
        if cost == 0 {
            return;
        }
        let t = &self.tally.0;
        if backend.charge(key, cost) {
            t.charged.fetch_add(1, Ordering::Relaxed);
            t.units.fetch_add(cost, Ordering::Relaxed);
        } else {
            t.uncharged.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Removes the cost header from a response charged to nobody (a bypassed key), if asked.
    pub(crate) fn strip(&self, headers: &mut HeaderMap) {
        if self.from.strip {
            headers.remove(&self.from.header);
        }
    }

    /// The cost a response reports, capped at the maximum; `None` if it reports none, or
    /// nothing readable (counted).
    fn cost(&self, headers: &mut HeaderMap) -> Option<u64> {
        let header = &self.from.header;
        let mut values = headers.get_all(header).iter();
        let (first, second) = (values.next()?, values.next());
        let read = match (second, first.to_str()) {
            (None, Ok(text)) => whole_number(text.trim()),
            _ => None,
        };
        if self.from.strip {
            headers.remove(header);
        }
        let Some(cost) = read else {
            self.tally.0.malformed.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        Some(match cost {
            Ok(cost) if cost <= self.from.max => cost,
            // Above the maximum, or beyond any u64.
            _ => {
                self.tally.0.capped.fetch_add(1, Ordering::Relaxed);
                self.from.max
            }
        })
    }

    pub(crate) fn counts(&self) -> ChargeCounts {
        self.tally.counts()
    }
}

/// A non-empty run of ASCII digits: its value, or `Err` if it is beyond a u64 (still a
/// number: capped, not malformed); `None` for anything else (a sign, a fraction, spaces).
fn whole_number(text: &str) -> Option<Result<u64, ()>> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().map_err(drop))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charger(max: u64, strip: bool) -> Charger {
        let from = ChargeFrom::new(HeaderName::from_static("x-usage"), max).strip(strip);
        Charger::new(from, ChargeTally::default())
    }

    fn cost_of(charger: &Charger, values: &[&str]) -> (Option<u64>, HeaderMap) {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-usage", value.parse().unwrap());
        }
        (charger.cost(&mut headers), headers)
    }

    #[test]
    fn reads_whole_numbers_caps_huge_ones_and_counts_the_rest() {
        let c = charger(1_000, false);
        assert_eq!(cost_of(&c, &["42"]).0, Some(42));
        assert_eq!(cost_of(&c, &[" 7 "]).0, Some(7));
        assert_eq!(cost_of(&c, &["5000"]).0, Some(1_000));
        assert_eq!(cost_of(&c, &["99999999999999999999999999"]).0, Some(1_000));
        for bad in ["-3", "1.5", "", "0x10", "1 2", "ten"] {
            assert_eq!(cost_of(&c, &[bad]).0, None, "{bad:?}");
        }
        assert_eq!(cost_of(&c, &["1", "2"]).0, None, "sent twice");
        assert_eq!(cost_of(&c, &[]).0, None);
        let counts = c.counts();
        assert_eq!((counts.capped, counts.malformed), (2, 7));
    }

    #[test]
    fn strips_the_header_when_asked_and_only_then() {
        let (_, kept) = cost_of(&charger(10, false), &["3"]);
        assert!(kept.contains_key("x-usage"));
        let (_, stripped) = cost_of(&charger(10, true), &["3"]);
        assert!(!stripped.contains_key("x-usage"));
        let (_, stripped) = cost_of(&charger(10, true), &["junk", "3"]);
        assert!(!stripped.contains_key("x-usage"), "a malformed one too");
    }
}
