//! The client's address: the peer's, or what trusted proxies in front of us report.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The address of the connection's peer, put in the request's extensions by the server
/// (`request.extensions_mut().insert(PeerAddr(addr))`), read when a key uses the client IP.
///
/// # Example
/// ```
/// use sluice_http::PeerAddr;
/// let mut request = http::Request::new(());
/// request.extensions_mut().insert(PeerAddr("192.0.2.7:51234".parse()?));
/// assert!(request.extensions().get::<PeerAddr>().is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// An address range: `10.0.0.0/8`, `::1/128`, or one address (`192.0.2.1`).
///
/// # Example
/// ```
/// use sluice_http::IpNet;
/// let net: IpNet = "10.0.0.0/8".parse()?;
/// assert!(net.contains("10.200.0.1".parse()?));
/// assert!(!net.contains("11.0.0.1".parse()?));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

/// An address range that could not be read.
///
/// # Example
/// ```
/// let e = "10.0.0.0/40".parse::<sluice_http::IpNet>().unwrap_err();
/// assert!(e.to_string().contains("10.0.0.0/40"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address range {0:?}: expected an address or ADDRESS/PREFIX, e.g. \"10.0.0.0/8\"")]
pub struct IpNetError(String);

impl IpNet {
    /// Whether `ip` is in the range (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(net.to_bits()),
                u128::from(ip.to_bits()),
                self.prefix,
                32,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => prefix_eq(net.to_bits(), ip.to_bits(), self.prefix, 128),
            _ => false,
        }
    }
}

fn prefix_eq(a: u128, b: u128, prefix: u8, bits: u32) -> bool {
    let shift = bits - u32::from(prefix);
    shift >= bits || (a >> shift) == (b >> shift)
}

impl FromStr for IpNet {
    type Err = IpNetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let error = || IpNetError(s.to_string());
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s.trim(), None),
        };
        let addr = IpAddr::from_str(addr).map_err(|_| error())?.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(error)?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// The proxies whose `Forwarded` / `X-Forwarded-For` headers are believed.
///
/// When the peer is not in the list, the client is the peer, whatever the headers say. When
/// it is, the forwarding list is read from the right (the hop nearest us) and the client is
/// the right-most address that is not a trusted proxy; a client cannot pick its key by sending
/// a forged header, since its own entries are to the left of the one a trusted proxy appended.
/// `Forwarded` is read if present, else `X-Forwarded-For`. An entry that is not an address
/// (`unknown`, an obfuscated name) stops the walk at the proxy that reported it.
///
/// # Example
/// ```
/// use sluice_http::TrustedProxies;
/// let proxies = TrustedProxies::new(["10.0.0.0/8".parse()?]);
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2".parse()?);
/// assert_eq!(proxies.client_ip("10.0.0.1".parse()?, &headers), "203.0.113.9".parse::<std::net::IpAddr>()?);
/// assert_eq!(proxies.client_ip("198.51.100.1".parse()?, &headers), "198.51.100.1".parse::<std::net::IpAddr>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Trusts the given ranges.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            nets: nets.into_iter().collect(),
        }
    }

    /// Whether no proxy is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|net| net.contains(ip))
    }

    /// The client's address for a request from `peer` with these headers.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        let forwarded = headers.contains_key(FORWARDED);
        let name = if forwarded { &FORWARDED } else { &X_FORWARDED_FOR };
        let mut nearest = peer;
        for value in headers.get_all(name).iter().rev() {
            let Ok(value) = value.to_str() else { return nearest };
            for element in value.rsplit(',') {
                let node = if forwarded {
                    forwarded_for(element)
                } else {
                    Some(element)
                };
                let Some(ip) = node.and_then(parse_node) else {
                    return nearest;
                };
                if !self.trusts(ip) {
                    return ip;
                }
                nearest = ip;
            }
        }
        nearest
    }
}

/// The `for=` node of one `Forwarded` element.
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value.trim())
    })
}

/// An address as proxies write it: `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`,
/// `[2001:db8::1]:4711`, possibly quoted.
fn parse_node(node: &str) -> Option<IpAddr> {
    let node = node.trim().trim_matches('"');
    if let Some(rest) = node.strip_prefix('[') {
        let (v6, _) = rest.split_once(']')?;
        return v6.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let (host, port) = node.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(HeaderName::from_str(k).unwrap(), v.parse().unwrap());
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges() {
        let net: IpNet = "192.168.0.0/16".parse().unwrap();
        assert!(net.contains(ip("192.168.255.1")));
        assert!(net.contains(ip("::ffff:192.168.1.1")));
        assert!(!net.contains(ip("192.169.0.1")));
        assert!("0.0.0.0/0".parse::<IpNet>().unwrap().contains(ip("8.8.8.8")));
        assert!("::1".parse::<IpNet>().unwrap().contains(ip("::1")));
        assert!("10.0.0.0/33".parse::<IpNet>().is_err());
        assert!("ten".parse::<IpNet>().is_err());
    }

    #[test]
    fn right_most_untrusted_address_wins() {
        let proxies = TrustedProxies::new(["10.0.0.0/8".parse().unwrap()]);
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1, 2.2.2.2"),
            ("x-forwarded-for", "10.0.0.9"),
        ]);
        assert_eq!(proxies.client_ip(ip("10.0.0.1"), &h), ip("2.2.2.2"));
        let all_trusted = headers(&[("x-forwarded-for", "10.0.0.7, 10.0.0.8")]);
        assert_eq!(proxies.client_ip(ip("10.0.0.1"), &all_trusted), ip("10.0.0.7"));
        let garbage = headers(&[("x-forwarded-for", "1.1.1.1, unknown, 10.0.0.8")]);
        assert_eq!(proxies.client_ip(ip("10.0.0.1"), &garbage), ip("10.0.0.8"));
        assert_eq!(
            proxies.client_ip(ip("10.0.0.1"), &HeaderMap::new()),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn forwarded_is_preferred_and_parsed() {
        let proxies = TrustedProxies::new(["10.0.0.0/8".parse().unwrap()]);
        let h = headers(&[
            (
                "forwarded",
                r#"for=192.0.2.60;proto=http, For="[2001:db8:cafe::17]:4711""#,
            ),
            ("x-forwarded-for", "3.3.3.3"),
        ]);
        assert_eq!(proxies.client_ip(ip("10.0.0.1"), &h), ip("2001:db8:cafe::17"));
        let v4_port = headers(&[("forwarded", r#"for="198.51.100.4:8080""#)]);
        assert_eq!(proxies.client_ip(ip("10.0.0.1"), &v4_port), ip("198.51.100.4"));
    }

    #[test]
    fn untrusted_peers_are_the_client() {
        let proxies = TrustedProxies::default();
        let h = headers(&[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(proxies.client_ip(ip("203.0.113.5"), &h), ip("203.0.113.5"));
    }
}
