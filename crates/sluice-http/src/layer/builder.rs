//! [`RateLimitBuilder`]: the layer's settings, checked when it is built.

use std::net::SocketAddr;
use std::sync::Arc;

use sluice::WaitPolicy;

use super::RateLimitLayer;
use super::gatekeeper::Gatekeeper;
use crate::charge::Charger;
use crate::headers::{next_policy_id, valid_policy_name};
use crate::key::{KeyPart, KeySource, MAX_KEY_LEN};
use crate::wait::{ExcessPolicies, waits};
use crate::{
    ChargeFrom, ChargeTally, ClientIpHeader, LimitBackend, PeerAddr, RouteCosts, TrustedProxies, WaitRoom,
};

/// The IPv6 prefix clients are keyed by unless set: a /64 is what one subscriber or host
/// usually holds, and it can pick any address in it.
///
/// # Example
/// ```
/// assert_eq!(sluice_http::DEFAULT_IPV6_PREFIX, 64);
/// ```
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

/// Why a [`RateLimitBuilder`] could not build a layer.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{LayerBuildError, RateLimitLayer};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse()?).build()?;
/// let refused = RateLimitLayer::builder(limiter).key([]).build();
/// assert_eq!(refused.unwrap_err(), LayerBuildError::NoKeyParts);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayerBuildError {
    /// No key part was given.
    #[error("the key needs at least one part (header:NAME, bearer or ip)")]
    NoKeyParts,
    /// The maximum key length is 0 or above [`MAX_KEY_LEN`].
    #[error("the maximum key length must be between 1 and {MAX_KEY_LEN}, not {0}")]
    MaxKeyLength(usize),
    /// The default key is empty or longer than the maximum key length.
    #[error("the default key {0:?} must be non-empty and no longer than the maximum key length")]
    DefaultKey(String),
    /// The policy name cannot be written in a structured field.
    #[error("the policy name {0:?} must be printable ASCII without '\"' or '\\'")]
    PolicyName(String),
    /// The IPv6 prefix is 0 or above 128.
    #[error("the IPv6 prefix must be between 1 and 128 bits, not {0}")]
    Ipv6Prefix(u8),
}

/// Reads the connection's peer address from a request's extensions.
///
/// # Example
/// ```
/// use std::net::SocketAddr;
/// let from_a_plain_address: sluice_http::PeerAddrReader = |ext| ext.get::<SocketAddr>().copied();
/// let mut ext = http::Extensions::new();
/// ext.insert("192.0.2.1:4000".parse::<SocketAddr>()?);
/// assert!(from_a_plain_address(&ext).is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type PeerAddrReader = fn(&http::Extensions) -> Option<SocketAddr>;

fn read_peer_addr(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions.get::<PeerAddr>().map(|peer| peer.0)
}

/// Builds a [`RateLimitLayer`].
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{ClientIpHeader, IpNet, KeyPart, RateLimitLayer, TrustedProxies};
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "100/s".parse()?).build()?;
/// let layer = RateLimitLayer::builder(limiter)
///     .key([KeyPart::Bearer, KeyPart::ClientIp])
///     .default_key("nobody")
///     .max_key_len(128)
///     .trusted_proxies(TrustedProxies::new(["10.0.0.0/8".parse::<IpNet>()?]))
///     .client_ip_header(ClientIpHeader::Forwarded)
///     .ipv6_prefix(56)
///     .headers_on_allow(false)
///     .build()?;
/// assert!(layer.needs_peer_addr());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a builder does nothing until built"]
pub struct RateLimitBuilder {
    backend: Arc<dyn LimitBackend>,
    parts: Vec<KeyPart>,
    default_key: String,
    max_key_len: usize,
    proxies: TrustedProxies,
    client_ip_header: ClientIpHeader,
    ipv6_prefix: u8,
    bypass: Vec<String>,
    costs: RouteCosts,
    headers_on_allow: bool,
    policy_name: String,
    peer_addr: PeerAddrReader,
    on_excess: WaitPolicy,
    on_excess_by_key: Vec<(String, WaitPolicy)>,
    wait_room: Option<Arc<WaitRoom>>,
    charge_from: Option<ChargeFrom>,
    charge_tally: Option<ChargeTally>,
}

