//! A request's key, built by the layer from its headers and address.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, Request, Response};
use sluice::Decision;
use sluice_http::{CheckFuture, KeyPart, LimitBackend, PeerAddr, RateLimitLayer, TrustedProxies};

use crate::client_ip::choose;
use crate::input::Input;

const DEFAULT_KEY: &str = "NOBODY";
const KEYS: [&[&str]; 6] = [
    &["header:X-Account-ID"],
    &["bearer"],
    &["ip"],
    &["header:A", "header:B"],
    &["bearer", "ip", "header:A"],
    &["ip", "header:X-Account-ID"],
];
const NAMES: [&str; 7] = [
    "x-account-id",
    "a",
    "b",
    "authorization",
    "x-forwarded-for",
    "forwarded",
    "x-real-ip",
];
const BODIES: [&str; 15] = [
    "Key too long",
    "Key is not text",
    "Key header repeated",
    "Malformed X-Forwarded-For header",
    "Malformed Forwarded header",
    "Malformed X-Real-IP header",
    "Empty X-Forwarded-For header",
    "Empty Forwarded header",
    "Empty X-Real-IP header",
    "X-Forwarded-For header gives no client address",
    "Forwarded header gives no client address",
    "X-Real-IP header gives no client address",
    "X-Forwarded-For header repeated",
    "Forwarded header repeated",
    "X-Real-IP header repeated",
];

/// Admits everything and keeps the keys it was asked about.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<String>>>);

impl LimitBackend for Recorder {
    fn check(&self, key: &str, _cost: u64) -> CheckFuture {
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        keys.push(key.to_string());
        CheckFuture::ready(Ok(Decision::allowed(10, 9, 0)))
    }

    fn quota(&self, _key: &str) -> Option<sluice::Quota> {
        None
    }
}

/// `data` as a request's headers (one per `\n`, the first byte naming it) for one of several
/// key shapes: never a panic; a request is admitted under one key or refused with a known
/// 400 body; the key fits the maximum; joined parts split back into exactly the parts sent (so
/// no two different requests share a key); a key header sent twice is refused; an IPv6
/// client is keyed by its network; a refusal for the client IP comes only from a trusted
/// proxy's header.
///
/// # Example
/// ```
/// // Two header parts, A = `x|y` and B = `z`.
/// sluice_invariants::key(b"\x03\x40\x3f\x00\x00\x01\x01x|y\n\x02z");
/// ```
pub fn key(data: &[u8]) {
    let mut input = Input::new(data);
    let parts: Vec<KeyPart> = input.pick(&KEYS).iter().map(|p| part(p)).collect();
    let max_len = usize::from(input.byte() % 64) + DEFAULT_KEY.len();
    let ipv6_prefix = input.byte() % 128 + 1;
    let (header, peer, nets) = choose(&mut input);
    let proxies = TrustedProxies::new(nets.iter().copied());
    let mut headers = HeaderMap::new();
    for line in input.rest().split(|&b| b == b'\n') {
        let Some((&tag, value)) = line.split_first() else {
            continue;
        };
        let name = HeaderName::from_static(NAMES[usize::from(tag) % NAMES.len()]);
        let value = if name == AUTHORIZATION && tag & 0x80 != 0 {
            [b"Bearer ".as_slice(), value].concat()
        } else {
            value.to_vec()
        };
        if let Ok(value) = http::HeaderValue::from_bytes(&value) {
            headers.append(name, value);
        }
    }

    let recorder = Recorder::default();
    let layer = RateLimitLayer::builder(recorder.clone())
        .key(parts.iter().cloned())
        .default_key(DEFAULT_KEY)
        .max_key_len(max_len)
        .trusted_proxies(proxies.clone())
        .client_ip_header(header)
        .ipv6_prefix(ipv6_prefix)
        .build();
    let layer = match layer {
        Ok(layer) => layer,
        Err(e) => panic!("a valid layer refused: {e}"),
    };
    let mut request = Request::new(());
    *request.headers_mut() = headers.clone();
    request
        .extensions_mut()
        .insert(PeerAddr(SocketAddr::new(peer, 4711)));
    let response = call(&layer, request);
    let keys = recorder.0.lock().unwrap_or_else(PoisonError::into_inner).clone();

    let repeated = parts.iter().any(|p| values(p, &headers).len() > 1);
    let uses_ip = parts.contains(&KeyPart::ClientIp);
    let ip = proxies.client_ip(peer, header, &headers);
    if response.status() == 400 {
        let body = response.body().as_str();
        assert!(BODIES.contains(&body), "unknown body {body:?}");
        assert!(keys.is_empty(), "a refused request was counted: {keys:?}");
        if body == "Key header repeated" {
            assert!(repeated, "{headers:?}");
        }
        if BODIES[3..].contains(&body) {
            assert!(uses_ip, "the address was read for a key without it: {body}");
            assert_eq!(ip.map_err(|e| e.body()), Err(body));
        }
        return;
    }
    assert_eq!(response.status(), 200);
    assert!(!repeated, "a repeated key header was admitted: {headers:?}");
    if uses_ip && let Err(e) = ip {
        panic!("an unusable address was admitted: {e}");
    }
    let [key] = keys.as_slice() else {
        panic!("checked {keys:?}")
    };
    assert!(
        !key.is_empty() && key.len() <= max_len,
        "{key:?} (at most {max_len})"
    );
    let split = if parts.len() > 1 {
        split_key(key)
    } else {
        vec![key.clone()]
    };
    assert_eq!(split.len(), parts.len(), "{key:?}");
    for (part, text) in parts.iter().zip(&split) {
        let expected = match part {
            KeyPart::ClientIp => match ip {
                Ok(ip) => ip_key(ip, ipv6_prefix),
                Err(e) => panic!("{e}"),
            },
            _ => values(part, &headers)
                .first()
                .and_then(|v| std::str::from_utf8(v).ok())
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .unwrap_or(DEFAULT_KEY)
                .to_string(),
        };
        assert_eq!(text, &expected, "{part} in {key:?}");
    }
}

