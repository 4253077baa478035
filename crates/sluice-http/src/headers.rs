//! The response fields that tell a client its limit: `Retry-After`, the IETF draft's
//! `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10), and the older
//! `X-RateLimit-*` trio.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::LocalKey;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use sluice::{Decision, Quota};

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The largest number of seconds written (RFC 9111's 2^31): a quota that never refills
/// would otherwise say "retry in 584 years", which some clients cannot parse.
const MAX_SECS: u64 = 1 << 31;

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(nanos: u64) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC).min(MAX_SECS)
}

/// The numbers a response reports, taken from a decision and the key's quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateFields {
    /// The policy: `q` units per `w` seconds (the burst and the time to refill it from empty).
    quota: u64,
    window: Option<u64>,
    remaining: u64,
    reset: u64,
    /// Set on a denial, at least 1.
    retry_after: Option<u64>,
}

impl RateFields {
    pub(crate) fn new(decision: &Decision, quota: Option<Quota>) -> Self {
        let retry_after = (!decision.is_allowed()).then(|| ceil_secs(decision.retry_after_nanos()).max(1));
        Self {
            quota: decision.limit(),
            window: window(quota),
            remaining: decision.remaining(),
            reset: ceil_secs(decision.reset_after_nanos()),
            retry_after,
        }
    }

    /// For a cost that can never be admitted: the policy, nothing left, no time to retry.
    pub(crate) fn never(quota: Option<Quota>, capacity: u64) -> Self {
        Self {
            quota: capacity,
            window: window(quota),
            remaining: 0,
            reset: 0,
            retry_after: None,
        }
    }

    /// Prints the fields' values, so what is left to carry to the response is plain values.
    /// The two that depend only on the policy and the quota come from `policy_values`.
    pub(crate) fn render(&self, policy_id: u64, policy: &str) -> Rendered {
        let (policy_value, limit) = policy_values(policy_id, policy, self.quota, self.window);
        let mut text = Vec::with_capacity(policy.len() + 8 + digits(self.remaining) + digits(self.reset));
        put_policy(&mut text, policy);
        text.extend_from_slice(b";r=");
        put_u64(&mut text, self.remaining);
        text.extend_from_slice(b";t=");
        put_u64(&mut text, self.reset);
        Rendered {
            policy: policy_value,
            ratelimit: value(text),
            limit,
            fields: *self,
        }
    }
}

/// The fields of a key held to several limits, beside its answer's: the answer's place among
/// them, and every other one's place and fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedFields {
    pub(crate) place: usize,
    pub(crate) others: Vec<(usize, RateFields)>,
}

impl ListedFields {
    pub(crate) fn new(listed: &crate::SeveralLimits) -> Self {
        Self {
            place: listed.place,
            others: (listed.others.iter())
                .map(|(place, decision, quota)| (*place, RateFields::new(decision, *quota)))
                .collect(),
        }
    }
}

impl RateFields {
    /// Prints the fields of a key held to several limits: `RateLimit-Policy` and `RateLimit`
    /// list every one, this one first, each named by its place (`policy`, then `policy-2`...);
    /// the `X-RateLimit-*` trio and `Retry-After` are this one's. Printed afresh (no cache:
    /// such keys are few).
    pub(crate) fn render_listed(&self, policy: &str, listed: &ListedFields) -> Rendered {
        let (mut policies, mut limits) = (Vec::new(), Vec::new());
        let all = std::iter::once((listed.place, *self)).chain(listed.others.iter().copied());
        for (i, (place, fields)) in all.enumerate() {
            if i > 0 {
                policies.extend_from_slice(b", ");
                limits.extend_from_slice(b", ");
            }
            for text in [&mut policies, &mut limits] {
                text.push(b'"');
                text.extend_from_slice(policy.as_bytes());
                if place > 0 {
                    text.push(b'-');
                    put_u64(text, place as u64 + 1);
                }
                text.push(b'"');
            }
            policies.extend_from_slice(b";q=");
            put_u64(&mut policies, fields.quota);
            if let Some(w) = fields.window {
                policies.extend_from_slice(b";w=");
                put_u64(&mut policies, w);
            }
            limits.extend_from_slice(b";r=");
            put_u64(&mut limits, fields.remaining);
            limits.extend_from_slice(b";t=");
            put_u64(&mut limits, fields.reset);
        }
        Rendered {
            policy: HeaderValue::from_bytes(&policies).ok(),
            ratelimit: HeaderValue::from_bytes(&limits).ok(),
            limit: number(self.quota),
            fields: *self,
        }
    }
}

