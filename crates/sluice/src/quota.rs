//! Quotas: a capacity (burst) and a rate held exactly as a count per period.

use std::fmt;
use std::num::NonZeroU64;
use std::str::FromStr;
use std::time::Duration;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The largest `capacity × reduced period` a quota may have: keeps every algorithm's scaled
/// arithmetic inside 63 bits with room to spare (see [`Quota::reduced_rate`]).
pub const MAX_SCALED_BURST: u64 = 1 << 60;

/// How much may be admitted, and how fast it comes back.
///
/// The rate is `count` per `period`, held as integers: `1.1/s` is 11 per 10 s and `0.1/s` is
/// 1 per 10 s, so no float drifts over days. `capacity` is the burst: the most that can be
/// admitted at once. A quota of capacity 0 and rate 0 denies everything ([`Quota::deny_all`]).
///
/// Written as `COUNT/PERIOD [burst N] [debt N]`, where COUNT may have decimals and PERIOD is a
/// unit (`ns`, `us`, `ms`, `s`, `min`, `h`, `day`, with long forms and plurals) optionally
/// preceded by a whole number (`5/10s`). Without `burst`, the capacity is the count rounded up
/// (at least 1).
///
/// `debt` is how far below empty a charge made after the fact may take a limit
/// ([`crate::RateLimiter::charge_n`]): by default one period's worth (the count), so a
/// post-paid cost is repaid by at most one period of refill before the key is admitted again.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::Quota;
/// let q: Quota = "1.1/s".parse()?;
/// assert_eq!((q.count(), q.period()), (11, Duration::from_secs(10)));
/// assert_eq!(q.capacity(), 2);
/// let q: Quota = "10/min burst 20".parse()?;
/// assert_eq!(q.capacity(), 20);
/// assert!("0/s burst 3".parse::<Quota>().is_err());
/// let q: Quota = "10/s debt 100".parse()?;
/// assert_eq!((q.max_debt(), q.to_string().as_str()), (100, "10/s debt 100"));
/// assert_eq!("10/s debt 5 burst 20".parse::<Quota>()?, "10/s burst 20 debt 5".parse()?);
/// assert!("10/s burst 2 debt 5 burst 3".parse::<Quota>().is_err());
/// # Ok::<(), sluice::QuotaError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    capacity: u64,
    count: u64,
    period_ns: u64,
    reduced_count: u64,
    reduced_period: u64,
    /// Units a charge may take below empty.
    max_debt: u64,
}

/// Why a quota is malformed or impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// The text is not of the form `COUNT/PERIOD [burst N] [debt N]`.
    #[error(
        "malformed quota {input:?}: {reason} (expected COUNT/PERIOD [burst N] [debt N], e.g. \"100/s\", \"1.1/s\", \"10/min burst 20\")"
    )]
    Malformed {
        /// The text given.
        input: String,
        /// What was wrong with it.
        reason: String,
    },
    /// The period is zero.
    #[error("the period of a quota must be longer than zero")]
    ZeroPeriod,
    /// The rate is positive but the capacity is zero: nothing could ever be admitted.
    #[error(
        "capacity 0 with a non-zero rate admits nothing; use a capacity of at least 1, or 0/s for a quota that denies everything"
    )]
    ZeroCapacity,
    /// The rate is zero but the capacity is positive: a burst that never refills.
    #[error("a zero rate with capacity {0} would never refill; use 0/s without a burst to deny everything")]
    ZeroRate(u64),
    /// A number does not fit.
    #[error("quota too large: {0}")]
    Overflow(String),
}

