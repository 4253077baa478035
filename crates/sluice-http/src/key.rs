//! Who is asking: the key a request is limited under, built from its headers and address.

use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::str::FromStr;

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName};

use crate::proxy::{ClientIpError, ipv6_network};

/// The longest key that can ever be built (the configured maximum is capped to it).
///
/// # Example
/// ```
/// assert_eq!(sluice_http::MAX_KEY_LEN, 1024);
/// ```
pub const MAX_KEY_LEN: usize = 1024;

/// One part of a request's key.
///
/// Written as `header:NAME`, `bearer` or `ip`.
///
/// # Example
/// ```
/// use sluice_http::KeyPart;
/// let part: KeyPart = "header:X-Account-ID".parse()?;
/// assert_eq!(part, KeyPart::Header("x-account-id".parse()?));
/// assert_eq!("ip".parse::<KeyPart>()?, KeyPart::ClientIp);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The value of a request header (`X-Account-ID`, `Client-Id`...).
    Header(HeaderName),
    /// The token of an `Authorization: Bearer TOKEN` header (an API key).
    Bearer,
    /// The client's IP address: the peer's, or, behind trusted proxies, the address they
    /// report (see [`crate::TrustedProxies`]).
    ClientIp,
}

/// A key part that could not be read from text.
///
/// # Example
/// ```
/// let e = "cookie".parse::<sluice_http::KeyPart>().unwrap_err();
/// assert!(e.to_string().contains("expected `header:NAME`, `bearer` or `ip`"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid key part {0:?}: expected `header:NAME`, `bearer` or `ip`")]
pub struct KeyPartError(String);

impl FromStr for KeyPart {
    type Err = KeyPartError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let text = s.trim();
        if text.eq_ignore_ascii_case("bearer") {
            return Ok(Self::Bearer);
        }
        if text.eq_ignore_ascii_case("ip") {
            return Ok(Self::ClientIp);
        }
        let name = text
            .strip_prefix("header:")
            .ok_or_else(|| KeyPartError(s.to_string()))?;
        HeaderName::from_str(name.trim())
            .map(Self::Header)
            .map_err(|_| KeyPartError(s.to_string()))
    }
}

impl fmt::Display for KeyPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Bearer => f.write_str("bearer"),
            Self::ClientIp => f.write_str("ip"),
        }
    }
}

/// Why a request's key was refused (the request is answered 400 and nothing is stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyRejection {
    TooLong,
    NotText,
    /// A key header (or `Authorization`, for a bearer part) sent more than once: which one
    /// counts would depend on the proxies in between.
    Repeated,
    /// A trusted proxy's client IP header that gives no usable address.
    ClientIp(ClientIpError),
}

impl KeyRejection {
    /// The body of the 400 answer.
    pub(crate) fn body(self) -> &'static str {
        match self {
            Self::TooLong => "Key too long",
            Self::NotText => "Key is not text",
            Self::Repeated => "Key header repeated",
            Self::ClientIp(e) => e.body(),
        }
    }
}

/// A key built on the stack, so building one allocates nothing.
pub(crate) struct KeyBuf {
    bytes: [u8; MAX_KEY_LEN],
    len: usize,
    max: usize,
}

impl KeyBuf {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            bytes: [0; MAX_KEY_LEN],
            len: 0,
            max: max.min(MAX_KEY_LEN),
        }
    }

    fn push(&mut self, s: &str) -> Result<(), KeyRejection> {
        let end = self.len + s.len();
        if end > self.max {
            return Err(KeyRejection::TooLong);
        }
        self.bytes[self.len..end].copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }

    /// `part` with `\` and `|` escaped by a `\`, so joined parts split back one way only.
    fn push_escaped(&mut self, part: &str) -> Result<(), KeyRejection> {
        let mut rest = part;
        while let Some(i) = rest.find(['\\', '|']) {
            let (plain, special) = rest.split_at(i);
            self.push(plain)?;
            self.push("\\")?;
            self.push(&special[..1])?;
            rest = &special[1..];
        }
        self.push(rest)
    }

    fn as_str(&self) -> &str {
        // Only whole `&str`s are pushed, so the bytes are UTF-8.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for KeyBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s).map_err(|_| fmt::Error)
    }
}

/// Builds keys from requests: one part as it is, or several joined by `|` with `\` and `|`
/// inside each part escaped by `\` (`x|y` and `z` make `x\|y|z`; `x` and `y|z` make
/// `x|y\|z`).
#[derive(Debug, Clone)]
pub(crate) struct KeySource {
    pub(crate) parts: Vec<KeyPart>,
    pub(crate) default_key: String,
    pub(crate) max_len: usize,
    /// IPv6 clients are keyed by their network of this many bits (1 to 128).
    pub(crate) ipv6_prefix: u8,
}

