//! The headers a request and a response cross the proxy with: hop-by-hop ones removed both
//! ways (RFC 9110 §7.6.1), the forwarding headers written from the client address sluice
//! computed, `Host` kept or set, an upgrade's own two headers carried across.

use std::fmt::Write as _;
use std::net::IpAddr;

use http::header::{CONNECTION, FORWARDED, HOST, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Version};

static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
/// `FORWARDED` as a static, for [`Added`].
static FORWARDED_NAME: HeaderName = FORWARDED;

/// The hop-by-hop headers every message loses, besides those its `Connection` names.
pub fn hop_by_hop() -> [&'static HeaderName; 6] {
    [
        &CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &TE,
        &TRANSFER_ENCODING,
        &UPGRADE,
    ]
}

/// Which of `names` `headers` has, in one walk over its names (a lookup of each would hash
/// every name, most of them absent).
fn present<const N: usize>(headers: &HeaderMap, names: [&HeaderName; N]) -> [bool; N] {
    let mut found = [false; N];
    for name in headers.keys() {
        if let Some(at) = names.iter().position(|wanted| *wanted == name) {
            found[at] = true;
        }
    }
    found
}

/// A request the proxy does not forward, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `Transfer-Encoding` lists a coding besides `chunked`: the server took the chunked
    /// framing off, and the other coding would reach the upstream unnamed.
    TransferCoding,
    /// An HTTP/1.1 request without `Host` (RFC 9112 §3.2).
    NoHost,
    /// More than one `Host` (RFC 9112 §3.2).
    SeveralHosts,
    /// `Host` names another authority than the request target's (an absolute-form target,
    /// HTTP/2's `:authority`): the limit and the upstream could read different hosts.
    HostDiffers,
}

impl Refusal {
    /// The answer's status.
    pub fn status(self) -> StatusCode {
        match self {
            Self::TransferCoding => StatusCode::NOT_IMPLEMENTED,
            Self::NoHost | Self::SeveralHosts | Self::HostDiffers => StatusCode::BAD_REQUEST,
        }
    }

    /// The answer's detail.
    pub fn detail(self) -> &'static str {
        match self {
            Self::TransferCoding => "a transfer coding other than chunked is not forwarded",
            Self::NoHost => "an HTTP/1.1 request needs a Host field",
            Self::SeveralHosts => "the request has more than one Host field",
            Self::HostDiffers => "the Host field differs from the request target's authority",
        }
    }
}

/// Removes the hop-by-hop headers and those `Connection` names; returns the `Upgrade` value
/// when `Connection` asked for an upgrade (only HTTP/1.1 has them), less `h2c`: a cleartext
/// HTTP/2 connection behind the proxy would carry requests the limit never sees.
///
/// # Errors
/// `Transfer-Encoding` lists a coding besides `chunked`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, version: Version) -> Result<Option<HeaderValue>, Refusal> {
    let names = hop_by_hop();
    let found = present(headers, names);
    // `TRANSFER_ENCODING` is the fifth.
    if found[4] && other_transfer_coding(headers) {
        return Err(Refusal::TransferCoding);
    }
    let mut upgrade = None;
    // `CONNECTION` is the first of them. Its usual `keep-alive` and `close` name no header
    // but the listed `Keep-Alive`: only other tokens are looked up.
    if found[0] {
        let named: Vec<HeaderName> = (headers.get_all(&CONNECTION).iter())
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .map(str::trim)
            .filter(|token| !token.eq_ignore_ascii_case("keep-alive") && !token.eq_ignore_ascii_case("close"))
            .filter_map(|token| HeaderName::from_bytes(token.as_bytes()).ok())
            .collect();
        for name in &named {
            if name == UPGRADE && version == Version::HTTP_11 {
                upgrade = headers.get(&UPGRADE).cloned().and_then(without_h2c);
            }
            headers.remove(name);
        }
    }
    for (name, found) in names.into_iter().zip(found) {
        if found {
            headers.remove(name);
        }
    }
    Ok(upgrade)
}

