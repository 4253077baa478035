//! The client's address behind trusted proxies.

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use sluice_http::{ClientIpError, ClientIpHeader, IpNet, TrustedProxies};

use crate::input::{Input, header_lines};

pub(crate) const HEADERS: [ClientIpHeader; 3] = [
    ClientIpHeader::XForwardedFor,
    ClientIpHeader::Forwarded,
    ClientIpHeader::XRealIp,
];
pub(crate) const PEERS: [&str; 8] = [
    "10.0.0.1",
    "10.9.8.7",
    "::ffff:10.0.0.2",
    "2001:db8::1",
    "203.0.113.5",
    "::1",
    "192.0.2.1",
    "2001:db9::1",
];
pub(crate) const NETS: [&str; 4] = ["10.0.0.0/8", "2001:db8::/32", "::1", "192.0.2.0/24"];
/// Trusted by no choice of `NETS`.
const OUTSIDER: &str = "198.51.100.99";

fn parsed<T: std::str::FromStr>(text: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    match text.parse() {
        Ok(value) => value,
        Err(e) => panic!("{text:?}: {e:?}"),
    }
}

/// The header, the peer and the trusted ranges an input chooses.
pub(crate) fn choose(input: &mut Input<'_>) -> (ClientIpHeader, IpAddr, Vec<IpNet>) {
    let header = input.pick(&HEADERS);
    let peer = parsed(input.pick(&PEERS));
    let mask = input.byte();
    let nets = (NETS.iter().enumerate())
        .filter(|(i, _)| mask >> i & 1 == 1)
        .map(|(_, net)| parsed(net))
        .collect();
    (header, peer, nets)
}

/// `data` as a trusted proxy's header lines: never a panic; an untrusted peer, or a trusted
/// one without the header, is the client; an address comes back canonical (IPv4-mapped as
/// IPv4); an `X-Forwarded-For` with a byte outside ASCII is refused as malformed; the other
/// two headers are never read; a list that is not malformed, extended by a
/// trusted proxy with an untrusted address, names that address, and a malformed one stays
/// refused.
///
/// # Example
/// ```
/// // X-Forwarded-For, from 10.0.0.1, trusting 10.0.0.0/8: two lines.
/// sluice_invariants::client_ip(b"\x00\x00\x01198.51.100.1, 10.0.0.3\n203.0.113.9");
/// ```
pub fn client_ip(data: &[u8]) {
    let mut input = Input::new(data);
    let (header, peer, nets) = choose(&mut input);
    let lines = header_lines(input.rest());
    let proxies = TrustedProxies::new(nets.iter().copied());
    let mut headers = HeaderMap::new();
    for line in &lines {
        headers.append(header.name(), line.clone());
    }
    let result = proxies.client_ip(peer, header, &headers);

    let canonical = peer.to_canonical();
    let trusted = nets.iter().any(|net| net.contains(canonical));
    if !trusted || lines.is_empty() {
        assert_eq!(result, Ok(canonical), "{lines:?}");
    }
    match result {
        Ok(ip) => assert_eq!(ip, ip.to_canonical()),
        Err(e) => assert!(!e.body().is_empty()),
    }
    // No proxy writes a byte outside ASCII in an X-Forwarded-For hop: refused, not skipped.
    let not_ascii = lines.iter().any(|line| !line.as_bytes().is_ascii());
    if trusted && header == ClientIpHeader::XForwardedFor && not_ascii {
        assert_eq!(result, Err(ClientIpError::Malformed(header)), "{lines:?}");
    }

    let mut noisy = headers.clone();
    for other in HEADERS.into_iter().filter(|h| *h != header) {
        noisy.append(other.name(), HeaderValue::from_static("\t"));
        for line in &lines {
            noisy.append(other.name(), line.clone());
        }
    }
    assert_eq!(
        proxies.client_ip(peer, header, &noisy),
        result,
        "another header was read"
    );

    if trusted && header != ClientIpHeader::XRealIp {
        let appended = match header {
            ClientIpHeader::Forwarded => HeaderValue::from_static("for=198.51.100.99"),
            _ => HeaderValue::from_static(OUTSIDER),
        };
        let mut extended = headers.clone();
        extended.append(header.name(), appended);
        let after = proxies.client_ip(peer, header, &extended);
        match result {
            Err(ClientIpError::Malformed(_)) => assert_eq!(after, result, "{lines:?}"),
            _ => assert_eq!(after, Ok(parsed(OUTSIDER)), "{lines:?}"),
        }
    }
}