impl KeySource {
    /// Whether building the key needs the client's address.
    pub(crate) fn needs_ip(&self) -> bool {
        self.parts.contains(&KeyPart::ClientIp)
    }

    /// The key of a request made of one header or bearer part, read in place (`None` when
    /// the key has to be built).
    pub(crate) fn borrowed_key<'a>(
        &'a self,
        headers: &'a HeaderMap,
    ) -> Option<Result<&'a str, KeyRejection>> {
        match self.parts.as_slice() {
            [part] if *part != KeyPart::ClientIp => Some(
                self.text_part(part, headers)
                    .map(|text| text.unwrap_or(&self.default_key))
                    .and_then(|text| {
                        if text.len() > self.max_len {
                            Err(KeyRejection::TooLong)
                        } else {
                            Ok(text)
                        }
                    }),
            ),
            _ => None,
        }
    }

    /// The key of a request. A part that is absent (no such header, no bearer token, no known
    /// address) reads as the default key.
    pub(crate) fn key<'a>(
        &'a self,
        headers: &'a HeaderMap,
        ip: Option<IpAddr>,
        buf: &'a mut KeyBuf,
    ) -> Result<&'a str, KeyRejection> {
        if let Some(key) = self.borrowed_key(headers) {
            return key;
        }
        let joined = self.parts.len() > 1;
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                buf.push("|")?;
            }
            match part {
                KeyPart::ClientIp => match ip {
                    // An address has no `\` or `|`: nothing to escape.
                    Some(ip) => self.write_ip(ip, buf)?,
                    None if joined => buf.push_escaped(&self.default_key)?,
                    None => buf.push(&self.default_key)?,
                },
                _ => {
                    let text = self.text_part(part, headers)?.unwrap_or(&self.default_key);
                    if joined {
                        buf.push_escaped(text)?;
                    } else {
                        buf.push(text)?;
                    }
                }
            }
        }
        Ok(buf.as_str())
    }

    /// An IPv4 address as it is; an IPv6 one as its network (`2001:db8:1:2::/64`), unless the
    /// prefix is 128 (the address alone). IPv4-mapped IPv6 addresses are IPv4.
    fn write_ip(&self, ip: IpAddr, buf: &mut KeyBuf) -> Result<(), KeyRejection> {
        let written = match ip.to_canonical() {
            IpAddr::V6(v6) if self.ipv6_prefix < 128 => {
                write!(buf, "{}/{}", ipv6_network(v6, self.ipv6_prefix), self.ipv6_prefix)
            }
            ip => write!(buf, "{ip}"),
        };
        written.map_err(|_| KeyRejection::TooLong)
    }

    fn text_part<'a>(&self, part: &KeyPart, headers: &'a HeaderMap) -> Result<Option<&'a str>, KeyRejection> {
        let name = match part {
            KeyPart::Header(name) => name,
            KeyPart::Bearer => &AUTHORIZATION,
            KeyPart::ClientIp => return Ok(None),
        };
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyRejection::Repeated);
        }
        let raw = match part {
            KeyPart::Bearer => match bearer_token(value.as_bytes()) {
                Some(token) => token,
                None => return Ok(None),
            },
            _ => value.as_bytes(),
        };
        if raw.len() > self.max_len {
            return Err(KeyRejection::TooLong);
        }
        let text = std::str::from_utf8(raw)
            .map_err(|_| KeyRejection::NotText)?
            .trim();
        Ok((!text.is_empty()).then_some(text))
    }
}

