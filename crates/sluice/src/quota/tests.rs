use super::*;

#[test]
fn durations_exactly_in_every_unit() {
    let ns = Duration::from_nanos;
    let cases = [
        ("100ms", ns(100_000_000)),
        ("1.5s", ns(1_500_000_000)),
        ("1.1s", ns(1_100_000_000)),
        (".5s", ns(500_000_000)),
        ("0.000000001s", ns(1)),
        ("2min", Duration::from_secs(120)),
        ("2m", Duration::from_secs(120)),
        ("1 day", Duration::from_secs(86_400)),
        ("250us", ns(250_000)),
        ("250µs", ns(250_000)),
        ("7ns", ns(7)),
        (" 3 seconds ", Duration::from_secs(3)),
        ("18446744073709551615ns", ns(u64::MAX)),
        // More zero decimals than a u64 power of ten holds (found by fuzzing).
        ("1.000000000000000000000s", Duration::from_secs(1)),
        ("2.50000000000000000000000000min", Duration::from_secs(150)),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_duration(text), Ok(expected), "{text:?}");
    }
    for zero in [
        "0",
        "0.0",
        "00",
        "0s",
        "0ms",
        ".0s",
        "0.000000000000000000000000min",
    ] {
        assert_eq!(parse_duration(zero), Ok(Duration::ZERO), "{zero:?}");
    }
}

#[test]
fn durations_refused() {
    let refusal = |text: &str| match parse_duration(text) {
        Err(DurationError::Malformed { .. }) => "malformed",
        Err(DurationError::TooPrecise(_)) => "too precise",
        Err(DurationError::Overflow(_)) => "overflow",
        Ok(_) => "accepted",
    };
    for text in ["", "5", "s", "-1s", "1.2.3s", "1e3s", "10 parsecs", "soon", "."] {
        assert_eq!(refusal(text), "malformed", "{text:?}");
    }
    assert_eq!(refusal("1.5ns"), "too precise");
    assert_eq!(refusal("1.5000000000000000000000ns"), "too precise");
    assert_eq!(refusal("0.0000000000000000000001s"), "too precise");
    for text in ["18446744073709551616ns", "18446744074s", "1000000000h"] {
        assert_eq!(refusal(text), "overflow", "{text:?}");
    }
    let e = parse_duration("5").unwrap_err();
    assert!(e.to_string().contains("a unit is needed"), "{e}");
}