impl RateLimitBuilder {
    /// The defaults over `backend`.
    pub(super) fn new(backend: Arc<dyn LimitBackend>) -> Self {
        Self {
            backend,
            parts: vec![KeyPart::ClientIp],
            default_key: "ANONYMOUS".to_string(),
            max_key_len: 256,
            proxies: TrustedProxies::default(),
            client_ip_header: ClientIpHeader::default(),
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
            bypass: Vec::new(),
            costs: RouteCosts::default(),
            headers_on_allow: true,
            policy_name: "default".to_string(),
            peer_addr: read_peer_addr,
            on_excess: WaitPolicy::reject(),
            on_excess_by_key: Vec::new(),
            wait_room: None,
            charge_from: None,
            charge_tally: None,
        }
    }

    /// Where the charges after responses are counted (default: a tally of the layer's own):
    /// give the tally of the layer this one replaces to keep counting from where it was.
    pub fn charge_tally(mut self, tally: ChargeTally) -> Self {
        self.charge_tally = Some(tally);
        self
    }

    /// Charges the cost each admitted request's response reports in a header, after the
    /// response, to the request's key whatever is left ([`LimitBackend::charge`]): for costs
    /// known only once served (tokens generated, bytes sent). The request itself is admitted
    /// as any other (at its route's cost); its key's next requests wait for the debt to be
    /// repaid. A value that is not a whole number charges nothing, one above the maximum
    /// charges the maximum; both are counted ([`RateLimitLayer::charge_counts`]).
    pub fn charge_from(mut self, from: ChargeFrom) -> Self {
        self.charge_from = Some(from);
        self
    }

    /// What the key is made of (default: the client IP). Several parts are joined by `|`,
    /// with `\` and `|` inside a part escaped by a `\`, so no two requests with different
    /// parts share a key: `x|y` and `z` make `x\|y|z`, `x` and `y|z` make `x|y\|z`. A part
    /// that is a header (or the `Authorization` of a bearer part) sent more than once is
    /// answered 400: which copy counts would depend on the proxies in between.
    pub fn key(mut self, parts: impl IntoIterator<Item = KeyPart>) -> Self {
        self.parts = parts.into_iter().collect();
        self
    }

    /// The key of a request that does not say who it is (default `ANONYMOUS`).
    pub fn default_key(mut self, key: impl Into<String>) -> Self {
        self.default_key = key.into();
        self
    }

    /// The longest key accepted, in bytes (default 256); longer ones are answered 400 and
    /// never stored.
    pub fn max_key_len(mut self, len: usize) -> Self {
        self.max_key_len = len;
        self
    }

    /// Proxies whose client IP header is believed (default: none).
    pub fn trusted_proxies(mut self, proxies: TrustedProxies) -> Self {
        self.proxies = proxies;
        self
    }

    /// The one header the trusted proxies report the client's address in (default
    /// [`ClientIpHeader::XForwardedFor`]); the others are never read. A request from a
    /// trusted proxy whose header is malformed or names no address is answered 400 (see
    /// [`TrustedProxies::client_ip`]).
    pub fn client_ip_header(mut self, header: ClientIpHeader) -> Self {
        self.client_ip_header = header;
        self
    }

    /// IPv6 clients are keyed by their network of this many bits (default
    /// [`DEFAULT_IPV6_PREFIX`], 1 to 128), written `2001:db8:1:2::/64`; 128 keys each
    /// address alone. IPv4 clients (and IPv4-mapped IPv6 addresses) are keyed by address.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Keys that are never limited.
    pub fn bypass<I: IntoIterator<Item = T>, T: Into<String>>(mut self, keys: I) -> Self {
        self.bypass = keys.into_iter().map(Into::into).collect();
        self
    }

    /// What each request costs (default: 1 each).
    pub fn costs(mut self, costs: RouteCosts) -> Self {
        self.costs = costs;
        self
    }

    /// Whether admitted responses carry the rate-limit fields too (default true). Denials
    /// always do.
    pub fn headers_on_allow(mut self, on: bool) -> Self {
        self.headers_on_allow = on;
        self
    }

    /// Where the peer address is found in a request's extensions (default: a [`PeerAddr`]).
    /// With axum's `into_make_service_with_connect_info::<SocketAddr>()`:
    /// `.peer_addr_with(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0))`.
    pub fn peer_addr_with(mut self, read: PeerAddrReader) -> Self {
        self.peer_addr = read;
        self
    }

    /// The policy's name in the `RateLimit-Policy` and `RateLimit` fields (default `default`).
    pub fn policy_name(mut self, name: impl Into<String>) -> Self {
        self.policy_name = name.into();
        self
    }