/// The token of `Bearer TOKEN` (scheme case-insensitive), if that is the scheme.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(parts: &[&str], max_len: usize) -> KeySource {
        KeySource {
            parts: parts.iter().map(|p| p.parse().unwrap()).collect(),
            default_key: "ANONYMOUS".into(),
            max_len,
            ipv6_prefix: 64,
        }
    }

    fn key_of(
        source: &KeySource,
        headers: &[(&str, &str)],
        ip: Option<IpAddr>,
    ) -> Result<String, KeyRejection> {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(HeaderName::from_str(k).unwrap(), v.parse().unwrap());
        }
        let mut buf = KeyBuf::new(source.max_len);
        source.key(&map, ip, &mut buf).map(str::to_string)
    }

    #[test]
    fn header_bearer_ip_and_combinations() {
        let ip = Some("10.1.2.3".parse().unwrap());
        let account = source(&["header:X-Account-ID"], 64);
        assert_eq!(
            key_of(&account, &[("x-account-id", "alice")], ip).unwrap(),
            "alice"
        );
        assert_eq!(key_of(&account, &[], ip).unwrap(), "ANONYMOUS");
        assert_eq!(
            key_of(&account, &[("x-account-id", "  ")], ip).unwrap(),
            "ANONYMOUS"
        );
        let bearer = source(&["bearer"], 64);
        assert_eq!(
            key_of(&bearer, &[("authorization", "Bearer k-123")], ip).unwrap(),
            "k-123"
        );
        assert_eq!(
            key_of(&bearer, &[("authorization", "Basic abc")], ip).unwrap(),
            "ANONYMOUS"
        );
        let both = source(&["header:Client-Id", "ip"], 64);
        assert_eq!(key_of(&both, &[("client-id", "c7")], ip).unwrap(), "c7|10.1.2.3");
        assert_eq!(key_of(&both, &[], None).unwrap(), "ANONYMOUS|ANONYMOUS");
    }

    #[test]
    fn long_keys_are_refused() {
        let account = source(&["header:X-Account-ID"], 8);
        assert_eq!(
            key_of(&account, &[("x-account-id", "12345678")], None).unwrap(),
            "12345678"
        );
        assert_eq!(
            key_of(&account, &[("x-account-id", "123456789")], None),
            Err(KeyRejection::TooLong)
        );
        let both = source(&["header:X-Account-ID", "ip"], 12);
        let ip = Some("10.1.2.3".parse().unwrap());
        assert_eq!(
            key_of(&both, &[("x-account-id", "abc")], ip).unwrap(),
            "abc|10.1.2.3"
        );
        assert_eq!(
            key_of(&both, &[("x-account-id", "abcd")], ip),
            Err(KeyRejection::TooLong)
        );
    }

    #[test]
    fn joined_parts_cannot_collide() {
        let two = source(&["header:A", "header:B"], 64);
        let left = key_of(&two, &[("a", "x|y"), ("b", "z")], None).unwrap();
        let right = key_of(&two, &[("a", "x"), ("b", "y|z")], None).unwrap();
        assert_eq!((left.as_str(), right.as_str()), (r"x\|y|z", r"x|y\|z"));
        // A backslash is escaped too, so it cannot forge an escape.
        let slash = key_of(&two, &[("a", "x\\"), ("b", "z")], None).unwrap();
        let escaped_bar = key_of(&two, &[("a", "x|"), ("b", "z")], None).unwrap();
        assert_eq!((slash.as_str(), escaped_bar.as_str()), (r"x\\|z", r"x\||z"));
        // One part is the key as sent.
        let one = source(&["header:A"], 64);
        assert_eq!(key_of(&one, &[("a", "x|y")], None).unwrap(), "x|y");
        // Escaping counts against the maximum.
        let short = source(&["header:A", "header:B"], 4);
        assert_eq!(key_of(&short, &[("a", "x"), ("b", "yz")], None).unwrap(), "x|yz");
        assert_eq!(
            key_of(&short, &[("a", "x"), ("b", "y|")], None),
            Err(KeyRejection::TooLong)
        );
    }

    #[test]
    fn a_key_header_sent_twice_is_refused() {
        let account = source(&["header:X-Account-ID"], 64);
        let twice = [("x-account-id", "alice"), ("x-account-id", "mallory")];
        assert_eq!(key_of(&account, &twice, None), Err(KeyRejection::Repeated));
        let both = source(&["header:X-Account-ID", "ip"], 64);
        assert_eq!(key_of(&both, &twice, None), Err(KeyRejection::Repeated));
        let bearer = source(&["bearer"], 64);
        let two_tokens = [("authorization", "Bearer a"), ("authorization", "Bearer b")];
        assert_eq!(key_of(&bearer, &two_tokens, None), Err(KeyRejection::Repeated));
        // Other headers may repeat.
        assert_eq!(
            key_of(
                &account,
                &[("x-account-id", "alice"), ("accept", "a"), ("accept", "b")],
                None
            )
            .unwrap(),
            "alice"
        );
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_network() {
        let mut by_ip = source(&["ip"], 64);
        let key = |s: &KeySource, ip: &str| key_of(s, &[], Some(ip.parse().unwrap())).unwrap();
        assert_eq!(key(&by_ip, "2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
        assert_eq!(key(&by_ip, "2001:db8:1:2:bbbb::7"), "2001:db8:1:2::/64");
        assert_eq!(key(&by_ip, "2001:db8:1:3::1"), "2001:db8:1:3::/64");
        assert_eq!(key(&by_ip, "::ffff:192.0.2.1"), "192.0.2.1");
        assert_eq!(key(&by_ip, "192.0.2.1"), "192.0.2.1");
        by_ip.ipv6_prefix = 48;
        assert_eq!(key(&by_ip, "2001:db8:1:3::1"), "2001:db8:1::/48");
        by_ip.ipv6_prefix = 128;
        assert_eq!(key(&by_ip, "2001:db8:1:3::1"), "2001:db8:1:3::1");
    }

    #[test]
    fn parts_read_and_print() {
        for text in ["header:client-id", "bearer", "ip"] {
            assert_eq!(text.parse::<KeyPart>().unwrap().to_string(), text);
        }
        assert!("cookie".parse::<KeyPart>().is_err());
        assert!("header:bad name".parse::<KeyPart>().is_err());
    }
}
