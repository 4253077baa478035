//! The client's address: the peer's, or what trusted proxies in front of us report in the one
//! header they are configured to write.
//!
//! (Over 600 lines only with its unit tests, which stay beside the header grammars they pin:
//! the code itself is under 600.)

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;
use http::header::{FORWARDED, HeaderName};

static FORWARDED_NAME: HeaderName = FORWARDED;
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

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
    ///
    /// # Example
    /// ```
    /// let net: sluice_http::IpNet = "192.168.0.0/16".parse()?;
    /// assert!(net.contains("::ffff:192.168.1.1".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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

/// The first `prefix` bits of `ip` (the rest zero); `prefix` is at most 128.
pub(crate) fn ipv6_network(ip: Ipv6Addr, prefix: u8) -> Ipv6Addr {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    Ipv6Addr::from_bits(ip.to_bits() & mask)
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

/// The one header trusted proxies report the client's address in (as nginx's
/// `real_ip_header`). Only this header is read; the others are ignored, so a client cannot
/// pick its address by sending the header the proxies do not overwrite.
///
/// The default is `X-Forwarded-For`, the header most proxies and load balancers append to
/// (nginx `$proxy_add_x_forwarded_for`, HAProxy `option forwardfor`, Envoy, AWS ALB).
///
/// # Example
/// ```
/// use sluice_http::ClientIpHeader;
/// assert_eq!(ClientIpHeader::default(), ClientIpHeader::XForwardedFor);
/// assert_eq!("Forwarded".parse::<ClientIpHeader>()?, ClientIpHeader::Forwarded);
/// assert_eq!(ClientIpHeader::XRealIp.to_string(), "x-real-ip");
/// # Ok::<(), sluice_http::ClientIpHeaderError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`: each proxy appends the address it saw.
    #[default]
    XForwardedFor,
    /// `Forwarded: for=client, for="[2001:db8::1]:4711";proto=https` (RFC 7239): the `for=`
    /// of each element.
    Forwarded,
    /// `X-Real-IP: client`: one address, written (not appended) by the proxy.
    XRealIp,
}

/// A client IP header name that is not one of `x-forwarded-for`, `forwarded`, `x-real-ip`.
///
/// # Example
/// ```
/// let e = "via".parse::<sluice_http::ClientIpHeader>().unwrap_err();
/// assert!(e.to_string().contains("expected x-forwarded-for, forwarded or x-real-ip"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown client IP header {0:?}: expected x-forwarded-for, forwarded or x-real-ip")]
pub struct ClientIpHeaderError(String);

impl ClientIpHeader {
    /// The header's name, lower case.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_http::ClientIpHeader::Forwarded.name().as_str(), "forwarded");
    /// ```
    pub fn name(self) -> &'static HeaderName {
        match self {
            Self::XForwardedFor => &X_FORWARDED_FOR,
            Self::Forwarded => &FORWARDED_NAME,
            Self::XRealIp => &X_REAL_IP,
        }
    }
}

impl FromStr for ClientIpHeader {
    type Err = ClientIpHeaderError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Self::XForwardedFor, Self::Forwarded, Self::XRealIp]
            .into_iter()
            .find(|h| h.name().as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| ClientIpHeaderError(s.to_string()))
    }
}

impl fmt::Display for ClientIpHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name().as_str())
    }
}