/// The policy's `w`: the seconds `quota` takes to refill from empty, at least 1. None when
/// the quota is unknown or admits nothing.
fn window(quota: Option<Quota>) -> Option<u64> {
    quota
        .filter(|q| !q.is_deny_all())
        .map(|q| ceil_secs(q.fill_time_nanos()).max(1))
}

/// The values a key's quota fixes under one policy: `RateLimit-Policy` and `X-RateLimit-Limit`.
#[derive(Clone)]
struct PolicyValues {
    policy: Option<HeaderValue>,
    limit: HeaderValue,
}

/// A thread's one-entry cache: the last key asked for and its value.
type LastOne<K, V> = RefCell<Option<(K, V)>>;

/// What the policy values depend on: the policy's id, the quota and the window.
type PolicyKey = (u64, u64, Option<u64>);

thread_local! {
    /// This thread's last policy values, by policy id, quota and window: consecutive responses
    /// under one quota share them, and a copy costs a reference count where printing costs an
    /// allocation.
    static LAST_POLICY: LastOne<PolicyKey, PolicyValues> = const { RefCell::new(None) };
}

/// The value of `key` in this thread's one-entry `cache`: a copy of the kept one when the key
/// is the same, else `build()`'s (kept for the next).
fn last_one<K: PartialEq, V: Clone>(
    cache: &'static LocalKey<LastOne<K, V>>,
    key: K,
    build: impl Fn() -> V,
) -> V {
    let cached = cache.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        if let Some((seen, value)) = last.as_ref()
            && *seen == key
        {
            return Some(value.clone());
        }
        let value = build();
        *last = Some((key, value.clone()));
        Some(value)
    });
    // None: this thread is exiting; build without the cache.
    cached.ok().flatten().unwrap_or_else(build)
}

/// `RateLimit-Policy` and `X-RateLimit-Limit` for `quota` units per `window` seconds under the
/// policy numbered `policy_id` and named `policy`.
fn policy_values(
    policy_id: u64,
    policy: &str,
    quota: u64,
    window: Option<u64>,
) -> (Option<HeaderValue>, HeaderValue) {
    let values = last_one(&LAST_POLICY, (policy_id, quota, window), || {
        let width = window.map_or(0, |w| 3 + digits(w));
        let mut text = Vec::with_capacity(policy.len() + 5 + digits(quota) + width);
        put_policy(&mut text, policy);
        text.extend_from_slice(b";q=");
        put_u64(&mut text, quota);
        if let Some(w) = window {
            text.extend_from_slice(b";w=");
            put_u64(&mut text, w);
        }
        PolicyValues {
            policy: value(text),
            limit: number(quota),
        }
    });
    (values.policy, values.limit)
}

/// The fields ready to be written into a response.
#[derive(Debug, Clone)]
pub(crate) struct Rendered {
    policy: Option<HeaderValue>,
    ratelimit: Option<HeaderValue>,
    limit: HeaderValue,
    fields: RateFields,
}

impl Rendered {
    /// Writes the fields; numbers below 10 000 are static strings.
    pub(crate) fn write(self, headers: &mut HeaderMap) {
        // Room for the six fields at once, so the table does not grow (and move every entry)
        // on the way; `reserve` itself keeps the map's fill under three quarters.
        headers.reserve(6);
        if let Some(policy) = self.policy {
            headers.insert(RATELIMIT_POLICY.clone(), policy);
        }
        if let Some(ratelimit) = self.ratelimit {
            headers.insert(RATELIMIT.clone(), ratelimit);
        }
        let fields = self.fields;
        headers.insert(X_LIMIT.clone(), self.limit);
        headers.insert(X_REMAINING.clone(), number(fields.remaining));
        headers.insert(X_RESET.clone(), number(fields.reset));
        if let Some(retry) = fields.retry_after {
            headers.insert(RETRY_AFTER, number(retry));
        }
    }
}

static SERVER_TIMING: HeaderName = HeaderName::from_static("server-timing");

/// The `Server-Timing` metric of a request that waited in its key's queue, in milliseconds
/// with microseconds: `ratelimit-wait;dur=250.013`.
pub(crate) const WAIT_METRIC: &str = "ratelimit-wait";

/// How long a request waited for capacity, in microseconds (at most about 71 minutes: past
/// any `max_wait`): four bytes, so the response future of a request that never waits does not
/// grow for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Waited(std::num::NonZeroU32);

impl Waited {
    /// `waited`, if it is a microsecond or more.
    pub(crate) fn of(waited: Duration) -> Option<Self> {
        let micros = u32::try_from(waited.as_micros()).unwrap_or(u32::MAX);
        std::num::NonZeroU32::new(micros).map(Self)
    }