    /// What becomes of a request over its quota (default [`WaitPolicy::reject`]: a 429 at
    /// once). Under a policy that waits (a timeout above 0 and a queue limit above 0) it
    /// waits in its key's queue, in the policy's order, for at most the policy's timeout
    /// (`max_wait`), within its queue limit (in units of cost) and the [`WaitRoom`]'s bound
    /// on all waiters. A request that cannot be served within `max_wait`, or finds no room,
    /// is refused at once, its `Retry-After` saying when it could have been served. A
    /// waiting request holds no capacity, only its place: dropping its response future (a
    /// client that disconnects) leaves the queue. Responses of requests that waited carry
    /// `Server-Timing: ratelimit-wait;dur=MILLISECONDS`.
    ///
    /// Waiting runs on tokio's timer: the service must be called inside a tokio runtime with
    /// time enabled.
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice::{KeyedLimiter, QueueOrder, TokenBucket, WaitPolicy};
    /// use sluice_http::RateLimitLayer;
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "10/s".parse()?).build()?;
    /// let layer = RateLimitLayer::builder(limiter)
    ///     .on_excess(WaitPolicy::wait_up_to(Duration::from_secs(1)).with_queue_limit(10))
    ///     .on_excess_for("batch", WaitPolicy::wait_up_to(Duration::from_secs(30)).with_queue_order(QueueOrder::NewestFirst))
    ///     .on_excess_for("interactive", WaitPolicy::reject())
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn on_excess(mut self, policy: WaitPolicy) -> Self {
        self.on_excess = policy;
        self
    }

    /// What becomes of `key`'s requests over its quota, in place of
    /// [`on_excess`](Self::on_excess)'s policy.
    pub fn on_excess_for(mut self, key: impl Into<String>, policy: WaitPolicy) -> Self {
        self.on_excess_by_key.push((key.into(), policy));
        self
    }

    /// The queues waiting requests join, and their bound over all keys (default: a room of
    /// the layer's own, of [`DEFAULT_MAX_WAITERS`](crate::DEFAULT_MAX_WAITERS)). Share one
    /// between layers that should share the bound, or between a layer and the one rebuilt to
    /// replace it, so its waiters keep their places.
    pub fn wait_room(mut self, room: Arc<WaitRoom>) -> Self {
        self.wait_room = Some(room);
        self
    }

    /// The layer.
    ///
    /// # Errors
    /// [`LayerBuildError`] for no key part, a bad maximum length, default key, policy name or IPv6
    /// prefix.
    pub fn build(self) -> Result<RateLimitLayer, LayerBuildError> {
        if self.parts.is_empty() {
            return Err(LayerBuildError::NoKeyParts);
        }
        if self.max_key_len == 0 || self.max_key_len > MAX_KEY_LEN {
            return Err(LayerBuildError::MaxKeyLength(self.max_key_len));
        }
        if self.default_key.is_empty() || self.default_key.len() > self.max_key_len {
            return Err(LayerBuildError::DefaultKey(self.default_key));
        }
        if !valid_policy_name(&self.policy_name) {
            return Err(LayerBuildError::PolicyName(self.policy_name));
        }
        if !(1..=128).contains(&self.ipv6_prefix) {
            return Err(LayerBuildError::Ipv6Prefix(self.ipv6_prefix));
        }
        let by_key: std::collections::HashMap<_, _, _> = self
            .on_excess_by_key
            .into_iter()
            .map(|(key, policy)| (key.into_boxed_str(), waits(policy)))
            .collect();
        let default = waits(self.on_excess);
        let excess = (default.is_some() || by_key.values().any(Option::is_some)).then(|| ExcessPolicies {
            room: self.wait_room.unwrap_or_default(),
            default,
            by_key,
        });
        Ok(RateLimitLayer {
            gatekeeper: Arc::new(Gatekeeper {
                policy_id: next_policy_id(),
                backend: self.backend,
                keys: KeySource {
                    parts: self.parts,
                    default_key: self.default_key,
                    max_len: self.max_key_len,
                    ipv6_prefix: self.ipv6_prefix,
                },
                proxies: self.proxies,
                client_ip_header: self.client_ip_header,
                bypass: self.bypass.into_iter().map(String::into_boxed_str).collect(),
                costs: self.costs,
                headers_on_allow: self.headers_on_allow,
                policy_name: self.policy_name.into(),
                peer_addr: self.peer_addr,
                excess,
                charge: (self.charge_from)
                    .map(|from| Charger::new(from, self.charge_tally.unwrap_or_default())),
            }),
        })
    }
}