/// Why a request from a trusted proxy has no client address. The layer answers it `400` with
/// [`ClientIpError::body`]; nothing is counted.
///
/// # Example
/// ```
/// use sluice_http::{ClientIpError, ClientIpHeader, TrustedProxies};
/// let proxies = TrustedProxies::new(["127.0.0.1".parse()?]);
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-forwarded-for", http::HeaderValue::from_bytes(b"\xff, 203.0.113.8")?);
/// let e = proxies.client_ip("127.0.0.1".parse()?, ClientIpHeader::XForwardedFor, &headers);
/// assert_eq!(e, Err(ClientIpError::Malformed(ClientIpHeader::XForwardedFor)));
/// assert_eq!(e.unwrap_err().body(), "Malformed X-Forwarded-For header");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientIpError {
    /// The header does not follow its syntax: a hop that is not a node (an address with an
    /// optional port, `unknown`, or an obfuscated `_name`), bytes outside visible ASCII, a
    /// `Forwarded` element that is not `name=value` pairs.
    #[error("{}", self.body())]
    Malformed(ClientIpHeader),
    /// The header is there but names no hop at all (empty, or only commas and spaces).
    #[error("{}", self.body())]
    Empty(ClientIpHeader),
    /// The walk from the nearest proxy reached a hop without an address (`unknown`, an
    /// obfuscated name, a `Forwarded` element without `for=`): the proxies do not know the
    /// client, and keying it as one of them would make it share their key.
    #[error("{}", self.body())]
    NoAddress(ClientIpHeader),
    /// `X-Real-IP`, a single value, was sent more than once.
    #[error("{}", self.body())]
    Repeated(ClientIpHeader),
}

impl ClientIpError {
    /// The body of the `400` response: which header, and what is wrong with it.
    ///
    /// # Example
    /// ```
    /// use sluice_http::{ClientIpError, ClientIpHeader};
    /// let e = ClientIpError::NoAddress(ClientIpHeader::Forwarded);
    /// assert_eq!(e.body(), "Forwarded header gives no client address");
    /// ```
    pub fn body(&self) -> &'static str {
        use ClientIpHeader::{Forwarded, XForwardedFor, XRealIp};
        match self {
            Self::Malformed(XForwardedFor) => "Malformed X-Forwarded-For header",
            Self::Malformed(Forwarded) => "Malformed Forwarded header",
            Self::Malformed(XRealIp) => "Malformed X-Real-IP header",
            Self::Empty(XForwardedFor) => "Empty X-Forwarded-For header",
            Self::Empty(Forwarded) => "Empty Forwarded header",
            Self::Empty(XRealIp) => "Empty X-Real-IP header",
            Self::NoAddress(XForwardedFor) => "X-Forwarded-For header gives no client address",
            Self::NoAddress(Forwarded) => "Forwarded header gives no client address",
            Self::NoAddress(XRealIp) => "X-Real-IP header gives no client address",
            Self::Repeated(XForwardedFor) => "X-Forwarded-For header repeated",
            Self::Repeated(Forwarded) => "Forwarded header repeated",
            Self::Repeated(XRealIp) => "X-Real-IP header repeated",
        }
    }
}