fn overflow(what: &str) -> QuotaError {
    QuotaError::Overflow(what.to_string())
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Quota {
    /// `count` per `period`, with a capacity (burst) equal to `count` (at least 1).
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// let q = sluice::Quota::new(5000, Duration::from_secs(3600))?;
    /// assert_eq!(q.capacity(), 5000);
    /// # Ok::<(), sluice::QuotaError>(())
    /// ```
    pub fn new(count: u64, period: Duration) -> Result<Self, QuotaError> {
        let period_ns = u64::try_from(period.as_nanos()).map_err(|_| overflow("period exceeds 584 years"))?;
        Self::from_parts(count.max(1), count, period_ns)
    }

    /// `count` per second, burst `count`.
    ///
    /// # Example
    /// ```
    /// use std::num::NonZeroU64;
    /// let q = sluice::Quota::per_second(NonZeroU64::new(100).unwrap());
    /// assert_eq!(q.to_string(), "100/s");
    /// ```
    pub fn per_second(count: NonZeroU64) -> Self {
        Self::per_unit(count, NANOS_PER_SEC)
    }

    /// `count` per minute, burst `count`.
    ///
    /// # Example
    /// ```
    /// use std::num::NonZeroU64;
    /// assert_eq!(sluice::Quota::per_minute(NonZeroU64::MIN).to_string(), "1/min");
    /// ```
    pub fn per_minute(count: NonZeroU64) -> Self {
        Self::per_unit(count, 60 * NANOS_PER_SEC)
    }

    /// `count` per hour, burst `count`.
    ///
    /// # Example
    /// ```
    /// use std::num::NonZeroU64;
    /// assert_eq!(sluice::Quota::per_hour(NonZeroU64::MIN).to_string(), "1/h");
    /// ```
    pub fn per_hour(count: NonZeroU64) -> Self {
        Self::per_unit(count, 3600 * NANOS_PER_SEC)
    }

    fn per_unit(count: NonZeroU64, unit_ns: u64) -> Self {
        let count = count.get().min(MAX_SCALED_BURST);
        let g = gcd(count, unit_ns);
        let reduced_period = unit_ns / g;
        // A burst too large to represent is clamped to the largest that is.
        let capacity = count.min(MAX_SCALED_BURST / reduced_period);
        Self {
            capacity,
            count,
            period_ns: unit_ns,
            reduced_count: count / g,
            reduced_period,
            max_debt: default_debt(count, reduced_period),
        }
    }

    /// A quota that admits nothing, ever (the "unknown key gets 0" quota).
    ///
    /// # Example
    /// ```
    /// assert!(sluice::Quota::deny_all().is_deny_all());
    /// ```
    pub const fn deny_all() -> Self {
        Self {
            capacity: 0,
            count: 0,
            period_ns: NANOS_PER_SEC,
            reduced_count: 0,
            reduced_period: 1,
            max_debt: 0,
        }
    }

    /// The same rate with a different capacity (burst).
    ///
    /// # Example
    /// ```
    /// let q = "10/min".parse::<sluice::Quota>()?.with_capacity(20)?;
    /// assert_eq!(q.to_string(), "10/min burst 20");
    /// # Ok::<(), sluice::QuotaError>(())
    /// ```
    pub fn with_capacity(self, capacity: u64) -> Result<Self, QuotaError> {
        let quota = Self::from_parts(capacity, self.count, self.period_ns)?;
        // The same rate: a debt it held exactly it still holds.
        Ok(Self {
            max_debt: self.max_debt,
            ..quota
        })
    }

    /// The same quota with another floor for charges made after the fact: a charge may take
    /// it down to `max_debt` units below empty (0: never below empty).
    ///
    /// # Example
    /// ```
    /// let q = "10/min".parse::<sluice::Quota>()?;
    /// assert_eq!(q.max_debt(), 10); // one period's worth
    /// assert_eq!(q.with_max_debt(0)?.to_string(), "10/min debt 0");
    /// # Ok::<(), sluice::QuotaError>(())
    /// ```
    ///
    /// # Errors
    /// [`QuotaError::Overflow`] if the debt cannot be held exactly (`max_debt × period /
    /// gcd(count, period)` must be at most 2^60, as for the burst); a quota that denies
    /// everything takes no debt.
    pub fn with_max_debt(self, max_debt: u64) -> Result<Self, QuotaError> {
        if self.is_deny_all() && max_debt > 0 {
            return Err(overflow("a quota that denies everything takes no debt"));
        }
        if u128::from(max_debt) * u128::from(self.reduced_period) > u128::from(MAX_SCALED_BURST) {
            return Err(overflow(&format!(
                "debt {max_debt} at {} per {} ns cannot be held exactly \
                 (debt × period / gcd(count, period) must be at most 2^60)",
                self.count, self.period_ns
            )));
        }
        Ok(Self { max_debt, ..self })
    }

    /// How many units below empty a charge may take this quota (see
    /// [`Quota::with_max_debt`]).
    pub const fn max_debt(&self) -> u64 {
        self.max_debt
    }

    fn from_parts(capacity: u64, count: u64, period_ns: u64) -> Result<Self, QuotaError> {
        if period_ns == 0 {
            return Err(QuotaError::ZeroPeriod);
        }
        match (count, capacity) {
            (0, 0) => return Ok(Self::deny_all()),
            (0, c) => return Err(QuotaError::ZeroRate(c)),
            (_, 0) => return Err(QuotaError::ZeroCapacity),
            _ => {}
        }
        let g = gcd(count, period_ns);
        let quota = Self {
            capacity,
            count,
            period_ns,
            reduced_count: count / g,
            reduced_period: period_ns / g,
            max_debt: default_debt(count, period_ns / g),
        };
        let scaled_burst = u128::from(capacity) * u128::from(quota.reduced_period);
        if scaled_burst > u128::from(MAX_SCALED_BURST) {
            return Err(overflow(&format!(
                "burst {capacity} at {count} per {period_ns} ns cannot be held exactly \
                 (capacity × period / gcd(count, period) must be at most 2^60)"
            )));
        }
        Ok(quota)
    }

    /// The most that can be admitted at once.
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The count of the rate, as written (decimals removed: `1.1/s` has count 11).
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period of the rate, as written (decimals removed: `1.1/s` has period 10 s).
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The period in nanoseconds.
    pub const fn period_nanos(&self) -> u64 {
        self.period_ns
    }

    /// Whether this quota admits nothing.
    pub const fn is_deny_all(&self) -> bool {
        self.count == 0
    }

    /// The rate in lowest terms, `(c, p)`: `c` units every `p` nanoseconds, so one unit every
    /// `p / c` ns exactly. Algorithms count time in units of `1/c` ns, in which one unit of
    /// cost is exactly `p` long. For [`Quota::deny_all`] this is `(0, 1)`.
    pub const fn reduced_rate(&self) -> (u64, u64) {
        (self.reduced_count, self.reduced_period)
    }

    /// The rate in lowest terms counted in a coarser unit of time: `(k, q)` is `k` units every
    /// `q` spans of `unit_nanos` ns (a Redis script counts in microseconds: `unit_nanos` 1000).
    ///
    /// # Example
    /// ```
    /// let quota: sluice::Quota = "3/s".parse()?;
    /// assert_eq!(quota.reduced_rate_per(1_000), (3, 1_000_000)); // 3 every 10^6 µs
    /// # Ok::<(), sluice::QuotaError>(())
    /// ```
    pub fn reduced_rate_per(&self, unit_nanos: u64) -> (u128, u64) {
        let (c, p) = self.reduced_rate();
        // c and p share no factor, so the factor c·unit and p share is that of unit and p.
        let g = gcd(unit_nanos.max(1), p);
        (u128::from(c) * u128::from(unit_nanos.max(1) / g), p / g)
    }

    /// Nanoseconds to refill the whole capacity from empty, rounded up (at least 1): the
    /// window length of the window algorithms.
    pub fn fill_time_nanos(&self) -> u64 {
        if self.reduced_count == 0 {
            return 1;
        }
        let scaled = u128::from(self.capacity) * u128::from(self.reduced_period);
        let ns = scaled.div_ceil(u128::from(self.reduced_count));
        u64::try_from(ns).unwrap_or(u64::MAX).max(1)
    }
}

/// One period's worth (`count`), or as much of it as the scaled arithmetic holds exactly.
const fn default_debt(count: u64, reduced_period: u64) -> u64 {
    let most = MAX_SCALED_BURST / reduced_period;
    if count < most { count } else { most }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 7] = [
            (86_400 * NANOS_PER_SEC, "day"),
            (3600 * NANOS_PER_SEC, "h"),
            (60 * NANOS_PER_SEC, "min"),
            (NANOS_PER_SEC, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ];
        let (size, unit) = UNITS
            .iter()
            .copied()
            .find(|(size, _)| self.period_ns.is_multiple_of(*size))
            .unwrap_or((1, "ns"));
        let multiple = self.period_ns / size;
        if multiple == 1 {
            write!(f, "{}/{unit}", self.count)?;
        } else {
            write!(f, "{}/{multiple}{unit}", self.count)?;
        }
        if self.capacity != self.count.max(1) {
            write!(f, " burst {}", self.capacity)?;
        }
        if self.max_debt != default_debt(self.count, self.reduced_period) {
            write!(f, " debt {}", self.max_debt)?;
        }
        Ok(())
    }
}