    /// Adds it as a `Server-Timing` entry, after any the inner service wrote.
    pub(crate) fn write(self, headers: &mut HeaderMap) {
        let micros = u64::from(self.0.get());
        let mut text = Vec::with_capacity(WAIT_METRIC.len() + 24);
        text.extend_from_slice(WAIT_METRIC.as_bytes());
        text.extend_from_slice(b";dur=");
        put_u64(&mut text, micros / 1000);
        text.push(b'.');
        let fraction = micros % 1000;
        text.extend_from_slice(&[
            b'0' + (fraction / 100) as u8,
            b'0' + (fraction / 10 % 10) as u8,
            b'0' + (fraction % 10) as u8,
        ]);
        if let Ok(value) = HeaderValue::from_bytes(&text) {
            headers.append(SERVER_TIMING.clone(), value);
        }
    }
}

thread_local! {
    /// The header block of this thread's last denial, by policy id and fields. A flood of
    /// denials under one quota repeats the same fields, and copying a built map costs a
    /// fraction of building it.
    static LAST_DENIAL: LastOne<(u64, RateFields), HeaderMap> = const { RefCell::new(None) };
}

/// The header block of a denial with `fields` under the policy numbered `policy_id`: a copy
/// of this thread's last one when it is the same, else `build()`'s.
pub(crate) fn denial_headers(policy_id: u64, fields: RateFields, build: impl Fn() -> HeaderMap) -> HeaderMap {
    last_one(&LAST_DENIAL, (policy_id, fields), build)
}

/// How many decimal digits `n` has.
fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

fn value(text: Vec<u8>) -> Option<HeaderValue> {
    // Printable ASCII only (the policy name is checked when the layer is built). Sized
    // exactly, so the value takes over the vector without another allocation.
    debug_assert_eq!(text.len(), text.capacity());
    HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
}

/// `0000` to `9999`, four digits each: small numbers are slices of it, not allocations.
static DIGITS: [u8; 40_000] = {
    let mut table = [0u8; 40_000];
    let mut n = 0;
    while n < 10_000 {
        table[4 * n] = b'0' + (n / 1000) as u8;
        table[4 * n + 1] = b'0' + (n / 100 % 10) as u8;
        table[4 * n + 2] = b'0' + (n / 10 % 10) as u8;
        table[4 * n + 3] = b'0' + (n % 10) as u8;
        n += 1;
    }
    table
};

/// A number as a header value, without allocating when it is below 10 000.
fn number(n: u64) -> HeaderValue {
    if n < 10_000 {
        let n = n as usize;
        let width = match n {
            0..10 => 1,
            10..100 => 2,
            100..1000 => 3,
            _ => 4,
        };
        let digits: &'static [u8] = &DIGITS[4 * n + 4 - width..4 * n + 4];
        if let Ok(text) = std::str::from_utf8(digits) {
            return HeaderValue::from_static(text);
        }
    }
    HeaderValue::from(n)
}

fn put_policy(text: &mut Vec<u8>, policy: &str) {
    text.push(b'"');
    text.extend_from_slice(policy.as_bytes());
    text.push(b'"');
}

/// Prints a number in decimal.
fn put_u64(text: &mut Vec<u8>, n: u64) {
    text.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

static NEXT_POLICY_ID: AtomicU64 = AtomicU64::new(0);

/// A number no other policy of this process has: the per-thread caches above are keyed by it.
pub(crate) fn next_policy_id() -> u64 {
    NEXT_POLICY_ID.fetch_add(1, Ordering::Relaxed)
}

/// A named policy whose rate-limit fields answers carry, for front ends that write them
/// somewhere other than a response of the layer (the rate-limit service's
/// `response_headers_to_add`).
///
/// # Example
/// ```
/// use sluice::Decision;
/// use sluice_http::FieldPolicy;
/// let policy = FieldPolicy::new("per_user").unwrap();
/// let fields = policy.fields(&Decision::denied(10, 0, 2_000_000_000, 500_000_000), Some("10/2s".parse()?));
/// assert_eq!(fields["ratelimit-policy"], "\"per_user\";q=10;w=2");
/// assert_eq!(fields["retry-after"], "1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct FieldPolicy {
    id: u64,
    name: String,
}

impl FieldPolicy {
    /// A policy named `name`: printable ASCII without `"` or `\`, as a structured-field
    /// string needs; `None` otherwise.
    pub fn new(name: impl Into<String>) -> Option<Self> {
        let name = name.into();
        valid_policy_name(&name).then(|| Self {
            id: next_policy_id(),
            name,
        })
    }

