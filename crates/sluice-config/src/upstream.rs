//! `upstream:`: where `sluice serve` forwards the requests it admits (reverse-proxy mode)
//! instead of answering them itself. Each URL checked down to the origin the proxy connects
//! to (`http` or `https`, a host, the port made explicit), the routes' prefixes, the timeouts
//! and the pool of idle connections.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::uri::{Authority, Scheme};

use crate::raw::RawUpstream;
use crate::{ConfigError, duration, error};

/// `upstream.connect_timeout` when left out.
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `upstream.head_timeout` when left out.
pub const DEFAULT_UPSTREAM_HEAD_TIMEOUT: Duration = Duration::from_secs(60);

/// `upstream.idle_timeout` when left out.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// `upstream.max_idle` when left out.
pub const DEFAULT_UPSTREAM_MAX_IDLE: usize = 256;

/// The longest of each timeout.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// The most idle connections kept per upstream.
const MAX_IDLE: usize = 100_000;

/// The most routes: a prefix is looked for in each, longest first, on every request.
const MAX_ROUTES: usize = 1000;

/// The longest prefix, in bytes.
const MAX_PREFIX_BYTES: usize = 1024;

/// What an upstream URL may be, said after each refusal of one.
const URL_FORM: &str = "an upstream is http://HOST[:PORT] or https://HOST[:PORT] (port 80 or 443 if left out), \
     with no user, path, query or fragment";

/// Where admitted requests are forwarded: by the longest route whose prefix the request's path
/// starts with, else to `default`.
///
/// ```
/// use sluice_config::{HostHeader, UpstreamSettings};
/// let s: UpstreamSettings = sluice_config::parse("upstream: http://127.0.0.1:3000\n")?.upstream.unwrap();
/// assert_eq!(s.default.as_ref().unwrap().to_string(), "http://127.0.0.1:3000");
/// assert_eq!((s.routes.len(), s.host, s.max_idle), (0, HostHeader::Keep, 256));
/// let s = sluice_config::parse(
///     "upstream:\n  routes:\n    - {prefix: /api/, url: 'http://127.0.0.1:3001'}\n    - {prefix: /api/v2/, url: 'https://v2.internal'}\n",
/// )?.upstream.unwrap();
/// assert_eq!(s.upstream_for("/api/v2/users").unwrap().to_string(), "https://v2.internal:443");
/// assert_eq!(s.upstream_for("/api/v1").unwrap().authority, "127.0.0.1:3001");
/// assert_eq!(s.upstream_for("/other"), None);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSettings {
    /// Where a request no route matches goes (`url`, or the shorthand `upstream: URL`); `None`:
    /// such a request is not forwarded.
    pub default: Option<UpstreamUrl>,
    /// By path prefix, the longest prefix first (prefixes of one length in file order).
    pub routes: Vec<UpstreamRoute>,
    /// The `Host` header sent upstream.
    pub host: HostHeader,
    /// The longest a connection to an upstream may take to open.
    pub connect_timeout: Duration,
    /// The longest from a request sent until the upstream's response head arrives.
    pub head_timeout: Duration,
    /// The longest pause in a request's or a response's body.
    pub idle_timeout: Duration,
    /// Idle keep-alive connections kept per upstream (0: none, a connection per request).
    pub max_idle: usize,
}

impl UpstreamSettings {
    /// The upstream a request for `path` goes to: the longest route whose prefix `path` starts
    /// with (a plain string prefix), else `default`.
    ///
    /// ```
    /// let s = sluice_config::parse("upstream: {url: 'http://app', routes: [{prefix: /static/, url: 'http://cdn:81'}]}\n")?;
    /// let s = s.upstream.unwrap();
    /// assert_eq!(s.upstream_for("/static/a.css").unwrap().to_string(), "http://cdn:81");
    /// assert_eq!(s.upstream_for("/static").unwrap().to_string(), "http://app:80");
    /// # Ok::<(), sluice_config::ConfigError>(())
    /// ```
    pub fn upstream_for(&self, path: &str) -> Option<&UpstreamUrl> {
        (self.routes.iter())
            .find(|route| path.starts_with(&route.prefix))
            .map(|route| &route.url)
            .or(self.default.as_ref())
    }
}

