//! Inputs the fuzz targets once failed on, kept so they never fail again. Each names the
//! target and what was wrong.

/// `config`: a YAML key with line breaks (here a flow mapping's key, whose carriage returns
/// YAML folds into line feeds) was echoed raw into the error's field path, so the one-line
/// error the binary prints spanned several lines. Control characters are now escaped.
#[test]
fn config_error_for_a_key_with_line_breaks_is_one_line() {
    sluice_invariants::config(b"{p\r\rs");
    sluice_invariants::config(
        b"key:\n  from: [bearer, ip, header:Client-Id]\n  max_length: 64\n\
          trusted_proxies: [10.0.0.0/8, \"::1\"]\nclient_ip_header: forwarded\n\
          ipv6_prefix: 56\ncosts:\n  - {p\r\r\r\r\r\r\r\rath: /a, cost: 1}\n",
    );
}

/// `quota`: a duration with more zero decimals than a `u64` power of ten holds
/// (`0.000…0min`, exactly 0) was refused as finer than a nanosecond; so was
/// `1.000000000000000000000s`. Durations now drop a fraction's trailing zeros first.
#[test]
fn durations_with_many_zero_decimals_are_read() {
    sluice_invariants::quota(b"0.000000000000000000000000min");
    sluice_invariants::quota(b"1.000000000000000000000s");
}