    /// The policy's name, as its fields write it.
    ///
    /// ```
    /// assert_eq!(sluice_http::FieldPolicy::new("per_user").unwrap().name(), "per_user");
    /// ```
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fields of `decision` under `quota`: `RateLimit-Policy`, `RateLimit`, the
    /// `X-RateLimit-*` trio and, on a denial, `Retry-After`.
    pub fn fields(&self, decision: &Decision, quota: Option<Quota>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        RateFields::new(decision, quota)
            .render(self.id, &self.name)
            .write(&mut headers);
        headers
    }
}

/// Whether a policy name can be written as a structured-field string.
pub(crate) fn valid_policy_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(fields: RateFields) -> Vec<(String, String)> {
        let mut headers = HeaderMap::new();
        fields.render(0, "default").write(&mut headers);
        let mut pairs: Vec<_> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        pairs.sort();
        pairs
    }

    #[test]
    fn denial_fields() {
        let quota: Quota = "1.1/s".parse().unwrap();
        let decision = Decision::denied(2, 0, 1_818_181_819, 909_090_910);
        let pairs = written(RateFields::new(&decision, Some(quota)));
        let expect = [
            ("ratelimit", "\"default\";r=0;t=2"),
            ("ratelimit-policy", "\"default\";q=2;w=2"),
            ("retry-after", "1"),
            ("x-ratelimit-limit", "2"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "2"),
        ];
        let expect: Vec<_> = expect
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(pairs, expect);
    }

    #[test]
    fn retry_after_is_never_zero_and_rounds_up() {
        let tiny = Decision::denied(100, 0, 10_000_000, 1);
        assert_eq!(RateFields::new(&tiny, None).retry_after, Some(1));
        let over = Decision::denied(1, 0, 10_000_000_000, 10_000_000_001);
        assert_eq!(RateFields::new(&over, None).retry_after, Some(11));
        let never = Decision::denied(0, 0, 0, u64::MAX);
        assert_eq!(RateFields::new(&never, None).retry_after, Some(1 << 31));
        let allowed = Decision::allowed(10, 9, 100_000_000);
        assert_eq!(RateFields::new(&allowed, None).retry_after, None);
    }

    #[test]
    fn numbers_as_header_values() {
        for n in [
            0,
            5,
            9,
            10,
            42,
            99,
            100,
            999,
            1000,
            9999,
            10_000,
            123_456,
            u64::MAX,
        ] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
    }

    #[test]
    fn policy_values_follow_the_policy_and_the_quota() {
        let fields = |quota, window| RateFields {
            quota,
            window,
            remaining: 1,
            reset: 1,
            retry_after: None,
        };
        let written = |policy_id, name, f: RateFields| {
            let mut headers = HeaderMap::new();
            f.render(policy_id, name).write(&mut headers);
            let get = |k: &str| headers.get(k).map(|v| v.to_str().unwrap().to_string());
            (get("ratelimit-policy"), get("x-ratelimit-limit"))
        };
        let some = |a: &str, b: &str| (Some(a.to_string()), Some(b.to_string()));
        // One thread, consecutive responses: each gets its own policy's and quota's values.
        assert_eq!(written(7, "a", fields(5, Some(2))), some("\"a\";q=5;w=2", "5"));
        assert_eq!(written(7, "a", fields(5, Some(2))), some("\"a\";q=5;w=2", "5"));
        assert_eq!(written(7, "a", fields(6, Some(2))), some("\"a\";q=6;w=2", "6"));
        assert_eq!(written(7, "a", fields(6, Some(3))), some("\"a\";q=6;w=3", "6"));
        assert_eq!(written(8, "b", fields(6, Some(3))), some("\"b\";q=6;w=3", "6"));
        assert_eq!(written(8, "b", fields(6, None)), some("\"b\";q=6", "6"));
        assert_eq!(
            written(8, "b", fields(123_456, Some(3))),
            some("\"b\";q=123456;w=3", "123456")
        );
    }

    #[test]
    fn numbers_print_in_decimal() {
        for n in [0, 7, 10, 99, 100, 12345, u64::MAX] {
            let mut text = Vec::new();
            put_u64(&mut text, n);
            assert_eq!(text.len(), digits(n));
            assert_eq!(String::from_utf8(text).unwrap(), n.to_string());
        }
    }

    #[test]
    fn policy_names() {
        assert!(valid_policy_name("default"));
        assert!(valid_policy_name("per account"));
        assert!(!valid_policy_name("a\"b"));
        assert!(!valid_policy_name(""));
    }
}
