//! The response fields that tell a client its limit: `Retry-After`, the IETF draft's
//! `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10), and the older
//! `X-RateLimit-*` trio.

use std::fmt::Write as _;

use bytes::BytesMut;
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use sluice::{Decision, Quota};

static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(nanos: u64) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC)
}

/// The numbers a response reports, taken from a decision and the key's quota.
#[derive(Debug, Clone, Copy)]
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
        let window = quota
            .filter(|q| !q.is_deny_all())
            .map(|q| ceil_secs(q.fill_time_nanos()).max(1));
        let retry_after = (!decision.is_allowed()).then(|| ceil_secs(decision.retry_after_nanos()).max(1));
        Self {
            quota: decision.limit(),
            window,
            remaining: decision.remaining(),
            reset: ceil_secs(decision.reset_after_nanos()),
            retry_after,
        }
    }

    /// For a cost that can never be admitted: the policy, nothing left, no time to retry.
    pub(crate) fn never(quota: Option<Quota>, capacity: u64) -> Self {
        Self {
            quota: capacity,
            window: quota
                .filter(|q| !q.is_deny_all())
                .map(|q| ceil_secs(q.fill_time_nanos()).max(1)),
            remaining: 0,
            reset: 0,
            retry_after: None,
        }
    }

    /// Writes the fields, all values in one buffer (one allocation for all of them).
    pub(crate) fn write(&self, policy: &str, headers: &mut HeaderMap) {
        let mut buf = BytesMut::with_capacity(96 + 2 * policy.len());
        let mut put = |headers: &mut HeaderMap, name: &HeaderName, value: std::fmt::Arguments<'_>| {
            // Writing to a BytesMut cannot fail; the values are printable ASCII.
            let _ = buf.write_fmt(value);
            if let Ok(value) = HeaderValue::from_maybe_shared(buf.split().freeze()) {
                headers.insert(name.clone(), value);
            }
        };
        match self.window {
            Some(w) => put(
                headers,
                &RATELIMIT_POLICY,
                format_args!("\"{policy}\";q={};w={w}", self.quota),
            ),
            None => put(
                headers,
                &RATELIMIT_POLICY,
                format_args!("\"{policy}\";q={}", self.quota),
            ),
        }
        put(
            headers,
            &RATELIMIT,
            format_args!("\"{policy}\";r={};t={}", self.remaining, self.reset),
        );
        put(headers, &X_LIMIT, format_args!("{}", self.quota));
        put(headers, &X_REMAINING, format_args!("{}", self.remaining));
        put(headers, &X_RESET, format_args!("{}", self.reset));
        if let Some(retry) = self.retry_after {
            put(headers, &RETRY_AFTER, format_args!("{retry}"));
        }
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
        fields.write("default", &mut headers);
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
        let allowed = Decision::allowed(10, 9, 100_000_000);
        assert_eq!(RateFields::new(&allowed, None).retry_after, None);
    }

    #[test]
    fn policy_names() {
        assert!(valid_policy_name("default"));
        assert!(valid_policy_name("per account"));
        assert!(!valid_policy_name("a\"b"));
        assert!(!valid_policy_name(""));
    }
}