/// One of `upstream.routes`: requests whose path starts with `prefix` go to `url`, the path
/// unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRoute {
    /// A plain string prefix of the path, starting with `/`.
    pub prefix: String,
    /// Where those requests go.
    pub url: UpstreamUrl,
}

/// The `Host` header a forwarded request carries (`upstream.host`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum HostHeader {
    /// The client's own (`keep`).
    #[default]
    Keep,
    /// The upstream URL's `host:port` (`upstream`).
    Upstream,
}

/// An upstream's origin: `http` or `https`, and the host and port connected to (the port
/// always given, 80 or 443 if the URL left it out). Written back as `http://host:port`.
///
/// ```
/// use sluice_config::UpstreamUrl;
/// let url: UpstreamUrl = "https://Assets.internal/".parse()?;
/// assert!(url.tls);
/// assert_eq!((url.host(), url.port()), ("assets.internal", 443));
/// assert_eq!(url.to_string(), "https://assets.internal:443");
/// assert!("http://127.0.0.1:3000/app".parse::<UpstreamUrl>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UpstreamUrl {
    /// `https` (spoken with `client_tls`'s settings), or `http`.
    pub tls: bool,
    /// `host:port`, the port explicit, the host in lower case (an IPv6 address in brackets).
    pub authority: Authority,
}

impl UpstreamUrl {
    /// The host: a name, an IPv4 address, or an IPv6 address in brackets (`[::1]`).
    pub fn host(&self) -> &str {
        self.authority.host()
    }

    /// The port connected to.
    pub fn port(&self) -> u16 {
        // The authority is built with its port (`from_str`).
        (self.authority.port_u16()).unwrap_or(if self.tls { 443 } else { 80 })
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> Scheme {
        if self.tls { Scheme::HTTPS } else { Scheme::HTTP }
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}", self.scheme(), self.authority)
    }
}

/// Why a text is not an upstream URL: what was wrong, and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UpstreamUrlError(String);

impl FromStr for UpstreamUrl {
    type Err = UpstreamUrlError;

    /// Parsed by [`http::Uri`], then held to an origin: scheme, host and port alone.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let refuse = |why: String| UpstreamUrlError(format!("{text:?}: {why}; {URL_FORM}"));
        let uri = (text.parse::<http::Uri>()).map_err(|e| refuse(format!("not a URL ({e})")))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            Some(other) => return Err(refuse(format!("scheme {other} is not http or https"))),
            None => return Err(refuse("no scheme".into())),
        };
        let Some(authority) = uri.authority() else {
            return Err(refuse("no host".into()));
        };
        if authority.as_str().contains('@') {
            return Err(refuse("user information (user:password@) is not accepted".into()));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(refuse("no host".into()));
        }
        // What follows the host: nothing, or `:` and the port (perhaps empty).
        let rest = &authority.as_str()[host.len()..];
        let port = match rest.strip_prefix(':').unwrap_or(rest) {
            "" if tls => 443,
            "" => 80,
            digits => match digits.parse::<u16>() {
                Ok(port) if port > 0 && digits.bytes().all(|b| b.is_ascii_digit()) => port,
                _ => return Err(refuse(format!("port {digits} is not a port (1 to 65535)"))),
            },
        };
        if !matches!(uri.path(), "" | "/") {
            return Err(refuse(format!(
                "a path ({}) is not accepted: a path prefix on the upstream is not supported \
                 (the request's path is forwarded as it came)",
                uri.path()
            )));
        }
        if uri.query().is_some() {
            return Err(refuse("a query is not accepted".into()));
        }
        // `http::Uri` drops a fragment; it is refused rather than ignored.
        if text.contains('#') {
            return Err(refuse("a fragment (#...) is not accepted".into()));
        }
        let authority = format!("{}:{port}", host.to_ascii_lowercase())
            .parse::<Authority>()
            .map_err(|e| refuse(format!("not a host and port ({e})")))?;
        Ok(Self { tls, authority })
    }
}