fn part(text: &str) -> KeyPart {
    match text.parse() {
        Ok(part) => part,
        Err(e) => panic!("{e}"),
    }
}

/// The raw values a part reads: the header's, or the bearer tokens of `Authorization`.
fn values(part: &KeyPart, headers: &HeaderMap) -> Vec<Vec<u8>> {
    match part {
        KeyPart::Header(name) => headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect(),
        KeyPart::Bearer => {
            let all: Vec<_> = headers.get_all(AUTHORIZATION).iter().collect();
            if all.len() > 1 {
                return all.iter().map(|v| v.as_bytes().to_vec()).collect();
            }
            all.iter()
                .filter_map(|v| {
                    let v = v.as_bytes();
                    (v.len() >= 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].to_vec())
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// The key of an address, computed apart from the layer's own code.
fn ip_key(ip: IpAddr, prefix: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V6(v6) if prefix < 128 => {
            let bits = v6.to_bits() & !(u128::MAX >> prefix);
            format!("{}/{prefix}", std::net::Ipv6Addr::from_bits(bits))
        }
        ip => ip.to_string(),
    }
}

/// A joined key split back into its parts: `|` separates, `\` escapes the next `\` or `|`.
fn split_key(key: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut chars = key.chars();
    while let Some(c) = chars.next() {
        let c = match c {
            '|' => {
                parts.push(String::new());
                continue;
            }
            '\\' => match chars.next() {
                Some(escaped @ ('\\' | '|')) => escaped,
                other => panic!("{key:?}: a '\\' before {other:?}"),
            },
            c => c,
        };
        if let Some(last) = parts.last_mut() {
            last.push(c);
        }
    }
    parts
}

/// The layer's answer to `request` in front of a service that answers 200.
fn call(layer: &RateLimitLayer, request: Request<()>) -> Response<String> {
    use tower_layer::Layer as _;
    use tower_service::Service as _;
    let mut service = layer.layer(Inner);
    let future = service.call(request);
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(response)) => response,
        Poll::Ready(Err(never)) => match never {},
        Poll::Pending => panic!("an in-memory answer is ready at once"),
    }
}

#[derive(Clone)]
struct Inner;

impl tower_service::Service<Request<()>> for Inner {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(String::new())))
    }
}