/// The comma-separated tokens of `headers`' `name` fields, empty list elements left out.
fn tokens<'a>(headers: &'a HeaderMap, name: &HeaderName) -> impl Iterator<Item = &'a [u8]> {
    (headers.get_all(name).iter())
        .flat_map(|value| value.as_bytes().split(|&byte| byte == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
}

/// Whether `Transfer-Encoding` lists a coding besides `chunked`.
fn other_transfer_coding(headers: &HeaderMap) -> bool {
    tokens(headers, &TRANSFER_ENCODING).any(|coding| !coding.eq_ignore_ascii_case(b"chunked"))
}

/// An `Upgrade` value without `h2c`; `None` if nothing else is left.
fn without_h2c(upgrade: HeaderValue) -> Option<HeaderValue> {
    let is_h2c = |protocol: &&[u8]| protocol.eq_ignore_ascii_case(b"h2c");
    let mut protocols = (upgrade.as_bytes().split(|&byte| byte == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|protocol| !protocol.is_empty());
    if !protocols.clone().any(|protocol| is_h2c(&protocol)) {
        return Some(upgrade);
    }
    let kept: Vec<&[u8]> = protocols.by_ref().filter(|protocol| !is_h2c(protocol)).collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept.join(&b", "[..])).ok()
}

/// Whether the `offered` `Upgrade` value lists the protocol `chosen` names.
pub fn offers(offered: &HeaderValue, chosen: &HeaderValue) -> bool {
    let chosen = chosen.as_bytes().trim_ascii();
    (offered.as_bytes().split(|&byte| byte == b','))
        .any(|protocol| protocol.trim_ascii().eq_ignore_ascii_case(chosen))
}

/// Puts an upgrade's `Connection: upgrade` and `Upgrade` back after the strip.
pub fn keep_upgrade(headers: &mut HeaderMap, upgrade: HeaderValue) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(UPGRADE, upgrade);
}

/// Whether the upstream accepted an upgrade.
pub fn upgraded(status: StatusCode) -> bool {
    status == StatusCode::SWITCHING_PROTOCOLS
}

/// How the forwarding headers are written for one request.
pub struct Client {
    /// The connection's peer.
    pub peer: IpAddr,
    /// Whether the peer is a trusted proxy: its forwarding headers are extended, not
    /// replaced.
    pub trusted: bool,
    /// `http` or `https`: how the client reached sluice.
    pub scheme: &'static str,
}

/// Forwarding fields to be written after a request's own, rather than put in its map (where
/// each would be hashed in, and might grow it).
pub type Added = [(&'static HeaderName, HeaderValue); 3];

/// Writes `X-Forwarded-For`, `Forwarded` and `X-Forwarded-Proto`. A trusted proxy's own values
/// are kept and the peer appended (an upstream that walks the list from the right, trusting
/// the same proxies and sluice, finds the client sluice keyed); anyone else's, and their
/// `X-Real-IP` and `X-Forwarded-Host`, are removed and sluice's returned, to be written
/// after the request's fields.
pub fn write_forwarding(headers: &mut HeaderMap, client: &Client) -> Option<Added> {
    let peer = client.peer.to_canonical();
    if !client.trusted {
        let names = [
            &X_FORWARDED_FOR,
            &FORWARDED,
            &X_FORWARDED_PROTO,
            &X_REAL_IP,
            &X_FORWARDED_HOST,
        ];
        for (name, found) in names.into_iter().zip(present(headers, names)) {
            if found {
                headers.remove(name);
            }
        }
        let (for_value, forwarded) = own_hop(peer, client.scheme);
        return Some([
            (&X_FORWARDED_FOR, for_value),
            (&FORWARDED_NAME, forwarded),
            (&X_FORWARDED_PROTO, HeaderValue::from_static(client.scheme)),
        ]);
    }
    extend(headers, &X_FORWARDED_FOR, format_args!("{peer}"));
    match peer {
        IpAddr::V4(ip) => extend(
            headers,
            &FORWARDED,
            format_args!("for={ip};proto={}", client.scheme),
        ),
        IpAddr::V6(ip) => extend(
            headers,
            &FORWARDED,
            format_args!("for=\"[{ip}]\";proto={}", client.scheme),
        ),
    }
    if !headers.contains_key(&X_FORWARDED_PROTO) {
        headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(client.scheme));
    }
    None
}

/// The `X-Forwarded-For` and `Forwarded` values of a client sluice saw directly. The last
/// client's are kept on the thread: the requests of one keep-alive connection, and of one
/// address, reuse them (a reference count, not a new string each).
fn own_hop(peer: IpAddr, scheme: &'static str) -> (HeaderValue, HeaderValue) {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(IpAddr, &'static str, HeaderValue, HeaderValue)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| {
        if let Some((ip, proto, for_value, forwarded)) = last.as_ref()
            && *ip == peer
            && *proto == scheme
        {
            return (for_value.clone(), forwarded.clone());
        }
        let for_value = header_value(format!("{peer}"));
        let forwarded = header_value(match peer {
            IpAddr::V4(ip) => format!("for={ip};proto={scheme}"),
            IpAddr::V6(ip) => format!("for=\"[{ip}]\";proto={scheme}"),
        });
        *last = Some((peer, scheme, for_value.clone(), forwarded.clone()));
        (for_value, forwarded)
    })
}