/// The proxies whose client IP header is believed.
///
/// When the peer is not in the list, the client is the peer, whatever the headers say. When
/// it is, the configured [`ClientIpHeader`] is read as one list of hops (several header lines
/// continue the list in order, as HTTP combines them), from the right (the hop nearest us): the
/// client is the right-most hop that is not a trusted proxy. A client cannot pick its key by
/// sending a forged header, since its own entries are to the left of the one a trusted proxy
/// appended.
///
/// Strict: every hop must be a node (`192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`,
/// `[2001:db8::1]:4711`, `unknown`, `_obfuscated`; in `Forwarded`, the `for=` value as a token
/// or quoted string), else the request is refused ([`ClientIpError::Malformed`]), and the walk
/// must end on an address ([`ClientIpError::NoAddress`]). No such request is keyed as the
/// proxy, whose key it would then share with every other client behind it. A trusted peer that
/// sends no such header at all is the client itself.
///
/// # Example
/// ```
/// use sluice_http::{ClientIpHeader, TrustedProxies};
/// let proxies = TrustedProxies::new(["10.0.0.0/8".parse()?]);
/// let xff = ClientIpHeader::XForwardedFor;
/// let mut headers = http::HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2".parse()?);
/// headers.insert("forwarded", "for=198.51.100.1".parse()?); // not the configured header
/// assert_eq!(proxies.client_ip("10.0.0.1".parse()?, xff, &headers)?, "203.0.113.9".parse::<std::net::IpAddr>()?);
/// assert_eq!(proxies.client_ip("198.51.100.1".parse()?, xff, &headers)?, "198.51.100.1".parse::<std::net::IpAddr>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Trusts the given ranges.
    ///
    /// # Example
    /// ```
    /// let proxies = sluice_http::TrustedProxies::new(["10.0.0.0/8".parse()?, "::1".parse()?]);
    /// assert!(!proxies.is_empty());
    /// # Ok::<(), sluice_http::IpNetError>(())
    /// ```
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        Self {
            nets: nets.into_iter().collect(),
        }
    }

    /// Whether no proxy is trusted.
    ///
    /// # Example
    /// ```
    /// assert!(sluice_http::TrustedProxies::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// Whether `ip` is one of the trusted proxies (an IPv4-mapped IPv6 address is looked up as
    /// IPv4): a reverse proxy extends the forwarding headers of such a peer and replaces any
    /// other's.
    ///
    /// # Example
    /// ```
    /// let proxies = sluice_http::TrustedProxies::new(["10.0.0.0/8".parse()?]);
    /// assert!(proxies.trusts("10.1.2.3".parse()?));
    /// assert!(proxies.trusts("::ffff:10.1.2.3".parse()?));
    /// assert!(!proxies.trusts("192.0.2.1".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(ip))
    }

    /// The client's address for a request from `peer` with these headers, reading `header`
    /// only (IPv4-mapped IPv6 addresses come back as IPv4).
    ///
    /// # Errors
    /// [`ClientIpError`] when the peer is trusted and the header is malformed, empty, names no
    /// address where the walk ends, or (`X-Real-IP`) is repeated.
    ///
    /// # Example
    /// ```
    /// use sluice_http::{ClientIpHeader, TrustedProxies};
    /// let proxies = TrustedProxies::new(["10.0.0.0/8".parse()?]);
    /// let mut headers = http::HeaderMap::new();
    /// headers.append("forwarded", r#"for=192.0.2.60;proto=http"#.parse()?);
    /// headers.append("forwarded", r#"For="[2001:db8:cafe::17]:4711", for=10.0.0.3"#.parse()?);
    /// let ip = proxies.client_ip("10.0.0.1".parse()?, ClientIpHeader::Forwarded, &headers)?;
    /// assert_eq!(ip, "2001:db8:cafe::17".parse::<std::net::IpAddr>()?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client_ip(
        &self,
        peer: IpAddr,
        header: ClientIpHeader,
        headers: &HeaderMap,
    ) -> Result<IpAddr, ClientIpError> {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return Ok(peer);
        }
        let mut lines = headers.get_all(header.name()).iter().peekable();
        if lines.peek().is_none() {
            return Ok(peer);
        }
        let mut walk = Walk::new(self);
        let malformed = ClientIpError::Malformed(header);
        match header {
            ClientIpHeader::XForwardedFor => {
                for line in lines {
                    xff_hops(line.as_bytes(), &mut walk).ok_or(malformed)?;
                }
            }
            ClientIpHeader::Forwarded => {
                for line in lines {
                    forwarded_hops(line.as_bytes(), &mut walk).ok_or(malformed)?;
                }
            }
            ClientIpHeader::XRealIp => {
                let value = lines.next().map(|v| trim_ows(v.as_bytes())).unwrap_or_default();
                if lines.next().is_some() {
                    return Err(ClientIpError::Repeated(header));
                }
                if !value.is_empty() {
                    walk.push(parse_node(value).ok_or(malformed)?);
                }
            }
        }
        match walk.end() {
            None => Err(ClientIpError::Empty(header)),
            Some(Hop::Addr(ip)) => Ok(ip),
            Some(Hop::Hidden) => Err(ClientIpError::NoAddress(header)),
        }
    }
}

