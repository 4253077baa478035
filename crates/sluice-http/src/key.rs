//! Who is asking: the key a request is limited under, built from its headers and address.

use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::str::FromStr;

use http::HeaderMap;
use http::header::{AUTHORIZATION, HeaderName};

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

/// Builds keys from requests: one part, or several joined by `|`.
#[derive(Debug, Clone)]
pub(crate) struct KeySource {
    pub(crate) parts: Vec<KeyPart>,
    pub(crate) default_key: String,
    pub(crate) max_len: usize,
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
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                buf.push("|")?;
            }
            match part {
                KeyPart::ClientIp => self.write_ip(ip, buf)?,
                _ => buf.push(self.text_part(part, headers)?.unwrap_or(&self.default_key))?,
            }
        }
        Ok(buf.as_str())
    }

    fn write_ip(&self, ip: Option<IpAddr>, buf: &mut KeyBuf) -> Result<(), KeyRejection> {
        match ip {
            Some(ip) => write!(buf, "{ip}").map_err(|_| KeyRejection::TooLong),
            None => buf.push(&self.default_key),
        }
    }

    fn text_part<'a>(&self, part: &KeyPart, headers: &'a HeaderMap) -> Result<Option<&'a str>, KeyRejection> {
        let raw = match part {
            KeyPart::Header(name) => headers.get(name).map(|v| v.as_bytes()),
            KeyPart::Bearer => headers
                .get(AUTHORIZATION)
                .and_then(|v| bearer_token(v.as_bytes())),
            KeyPart::ClientIp => None,
        };
        let Some(raw) = raw else { return Ok(None) };
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
    fn parts_read_and_print() {
        for text in ["header:client-id", "bearer", "ip"] {
            assert_eq!(text.parse::<KeyPart>().unwrap().to_string(), text);
        }
        assert!("cookie".parse::<KeyPart>().is_err());
        assert!("header:bad name".parse::<KeyPart>().is_err());
    }
}
