//! The YAML config of `sluice serve`.

use sluice::{KeyedLimiter, Quota, TokenBucket};
use sluice_config::{Settings, parse_bytes};
use sluice_http::{MAX_KEY_LEN, RateLimitLayer, RouteCosts, TrustedProxies};

/// `data` as a config file: checking never panics; a refusal names a field and fits on one
/// line; accepted settings are within their documented ranges and the layer accepts them
/// (a config that validates is one the server can run).
///
/// # Example
/// ```
/// sluice_invariants::config(b"key:\n  from: [ip]\nipv6_prefix: 56\n");
/// sluice_invariants::config(b"{p\r\rs");
/// ```
pub fn config(data: &[u8]) {
    match parse_bytes(data) {
        Ok(settings) => settings_hold(&settings),
        Err(e) => {
            assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
            let line = e.to_string();
            assert!(!line.contains(['\n', '\r']), "not one line: {line:?}");
        }
    }
}

fn settings_hold(s: &Settings) {
    assert!(!s.key_parts.is_empty());
    assert!((1..=MAX_KEY_LEN).contains(&s.max_key_len), "{}", s.max_key_len);
    assert!(!s.default_key.is_empty() && s.default_key.len() <= s.max_key_len);
    assert!((1..=128).contains(&s.ipv6_prefix), "{}", s.ipv6_prefix);
    assert!(!s.idle_timeout.is_zero() && !s.limiter.refresh.is_zero());
    assert!(s.limiter.capacity >= 1);
    for q in [s.limiter.failsafe, s.limiter.unknown] {
        assert!(s.limiter.algorithm.check(&q).is_ok(), "{q}");
    }
    for (name, q) in &s.accounts {
        assert!(name.len() <= s.max_key_len, "{name:?}");
        assert!(s.limiter.algorithm.check(q).is_ok(), "{name}: {q}");
    }
    assert!(s.bypass.iter().all(|key| key.len() <= s.max_key_len));
    let limiter = match KeyedLimiter::<String, _>::builder(TokenBucket, Quota::deny_all())
        .capacity(1)
        .shards(1)
        .build()
    {
        Ok(limiter) => limiter,
        Err(e) => panic!("a one-key limiter: {e}"),
    };
    let built = RateLimitLayer::builder(limiter)
        .key(s.key_parts.iter().cloned())
        .default_key(s.default_key.clone())
        .max_key_len(s.max_key_len)
        .trusted_proxies(TrustedProxies::new(s.trusted_proxies.iter().copied()))
        .client_ip_header(s.client_ip_header)
        .ipv6_prefix(s.ipv6_prefix)
        .bypass(s.bypass.iter().cloned())
        .costs(RouteCosts::new(s.costs.iter().cloned()))
        .build();
    if let Err(e) = built {
        panic!("checked settings the layer refuses: {e}");
    }
}