/// The units of quota periods and durations, in nanoseconds.
fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "microsecond" | "microseconds" => 1_000,
        "ms" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => NANOS_PER_SEC,
        "m" | "min" | "mins" | "minute" | "minutes" => 60 * NANOS_PER_SEC,
        "h" | "hr" | "hour" | "hours" => 3600 * NANOS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Why a decimal number could not be read exactly.
enum DecimalError {
    NotDecimal,
    TooManyDecimals,
    TooManyDigits,
}

/// A non-negative decimal (`12`, `1.25`, `.5`, `3.`) read exactly: its digits as an integer,
/// and the power of ten that divides them (`1.25` is `(125, 100)`). A quota's count keeps its
/// decimals as written (`1.10/s` is 110 per 100 s).
fn decimal(number: &str) -> Result<(u64, u64), DecimalError> {
    decimal_with(number, false)
}

/// [`decimal`], dropping the fraction's trailing zeros first if asked (`1.50` is `(15, 10)`),
/// so a value with more zero decimals than a `u64` power of ten holds is still read.
fn decimal_with(number: &str, drop_trailing_zeros: bool) -> Result<(u64, u64), DecimalError> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole.chars().all(|c| c.is_ascii_digit())
        || !fraction.chars().all(|c| c.is_ascii_digit())
    {
        return Err(DecimalError::NotDecimal);
    }
    let fraction = if drop_trailing_zeros {
        fraction.trim_end_matches('0')
    } else {
        fraction
    };
    let scale = u32::try_from(fraction.len())
        .ok()
        .and_then(|d| 10u64.checked_pow(d))
        .ok_or(DecimalError::TooManyDecimals)?;
    let digits = format!("{whole}{fraction}");
    match digits.trim_start_matches('0') {
        "" => Ok((0, scale)),
        significant => Ok((
            significant.parse().map_err(|_| DecimalError::TooManyDigits)?,
            scale,
        )),
    }
}