/// A header value of text made here (an address, `for=…`): always visible ASCII.
fn header_value(text: String) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(text))
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Ends the list in `name` with `hop`, as one line (`a, b, hop`): an application that reads
/// only a header's first line still sees the whole list.
fn extend(headers: &mut HeaderMap, name: &HeaderName, hop: std::fmt::Arguments<'_>) {
    let mut text = String::with_capacity(64);
    for line in headers.get_all(name) {
        // A trusted proxy's line: visible ASCII, or the client-IP check refused it already.
        if let Ok(line) = line.to_str() {
            text.push_str(line);
            text.push_str(", ");
        }
    }
    let _ = text.write_fmt(hop);
    if let Ok(value) = HeaderValue::from_str(&text) {
        headers.insert(name.clone(), value);
    }
}

/// Sets `Host` for the upstream: the client's kept (an HTTP/2 request's `:authority` becomes
/// it), or removed so the upstream's own is written, the client's then in `X-Forwarded-Host`.
///
/// # Errors
/// An HTTP/1.1 request (`version`) without `Host`, more than one `Host`, or one that differs
/// from the target's authority.
pub fn set_host(
    headers: &mut HeaderMap,
    authority: Option<&http::uri::Authority>,
    keep: bool,
    version: Version,
) -> Result<(), Refusal> {
    let mut hosts = headers.get_all(&HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Refusal::SeveralHosts);
    }
    match (host, authority) {
        (None, _) if version == Version::HTTP_11 => return Err(Refusal::NoHost),
        (Some(host), Some(authority))
            if !host
                .as_bytes()
                .eq_ignore_ascii_case(authority.as_str().as_bytes()) =>
        {
            return Err(Refusal::HostDiffers);
        }
        _ => {}
    }
    let present = host.is_some();
    if keep && present {
        return Ok(());
    }
    // The client's own, taken out rather than copied; else the target's authority.
    let client_host = if present {
        headers.remove(&HOST)
    } else {
        authority.and_then(|authority| HeaderValue::from_str(authority.as_str()).ok())
    };
    if keep {
        headers.extend(client_host.map(|host| (HOST, host)));
    } else {
        headers.extend(client_host.map(|host| (X_FORWARDED_HOST.clone(), host)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn values<'a>(map: &'a HeaderMap, name: &str) -> Vec<&'a str> {
        map.get_all(name).iter().map(|v| v.to_str().unwrap()).collect()
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_go() {
        let mut map = headers(&[
            ("connection", "keep-alive, x-secret"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("transfer-encoding", "chunked"),
            ("proxy-connection", "keep-alive"),
            ("x-secret", "1"),
            ("x-kept", "2"),
        ]);
        assert_eq!(strip_hop_by_hop(&mut map, Version::HTTP_11), Ok(None));
        assert_eq!(map.len(), 1, "{map:?}");
        assert_eq!(values(&map, "x-kept"), ["2"]);
    }

    #[test]
    fn an_upgrade_is_found_and_put_back() {
        let mut map = headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        let upgrade = strip_hop_by_hop(&mut map, Version::HTTP_11).unwrap().unwrap();
        assert!(map.is_empty());
        keep_upgrade(&mut map, upgrade);
        assert_eq!(values(&map, "upgrade"), ["websocket"]);
        assert_eq!(values(&map, "connection"), ["upgrade"]);
        // An Upgrade header without Connection naming it is no upgrade.
        let mut map = headers(&[("upgrade", "websocket")]);
        assert_eq!(strip_hop_by_hop(&mut map, Version::HTTP_11), Ok(None));
        assert!(map.is_empty());
        // h2c is never offered on: alone it is no upgrade; with others, they are kept.
        let mut map = headers(&[("connection", "upgrade"), ("upgrade", "H2C")]);
        assert_eq!(strip_hop_by_hop(&mut map, Version::HTTP_11), Ok(None));
        let mut map = headers(&[("connection", "upgrade"), ("upgrade", "h2c, websocket,,foo/2")]);
        let upgrade = strip_hop_by_hop(&mut map, Version::HTTP_11).unwrap().unwrap();
        assert_eq!(upgrade, "websocket, foo/2");
        assert!(offers(&upgrade, &HeaderValue::from_static("WebSocket")));
        assert!(offers(&upgrade, &HeaderValue::from_static("foo/2")));
        assert!(!offers(&upgrade, &HeaderValue::from_static("h2c")));
        assert!(!offers(&upgrade, &HeaderValue::from_static("foo")));
    }

    #[test]
    fn a_transfer_coding_besides_chunked_is_refused() {
        for (codings, refused) in [
            ("chunked", false),
            ("Chunked , ", false),
            ("gzip, chunked", true),
            ("identity", true),
        ] {
            let mut map = headers(&[("transfer-encoding", codings)]);
            let stripped = strip_hop_by_hop(&mut map, Version::HTTP_11);
            assert_eq!(stripped.is_err(), refused, "{codings}");
        }
        let mut map = headers(&[("transfer-encoding", "chunked"), ("transfer-encoding", "gzip")]);
        assert_eq!(
            strip_hop_by_hop(&mut map, Version::HTTP_11),
            Err(Refusal::TransferCoding)
        );
    }

    #[test]
    fn an_untrusted_clients_forwarding_headers_are_replaced() {
        let mut map = headers(&[
            ("x-forwarded-for", "1.2.3.4"),
            ("forwarded", "for=1.2.3.4"),
            ("x-forwarded-proto", "https"),
            ("x-real-ip", "1.2.3.4"),
            ("x-forwarded-host", "evil"),
        ]);
        let client = Client {
            peer: "192.0.2.7".parse().unwrap(),
            trusted: false,
            scheme: "http",
        };
        let added = write_forwarding(&mut map, &client).unwrap();
        assert!(map.is_empty(), "the client's own are all gone: {map:?}");
        let added: Vec<_> = (added.iter())
            .map(|(name, value)| (name.as_str(), value.to_str().unwrap()))
            .collect();
        assert_eq!(
            added,
            [
                ("x-forwarded-for", "192.0.2.7"),
                ("forwarded", "for=192.0.2.7;proto=http"),
                ("x-forwarded-proto", "http")
            ]
        );
    }

    #[test]
    fn a_trusted_proxys_headers_are_extended() {
        let mut map = headers(&[("x-forwarded-for", "203.0.113.9"), ("x-forwarded-proto", "https")]);
        let client = Client {
            peer: "::ffff:10.0.0.1".parse().unwrap(),
            trusted: true,
            scheme: "http",
        };
        assert!(
            write_forwarding(&mut map, &client).is_none(),
            "a trusted proxy's are extended in place"
        );
        assert_eq!(values(&map, "x-forwarded-for"), ["203.0.113.9, 10.0.0.1"]);
        assert_eq!(values(&map, "x-forwarded-proto"), ["https"]);
        assert_eq!(values(&map, "forwarded"), ["for=10.0.0.1;proto=http"]);
        let v6 = Client {
            peer: "2001:db8::1".parse().unwrap(),
            trusted: true,
            scheme: "https",
        };
        let mut map = HeaderMap::new();
        assert!(write_forwarding(&mut map, &v6).is_none());
        assert_eq!(values(&map, "forwarded"), ["for=\"[2001:db8::1]\";proto=https"]);
    }

    #[test]
    fn host_is_kept_or_moved_aside() {
        let authority: http::uri::Authority = "h2.example:8443".parse().unwrap();
        let mut map = HeaderMap::new();
        set_host(&mut map, Some(&authority), true, Version::HTTP_2).unwrap();
        assert_eq!(values(&map, "host"), ["h2.example:8443"]);
        let mut map = headers(&[("host", "app.example")]);
        set_host(&mut map, None, false, Version::HTTP_11).unwrap();
        assert!(values(&map, "host").is_empty());
        assert_eq!(values(&map, "x-forwarded-host"), ["app.example"]);
        // The target's authority, in any case, is the same host.
        let mut map = headers(&[("host", "H2.example:8443")]);
        set_host(&mut map, Some(&authority), true, Version::HTTP_11).unwrap();
        assert_eq!(values(&map, "host"), ["H2.example:8443"]);
    }

    #[test]
    fn a_host_that_could_be_read_two_ways_is_refused() {
        let authority: http::uri::Authority = "a.example".parse().unwrap();
        for keep in [true, false] {
            let mut map = headers(&[("host", "a.example"), ("host", "b.example")]);
            assert_eq!(
                set_host(&mut map, None, keep, Version::HTTP_11),
                Err(Refusal::SeveralHosts)
            );
            let mut map = headers(&[("host", "b.example")]);
            assert_eq!(
                set_host(&mut map, Some(&authority), keep, Version::HTTP_11),
                Err(Refusal::HostDiffers)
            );
            assert_eq!(values(&map, "host"), ["b.example"], "left as it was");
            // HTTP/1.1 needs one, even with an absolute-form target; HTTP/1.0 does not.
            let mut map = HeaderMap::new();
            assert_eq!(
                set_host(&mut map, Some(&authority), keep, Version::HTTP_11),
                Err(Refusal::NoHost)
            );
            assert_eq!(set_host(&mut map, None, keep, Version::HTTP_10), Ok(()));
        }
    }
}
