//! The client behind trusted proxies against a plain model: forwarding lists of addresses
//! (trusted or not, with or without ports), `unknown` and obfuscated nodes, written as
//! `X-Forwarded-For` or `Forwarded` across several header lines, walked from the right.

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use sluice_http::{ClientIpError, ClientIpHeader, TrustedProxies};

#[derive(Debug, Clone)]
enum Hop {
    Addr(IpAddr, Option<u16>),
    Unknown,
    Obfuscated(String),
}

const TRUSTED: [&str; 2] = ["10.0.0.0/8", "2001:db8:ffff::/48"];

fn proxies() -> TrustedProxies {
    TrustedProxies::new(TRUSTED.map(|net| net.parse().unwrap()))
}

fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (0u8..4).prop_map(|n| format!("10.0.0.{n}")),
        (0u8..4).prop_map(|n| format!("198.51.100.{n}")),
        (0u8..4).prop_map(|n| format!("::ffff:198.51.100.{n}")),
        (0u16..4).prop_map(|n| format!("2001:db8:ffff::{n}")),
        (0u16..4).prop_map(|n| format!("2001:db8::{n}")),
    ]
    .prop_map(|text| text.parse().unwrap())
}

fn hop() -> impl Strategy<Value = Hop> {
    prop_oneof![
        6 => (address(), proptest::option::of(any::<u16>())).prop_map(|(ip, port)| Hop::Addr(ip, port)),
        1 => Just(Hop::Unknown),
        1 => "[a-z0-9._-]{1,5}".prop_map(Hop::Obfuscated),
    ]
}

fn xff(hop: &Hop) -> String {
    match hop {
        Hop::Addr(ip @ IpAddr::V4(_), Some(port)) => format!("{ip}:{port}"),
        Hop::Addr(ip @ IpAddr::V6(_), Some(port)) => format!("[{ip}]:{port}"),
        Hop::Addr(ip, None) => ip.to_string(),
        Hop::Unknown => "unknown".into(),
        Hop::Obfuscated(name) => format!("_{name}"),
    }
}

fn forwarded(hop: &Hop, variant: u8) -> String {
    let node = match hop {
        Hop::Addr(ip @ IpAddr::V4(_), None) => ip.to_string(),
        Hop::Addr(ip @ IpAddr::V6(_), None) => format!("\"[{ip}]\""),
        Hop::Addr(ip, Some(_)) => format!("\"{}\"", xff(&Hop::Addr(*ip, Some(4711))).replace("4711", "80")),
        other => xff(other),
    };
    match variant % 4 {
        0 => format!("for={node}"),
        1 => format!("For={node};proto=https"),
        2 => format!("by=10.0.0.1; for={node} ;host=\"a,b\""),
        _ => format!("proto=http;FOR={node}"),
    }
}

/// The right-to-left walk, on the list itself.
fn model(peer: IpAddr, hops: &[Hop], header: ClientIpHeader) -> Result<IpAddr, ClientIpError> {
    let trusted = |ip: IpAddr| {
        TRUSTED
            .iter()
            .any(|net| net.parse::<sluice_http::IpNet>().unwrap().contains(ip))
    };
    let peer = peer.to_canonical();
    if !trusted(peer) {
        return Ok(peer);
    }
    let mut nearest = None;
    for hop in hops.iter().rev() {
        match hop {
            Hop::Addr(ip, _) if trusted(ip.to_canonical()) => nearest = Some(ip.to_canonical()),
            Hop::Addr(ip, _) => return Ok(ip.to_canonical()),
            Hop::Unknown | Hop::Obfuscated(_) => return Err(ClientIpError::NoAddress(header)),
        }
    }
    nearest.ok_or(ClientIpError::Empty(header))
}

/// `hops` written as `header` lines, cut where `cuts` says.
fn lines(hops: &[Hop], header: ClientIpHeader, cuts: &[bool], variants: &[u8]) -> Vec<String> {
    let mut lines = vec![String::new()];
    for (i, hop) in hops.iter().enumerate() {
        let text = match header {
            ClientIpHeader::Forwarded => forwarded(hop, variants[i % variants.len()]),
            _ => xff(hop),
        };
        let line = lines.last_mut().unwrap();
        if !line.is_empty() {
            line.push_str(if i % 2 == 0 { ", " } else { "," });
        }
        line.push_str(&text);
        if cuts[i % cuts.len()] {
            lines.push(String::new());
        }
    }
    lines.retain(|l| !l.is_empty());
    lines
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn the_walk_matches_the_model(
        peer in address(),
        hops in proptest::collection::vec(hop(), 0..6),
        forwarded_header in any::<bool>(),
        cuts in proptest::collection::vec(any::<bool>(), 1..4),
        variants in proptest::collection::vec(any::<u8>(), 1..4),
    ) {
        let header = if forwarded_header { ClientIpHeader::Forwarded } else { ClientIpHeader::XForwardedFor };
        let lines = lines(&hops, header, &cuts, &variants);
        let mut headers = HeaderMap::new();
        for line in &lines {
            headers.append(header.name(), HeaderValue::from_str(line).unwrap());
        }
        let expected = if lines.is_empty() { Ok(peer.to_canonical()) } else { model(peer, &hops, header) };
        prop_assert_eq!(proxies().client_ip(peer, header, &headers), expected, "{:?}", lines);
    }
}