/// One hop of a forwarding list: an address, or a node that hides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    Addr(IpAddr),
    /// `unknown`, an obfuscated name, a `Forwarded` element without `for=`.
    Hidden,
}

/// The right-to-left walk, computed left to right so the list need not be stored: it ends on
/// the right-most hop that is not a trusted address, or on the left-most hop when all are.
struct Walk<'a> {
    proxies: &'a TrustedProxies,
    first: Option<Hop>,
    last_untrusted: Option<Hop>,
}

impl<'a> Walk<'a> {
    fn new(proxies: &'a TrustedProxies) -> Self {
        Self {
            proxies,
            first: None,
            last_untrusted: None,
        }
    }

    fn push(&mut self, hop: Hop) {
        self.first.get_or_insert(hop);
        let trusted = matches!(hop, Hop::Addr(ip) if self.proxies.trusts(ip));
        if !trusted {
            self.last_untrusted = Some(hop);
        }
    }

    fn end(self) -> Option<Hop> {
        self.last_untrusted.or(self.first)
    }
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn trim_ows(s: &[u8]) -> &[u8] {
    let s = trim_start_ows(s);
    let end = s.iter().rposition(|&b| !is_ows(b)).map_or(0, |i| i + 1);
    &s[..end]
}

fn trim_start_ows(s: &[u8]) -> &[u8] {
    let start = s.iter().position(|&b| !is_ows(b)).unwrap_or(s.len());
    &s[start..]
}

/// The hops of one `X-Forwarded-For` line, or `None` if one is not a node. Empty list
/// elements are skipped, as HTTP lists allow.
fn xff_hops(line: &[u8], walk: &mut Walk<'_>) -> Option<()> {
    for element in line.split(|&b| b == b',') {
        let element = trim_ows(element);
        if !element.is_empty() {
            walk.push(parse_node(element)?);
        }
    }
    Some(())
}

/// RFC 9110 `tchar`: what a `Forwarded` token may contain.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The hops of one `Forwarded` line (RFC 7239: `1#forwarded-element`, each element
/// `[pair] *(";" [pair])`, each pair `token=(token / quoted-string)`), or `None` if it does
/// not follow that syntax, repeats a parameter in an element, or has a `for=` that is not a
/// node. OWS is accepted around `,` and `;`.
fn forwarded_hops(line: &[u8], walk: &mut Walk<'_>) -> Option<()> {
    let mut rest = line;
    loop {
        let (hop, after) = forwarded_element(rest)?;
        if let Some(hop) = hop {
            walk.push(hop);
        }
        match after.split_first() {
            None => return Some(()),
            Some((b',', tail)) => rest = tail,
            Some(_) => return None,
        }
    }
}

/// One element up to the `,` after it (or the end): its hop (`None` for an empty element) and
/// what follows it.
fn forwarded_element(mut s: &[u8]) -> Option<(Option<Hop>, &[u8])> {
    let mut node: Option<&[u8]> = None;
    // A bit per parameter RFC 7239 names (for, by, host, proto): none may repeat.
    let mut seen = 0u8;
    let mut pairs = 0usize;
    loop {
        s = trim_start_ows(s);
        if let Some(&b) = s.first()
            && is_tchar(b)
        {
            let name_len = s.iter().position(|&b| !is_tchar(b)).unwrap_or(s.len());
            let (name, after) = s.split_at(name_len);
            let after = after.strip_prefix(b"=")?;
            let (value, quoted, after) = forwarded_value(after)?;
            let bit = [&b"for"[..], b"by", b"host", b"proto"]
                .iter()
                .position(|known| name.eq_ignore_ascii_case(known))
                .map_or(0, |i| 1u8 << i);
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            if bit == 1 {
                // A quoted-pair is never needed in a node: refuse rather than unescape.
                if quoted && value.contains(&b'\\') {
                    return None;
                }
                node = Some(value);
            }
            pairs += 1;
            s = trim_start_ows(after);
        }
        match s.split_first() {
            Some((b';', tail)) => s = tail,
            Some((b',', _)) | None => break,
            Some(_) => return None,
        }
    }
    let hop = match node {
        Some(node) => Some(parse_node(node)?),
        // A proxy that wrote an element without `for=` did not say whom it served.
        None if pairs > 0 => Some(Hop::Hidden),
        // No pair at all (nothing, or only `;`s): an empty list element, skipped.
        None => None,
    };
    Some((hop, s))
}

/// A token or a quoted string: its text (quotes removed, quoted-pairs left as they are),
/// whether it was quoted, and what follows.
fn forwarded_value(s: &[u8]) -> Option<(&[u8], bool, &[u8])> {
    if let Some(body) = s.strip_prefix(b"\"") {
        let mut i = 0;
        while i < body.len() {
            match body[i] {
                b'"' => return Some((&body[..i], true, &body[i + 1..])),
                // quoted-pair: a backslash and any visible character, space or tab.
                b'\\' => {
                    let escaped = *body.get(i + 1)?;
                    if !(escaped == b'\t' || (b' '..=b'~').contains(&escaped) || escaped >= 0x80) {
                        return None;
                    }
                    i += 2;
                }
                // qdtext: HTAB, SP, visible ASCII but `"` and `\`, obs-text.
                b if b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80 => i += 1,
                _ => return None,
            }
        }
        None
    } else {
        let len = s.iter().position(|&b| !is_tchar(b)).unwrap_or(s.len());
        (len > 0).then(|| (&s[..len], false, &s[len..]))
    }
}

/// A node as proxies write it (RFC 7239 section 6, and the bare IPv6 addresses of
/// `X-Forwarded-For`): `192.0.2.1`, `192.0.2.1:4711`, `2001:db8::1`, `[2001:db8::1]:4711`,
/// `unknown`, `_hidden`, `unknown:_port`. `None` if it is none of these.
fn parse_node(node: &[u8]) -> Option<Hop> {
    let node = std::str::from_utf8(node).ok()?;
    if let Some(rest) = node.strip_prefix('[') {
        let (v6, after) = rest.split_once(']')?;
        if !(after.is_empty() || after.strip_prefix(':').is_some_and(valid_port)) {
            return None;
        }
        let ip = v6.parse::<Ipv6Addr>().ok()?;
        return Some(Hop::Addr(IpAddr::V6(ip).to_canonical()));
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(Hop::Addr(ip.to_canonical()));
    }
    let name = match node.rsplit_once(':') {
        Some((name, port)) if valid_port(port) => name,
        Some(_) => return None,
        None => node,
    };
    if let Ok(ip) = name.parse::<std::net::Ipv4Addr>() {
        return Some(Hop::Addr(IpAddr::V4(ip)));
    }
    (name.eq_ignore_ascii_case("unknown") || is_obfuscated(name)).then_some(Hop::Hidden)
}

/// `port` (1 to 5 digits, at most 65535) or an obfuscated port.
fn valid_port(port: &str) -> bool {
    (port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok())
        || is_obfuscated(port)
}

/// `"_" 1*(ALPHA / DIGIT / "." / "_" / "-")`.
fn is_obfuscated(s: &str) -> bool {
    s.strip_prefix('_').is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    use ClientIpHeader::{Forwarded, XForwardedFor, XRealIp};

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                HeaderName::from_str(k).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::new([
            "10.0.0.0/8".parse().unwrap(),
            "2001:db8:ffff::/48".parse().unwrap(),
        ])
    }