/// `upstream:` checked.
pub(crate) fn check(raw: &RawUpstream) -> Result<UpstreamSettings, ConfigError> {
    let url = |field: &str, text: &str| text.parse::<UpstreamUrl>().map_err(|e| error(field, e));
    let default = (raw.url.as_deref())
        .map(|text| url("upstream.url", text))
        .transpose()?;
    if raw.routes.len() > MAX_ROUTES {
        return Err(error(
            "upstream.routes",
            format!("{} routes, at most {MAX_ROUTES}", raw.routes.len()),
        ));
    }
    let mut routes = Vec::with_capacity(raw.routes.len());
    let mut seen = HashMap::with_capacity(raw.routes.len());
    for (i, route) in raw.routes.iter().enumerate() {
        let field = format!("upstream.routes[{i}].prefix");
        prefix(&field, &route.prefix)?;
        if let Some(first) = seen.insert(route.prefix.as_str(), i) {
            return Err(error(
                field,
                format!(
                    "{:?} is also the prefix of routes[{first}]: each prefix once",
                    route.prefix
                ),
            ));
        }
        routes.push(UpstreamRoute {
            prefix: route.prefix.clone(),
            url: url(&format!("upstream.routes[{i}].url"), &route.url)?,
        });
    }
    if default.is_none() && routes.is_empty() {
        return Err(error(
            "upstream",
            "nowhere to forward to: give url or routes (`upstream: http://HOST[:PORT]`, or \
             `upstream: {url: ..., routes: [{prefix: /api/, url: ...}]}`)",
        ));
    }
    // Stable: prefixes of one length keep the file's order.
    routes.sort_by_key(|route| std::cmp::Reverse(route.prefix.len()));
    let host = match raw.host.as_deref() {
        None | Some("keep") => HostHeader::Keep,
        Some("upstream") => HostHeader::Upstream,
        Some(other) => {
            return Err(error(
                "upstream.host",
                format!(
                    "{other:?}: must be keep (the client's Host header) or upstream (the upstream \
                     URL's host:port)"
                ),
            ));
        }
    };
    let max_idle = match raw.max_idle {
        None => DEFAULT_UPSTREAM_MAX_IDLE,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_IDLE)
            .ok_or_else(|| {
                error(
                    "upstream.max_idle",
                    format!("must be between 0 (no idle connections kept) and {MAX_IDLE}, not {n}"),
                )
            })?,
    };
    Ok(UpstreamSettings {
        default,
        routes,
        host,
        connect_timeout: timeout(
            "upstream.connect_timeout",
            raw.connect_timeout.as_deref(),
            DEFAULT_UPSTREAM_CONNECT_TIMEOUT,
        )?,
        head_timeout: timeout(
            "upstream.head_timeout",
            raw.head_timeout.as_deref(),
            DEFAULT_UPSTREAM_HEAD_TIMEOUT,
        )?,
        idle_timeout: timeout(
            "upstream.idle_timeout",
            raw.idle_timeout.as_deref(),
            DEFAULT_UPSTREAM_IDLE_TIMEOUT,
        )?,
        max_idle,
    })
}

/// A route's prefix: a path's start, printable, of bounded length.
fn prefix(field: &str, prefix: &str) -> Result<(), ConfigError> {
    let why = if !prefix.starts_with('/') {
        "must start with '/'"
    } else if prefix.len() > MAX_PREFIX_BYTES {
        "is longer than 1024 bytes"
    } else if prefix.contains(|c: char| c.is_whitespace() || c.is_control()) {
        "holds whitespace or a control character"
    } else if prefix.contains(['?', '#']) {
        "holds '?' or '#': it is matched against the path alone"
    } else {
        return Ok(());
    };
    Err(error(
        field,
        format!(
            "{prefix:?} {why}; a prefix is the start of a request's path, such as /api/ (at most \
             {MAX_PREFIX_BYTES} bytes, no whitespace)"
        ),
    ))
}

/// A timeout: longer than 0, at most 1h; `default` when left out.
fn timeout(field: &str, text: Option<&str>, default: Duration) -> Result<Duration, ConfigError> {
    let Some(text) = text else {
        return Ok(default);
    };
    let value = duration(field, text)?;
    if value.is_zero() || value > MAX_TIMEOUT {
        return Err(error(
            field,
            format!("{text:?}: must be longer than 0 and at most 1h"),
        ));
    }
    Ok(value)
}