/// Why a duration could not be read (see [`parse_duration`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The text is not a number followed by a unit.
    #[error("malformed duration {input:?}: {reason} (e.g. \"100ms\", \"1.5s\", \"2min\")")]
    Malformed {
        /// The text given.
        input: String,
        /// What was wrong with it.
        reason: &'static str,
    },
    /// The duration is not a whole number of nanoseconds (`1.5ns`).
    #[error("duration {0:?} is finer than a nanosecond")]
    TooPrecise(String),
    /// The duration is longer than 2^64 − 1 ns (584 years), the longest quota period too.
    #[error("duration {0:?} exceeds 584 years")]
    Overflow(String),
}

/// Reads a duration: a non-negative decimal number and a unit of quota periods (`ns`, `us`,
/// `ms`, `s`, `min`/`m`, `h`, `day`/`d`, with long forms and plurals), as in `100ms`, `1.5s`,
/// `2min`, `250 us`; or `0` alone. Exact: decimals are read as integers, never as floats, so
/// `1.1s` is 1 100 000 000 ns. At most 2^64 − 1 ns (584 years), like quota periods.
///
/// # Example
/// ```
/// use std::time::Duration;
/// use sluice::{DurationError, parse_duration};
/// assert_eq!(parse_duration("1.5s")?, Duration::from_millis(1500));
/// assert_eq!(parse_duration("0")?, Duration::ZERO);
/// assert!(matches!(parse_duration("10"), Err(DurationError::Malformed { .. })));
/// assert_eq!(parse_duration("1.5ns"), Err(DurationError::TooPrecise("1.5ns".into())));
/// # Ok::<(), DurationError>(())
/// ```
///
/// # Errors
/// [`DurationError`]: not a number and a unit, finer than a nanosecond, or too long.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let malformed = |reason| DurationError::Malformed {
        input: input.to_string(),
        reason,
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    // A duration is a value, not text as written: `1.000000000000000000000s` is 1 s, not
    // finer than a nanosecond (found by the quota fuzz target).
    let (value, scale) = decimal_with(number, true).map_err(|e| match e {
        DecimalError::NotDecimal => malformed("the number must be a non-negative decimal"),
        DecimalError::TooManyDecimals => DurationError::TooPrecise(input.to_string()),
        DecimalError::TooManyDigits => DurationError::Overflow(input.to_string()),
    })?;
    let unit_ns = match unit.trim() {
        "" if value == 0 => 0,
        "" => return Err(malformed("a unit is needed")),
        unit => unit_nanos(unit).ok_or_else(|| malformed("unknown unit (ns, us, ms, s, min, h or day)"))?,
    };
    // At most (2^64 − 1) × 86 400 × 10^9: far inside u128.
    let scaled = u128::from(value) * u128::from(unit_ns);
    if scaled % u128::from(scale) != 0 {
        return Err(DurationError::TooPrecise(input.to_string()));
    }
    let nanos =
        u64::try_from(scaled / u128::from(scale)).map_err(|_| DurationError::Overflow(input.to_string()))?;
    Ok(Duration::from_nanos(nanos))
}