    fn client(header: ClientIpHeader, pairs: &[(&str, &[u8])]) -> Result<IpAddr, ClientIpError> {
        proxies().client_ip(ip("10.0.0.1"), header, &headers(pairs))
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
    fn networks_of_ipv6_addresses() {
        let a: Ipv6Addr = "2001:db8:1:2:3:4:5:6".parse().unwrap();
        assert_eq!(ipv6_network(a, 64), "2001:db8:1:2::".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ipv6_network(a, 128), a);
        assert_eq!(ipv6_network(a, 0), Ipv6Addr::UNSPECIFIED);
        assert_eq!(ipv6_network(a, 1), "::".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ipv6_network(a, 24), "2001:d00::".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn right_most_untrusted_address_wins_across_lines() {
        let h = [
            ("x-forwarded-for", b"1.1.1.1, 2.2.2.2".as_slice()),
            ("x-forwarded-for", b"10.0.0.9"),
        ];
        assert_eq!(client(XForwardedFor, &h), Ok(ip("2.2.2.2")));
        let all_trusted = [("x-forwarded-for", b"10.0.0.7, 10.0.0.8".as_slice())];
        assert_eq!(client(XForwardedFor, &all_trusted), Ok(ip("10.0.0.7")));
        let with_ports = [(
            "x-forwarded-for",
            b"[2001:db8::5]:80 , 198.51.100.2:4711,".as_slice(),
        )];
        assert_eq!(client(XForwardedFor, &with_ports), Ok(ip("198.51.100.2")));
        let mapped = [("x-forwarded-for", b"::ffff:198.51.100.3".as_slice())];
        assert_eq!(client(XForwardedFor, &mapped), Ok(ip("198.51.100.3")));
        assert_eq!(
            client(XForwardedFor, &[]),
            Ok(ip("10.0.0.1")),
            "no header: the peer"
        );
    }

    #[test]
    fn only_the_configured_header_is_read() {
        let h = [
            ("x-forwarded-for", b"203.0.113.8".as_slice()),
            ("forwarded", b"for=198.51.100.77"),
            ("x-real-ip", b"192.0.2.5"),
        ];
        assert_eq!(client(XForwardedFor, &h), Ok(ip("203.0.113.8")));
        assert_eq!(client(Forwarded, &h), Ok(ip("198.51.100.77")));
        assert_eq!(client(XRealIp, &h), Ok(ip("192.0.2.5")));
        // A malformed header that is not the configured one changes nothing.
        let junk = [
            ("x-forwarded-for", b"\xff".as_slice()),
            ("x-real-ip", b"192.0.2.5"),
        ];
        assert_eq!(client(XRealIp, &junk), Ok(ip("192.0.2.5")));
    }

    #[test]
    fn malformed_hops_are_refused_not_replaced_by_the_proxy() {
        let bad: [&[u8]; 10] = [
            b"\xff, 203.0.113.8",
            b"203.0.113.8, nonsense",
            b"1.2.3.4:99999",
            b"1.2.3.4:",
            b"[1.2.3.4]",
            b"[2001:db8::1",
            b"2001:db8::1]:80",
            b"fe80::1%eth0",
            b"1.2.3.4, ,\t, 5.6.7.8, \x7e",
            b"\"1.2.3.4\"",
        ];
        for value in bad {
            assert_eq!(
                client(XForwardedFor, &[("x-forwarded-for", value)]),
                Err(ClientIpError::Malformed(XForwardedFor)),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        for value in [b"".as_slice(), b" , ,,"] {
            assert_eq!(
                client(XForwardedFor, &[("x-forwarded-for", value)]),
                Err(ClientIpError::Empty(XForwardedFor))
            );
        }
        // Empty lines add no hop: the list is the other lines'.
        let h = [
            ("x-forwarded-for", b"".as_slice()),
            ("x-forwarded-for", b"198.51.100.1"),
        ];
        assert_eq!(client(XForwardedFor, &h), Ok(ip("198.51.100.1")));
        // Untrusted peers are the client whatever they send.
        let h = headers(&[("x-forwarded-for", b"\xff")]);
        assert_eq!(
            proxies().client_ip(ip("203.0.113.5"), XForwardedFor, &h),
            Ok(ip("203.0.113.5"))
        );
    }

    #[test]
    fn hidden_nodes_beyond_the_client_are_fine_but_not_where_the_walk_ends() {
        let h = [("x-forwarded-for", b"unknown, _gazonk, 198.51.100.4".as_slice())];
        assert_eq!(client(XForwardedFor, &h), Ok(ip("198.51.100.4")));
        let h = [("x-forwarded-for", b"198.51.100.4, unknown, 10.0.0.3".as_slice())];
        assert_eq!(
            client(XForwardedFor, &h),
            Err(ClientIpError::NoAddress(XForwardedFor))
        );
        let h = [(
            "forwarded",
            b"for=198.51.100.4, proto=https;by=10.0.0.3".as_slice(),
        )];
        assert_eq!(client(Forwarded, &h), Err(ClientIpError::NoAddress(Forwarded)));
        let h = [("forwarded", b"for=\"_hidden:_port\"".as_slice())];
        assert_eq!(client(Forwarded, &h), Err(ClientIpError::NoAddress(Forwarded)));
    }

    #[test]
    fn forwarded_syntax() {
        let ok: [(&[u8], &str); 7] = [
            (br#"for=192.0.2.60;proto=http;by=203.0.113.43"#, "192.0.2.60"),
            (br#"For="[2001:db8:cafe::17]:4711""#, "2001:db8:cafe::17"),
            (br#"for="198.51.100.4:8080""#, "198.51.100.4"),
            (br#"for=192.0.2.43, for=198.51.100.17"#, "198.51.100.17"),
            (br#"proto=https; for=192.0.2.1 ;host="a,b;c""#, "192.0.2.1"),
            (br#"for=192.0.2.1,,  ,for=10.0.0.5"#, "192.0.2.1"),
            (br#"for=192.0.2.1;ext="x\"y""#, "192.0.2.1"),
        ];
        for (value, expected) in ok {
            assert_eq!(
                client(Forwarded, &[("forwarded", value)]),
                Ok(ip(expected)),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
        let bad: [&[u8]; 11] = [
            b"for=[2001:db8::1]",
            b"for=192.0.2.1;for=192.0.2.2",
            b"for=\"192.0.2.1",
            b"for=",
            b"for",
            b"=192.0.2.1",
            b"for=192.0.2.1 proto=http",
            b"for=\"192.0.2.\\1\"",
            b"for=nonsense",
            b"for=192.0.2.1;proto=\xff",
            b"for=192.0.2.1;;for=192.0.2.2",
        ];
        for value in bad {
            assert_eq!(
                client(Forwarded, &[("forwarded", value)]),
                Err(ClientIpError::Malformed(Forwarded)),
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn x_real_ip_is_one_address() {
        assert_eq!(
            client(XRealIp, &[("x-real-ip", b" 192.0.2.9 ")]),
            Ok(ip("192.0.2.9"))
        );
        assert_eq!(client(XRealIp, &[("x-real-ip", b"10.0.0.4")]), Ok(ip("10.0.0.4")));
        assert_eq!(
            client(
                XRealIp,
                &[("x-real-ip", b"192.0.2.9"), ("x-real-ip", b"192.0.2.10")]
            ),
            Err(ClientIpError::Repeated(XRealIp))
        );
        assert_eq!(
            client(XRealIp, &[("x-real-ip", b"192.0.2.9, 192.0.2.10")]),
            Err(ClientIpError::Malformed(XRealIp))
        );
        assert_eq!(
            client(XRealIp, &[("x-real-ip", b"unknown")]),
            Err(ClientIpError::NoAddress(XRealIp))
        );
        assert_eq!(
            client(XRealIp, &[("x-real-ip", b" ")]),
            Err(ClientIpError::Empty(XRealIp))
        );
    }

    #[test]
    fn header_names_read_and_print() {
        for h in [XForwardedFor, Forwarded, XRealIp] {
            assert_eq!(h.to_string().parse::<ClientIpHeader>(), Ok(h));
        }
        assert_eq!("X-Real-IP".parse::<ClientIpHeader>(), Ok(XRealIp));
        assert!("via".parse::<ClientIpHeader>().is_err());
    }
}