impl FromStr for Quota {
    type Err = QuotaError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let malformed = |reason: &str| QuotaError::Malformed {
            input: input.to_string(),
            reason: reason.to_string(),
        };
        let text = input.trim();
        // `burst N` and `debt N` follow the rate, in either order.
        let (text, debt) = match text.split_once("debt") {
            Some((text, debt)) => (text.trim(), Some(debt.trim())),
            None => (text, None),
        };
        let (rate, burst) = match (text.split_once("burst"), debt.and_then(|d| d.split_once("burst"))) {
            (Some(_), Some(_)) => return Err(malformed("burst is given twice")),
            (Some((rate, burst)), None) => (rate.trim(), Some(burst.trim())),
            (None, Some((_, burst))) => (text, Some(burst.trim())),
            (None, None) => (text, None),
        };
        let debt = debt.map(|d| d.split_once("burst").map_or(d, |(d, _)| d.trim()));
        let (number, period) = rate
            .split_once('/')
            .ok_or_else(|| malformed("missing '/' between count and period"))?;
        let (number, period) = (number.trim(), period.trim());

        // COUNT: digits with an optional fraction, scaled to an integer.
        let (count, scale) = decimal(number).map_err(|e| match e {
            DecimalError::NotDecimal => malformed("the count must be a non-negative decimal number"),
            DecimalError::TooManyDecimals => overflow("count has too many decimals"),
            DecimalError::TooManyDigits => overflow("count has too many digits"),
        })?;

        // PERIOD: an optional whole multiple, then a unit.
        let split = period.find(|c: char| !c.is_ascii_digit()).unwrap_or(period.len());
        let (multiple, unit) = period.split_at(split);
        let multiple: u64 = if multiple.is_empty() {
            1
        } else {
            multiple
                .parse()
                .map_err(|_| overflow("period multiple too large"))?
        };
        let unit_ns = unit_nanos(unit.trim())
            .ok_or_else(|| malformed("unknown period unit (use ns, us, ms, s, min, h or day)"))?;
        let capacity = match burst {
            Some(b) => b
                .parse::<u64>()
                .map_err(|_| malformed("burst must be a whole number"))?,
            // The count rounded up, per written period.
            None if count == 0 => 0,
            None => count.div_ceil(scale).max(1),
        };
        // COUNT/(MULTIPLE UNIT) is `count` per `scale × multiple × unit` ns; kept as written
        // when that fits, else with the decimals' common factor taken out first
        // (`1.000000/day` is 1 per day, not 10^6 per 10^6 days).
        let in_ns = |count: u64, scale: u64| {
            multiple
                .checked_mul(unit_ns)
                .and_then(|p| p.checked_mul(scale))
                .map(|period_ns| (count, period_ns))
        };
        let g = gcd(count, scale).max(1);
        let (count, period_ns) = in_ns(count, scale)
            .or_else(|| in_ns(count / g, scale / g))
            .ok_or_else(|| {
                let unit = unit.trim();
                overflow(&if scale / g == 1 {
                    format!("period {multiple}{unit} exceeds 584 years (2^64 − 1 ns)")
                } else {
                    format!(
                        "{number}/{period} is {} per {} × {multiple}{unit}, a period beyond 584 years \
                         (2^64 − 1 ns); use fewer decimals",
                        count / g,
                        scale / g
                    )
                })
            })?;
        let quota = Self::from_parts(capacity, count, period_ns)?;
        match debt {
            Some(d) => quota.with_max_debt(
                d.parse::<u64>()
                    .map_err(|_| malformed("debt must be a whole number"))?,
            ),
            None => Ok(quota),
        }
    }
}

#[cfg(test)]
mod tests;
