//! The file as written: serde types, every field optional. A field left out is `None` where
//! the library has a default of its own, which then applies; see `default.yaml` for each
//! field's meaning.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawConfig {
    pub listen: String,
    /// TLS on `listen`.
    pub tls: Option<RawTls>,
    /// How sluice's own clients speak TLS to `https://` services.
    pub client_tls: Option<RawClientTls>,
    pub idle_timeout: String,
    /// After SIGTERM, how long the listeners keep accepting while readiness says stopping.
    pub drain_delay: String,
    /// Then, how long in-flight requests and waiters have to finish.
    pub shutdown_timeout: String,
    /// Derived from the file-descriptor limit when left out.
    pub max_connections: Option<usize>,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub key: RawKey,
    pub trusted_proxies: Vec<String>,
    /// `ClientIpHeader::default()` when left out.
    pub client_ip_header: Option<String>,
    /// `sluice_http::DEFAULT_IPV6_PREFIX` when left out; wider than a byte so that any
    /// number is refused with the range, not a type error.
    pub ipv6_prefix: Option<i64>,
    pub algorithm: String,
    pub burst: Option<u64>,
    pub failsafe: String,
    /// No pool when left out.
    pub failsafe_pool: Option<String>,
    pub unknown: String,
    pub fetch_latency: String,
    /// [`sluice::DEFAULT_FETCH_TIMEOUT`] when left out.
    pub fetch_timeout: Option<String>,
    pub refresh: String,
    /// [`sluice::DEFAULT_CAPACITY`] when left out.
    pub capacity: Option<usize>,
    pub headers: bool,
    pub bypass: Vec<String>,
    /// `reject` or `wait` (`reject` when left out), and how requests wait.
    pub on_excess: Option<String>,
    pub max_wait: Option<String>,
    pub queue_limit: Option<u64>,
    pub queue_order: Option<String>,
    /// Requests waiting in the whole server (`sluice_http::DEFAULT_MAX_WAITERS` when left out).
    pub max_waiters: Option<usize>,
    pub accounts: BTreeMap<String, RawAccount>,
    /// A quota service asked for every key not in `accounts`.
    pub accounts_url: Option<String>,
    pub costs: Vec<RawCost>,
    /// Post-paid costs read from a response header; none when left out.
    pub charge_from: Option<RawChargeFrom>,
    /// Where admitted requests are forwarded (reverse-proxy mode); none when left out: the
    /// demo answer.
    #[serde(deserialize_with = "url_or_upstream")]
    pub upstream: Option<RawUpstream>,
    pub redis: Option<RawRedis>,
    /// Descriptor rules (envoy ratelimit's format): a file or a directory, or a rules
    /// service to poll.
    pub rules: Option<RawRules>,
    pub rls: Option<RawRls>,
    pub api: Option<RawListener>,
    /// How one request's descriptors are counted (`all_or_nothing` when left out).
    pub counting: Option<String>,
    /// Rules files giving one domain are merged (envoy ratelimit's `MERGE_DOMAIN_CONFIG`).
    pub merge_domains: bool,
    /// The admin listener: metrics, health, the keys being limited.
    pub admin: Option<RawListener>,
    /// Denials logged a second at most (`DEFAULT_DENIED_LOG` when left out; 0: none).
    pub denied_log: Option<u32>,
    /// Traces exported over OTLP.
    pub otlp: Option<RawOtlp>,
    /// What `/metrics` labels its series with.
    pub metrics: Option<RawMetrics>,
}

impl Default for RawConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            tls: None,
            client_tls: None,
            idle_timeout: "30s".into(),
            drain_delay: "5s".into(),
            shutdown_timeout: "10s".into(),
            max_connections: None,
            max_header_bytes: 32 * 1024,
            max_headers: 100,
            key: RawKey::default(),
            trusted_proxies: Vec::new(),
            client_ip_header: None,
            ipv6_prefix: None,
            algorithm: "token_bucket".into(),
            burst: None,
            failsafe: "10/s".into(),
            failsafe_pool: None,
            unknown: "0/s".into(),
            fetch_latency: "0s".into(),
            fetch_timeout: None,
            refresh: "10s".into(),
            capacity: None,
            headers: true,
            bypass: Vec::new(),
            on_excess: None,
            max_wait: None,
            queue_limit: None,
            queue_order: None,
            max_waiters: None,
            accounts: BTreeMap::new(),
            accounts_url: None,
            costs: Vec::new(),
            charge_from: None,
            upstream: None,
            redis: None,
            rules: None,
            rls: None,
            api: None,
            counting: None,
            merge_domains: false,
            admin: None,
            denied_log: None,
            otlp: None,
            metrics: None,
        }
    }
}

/// The `charge_from:` section: every field is needed but `strip`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawChargeFrom {
    pub header: String,
    pub max: u64,
    #[serde(default)]
    pub strip: bool,
}

/// The `upstream:` section as a map; `upstream: URL` is the shorthand for `{url: URL}`
/// (`url_or_upstream`). Every field is optional; `upstream.rs` gives the defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawUpstream {
    /// Where a request no route matches goes.
    pub url: Option<String>,
    /// By path prefix, in file order.
    pub routes: Vec<RawUpstreamRoute>,
    /// `keep` or `upstream`.
    pub host: Option<String>,
    pub connect_timeout: Option<String>,
    pub head_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    /// Wider than `usize` so that a negative number is refused with the range, not a type error.
    pub max_idle: Option<i64>,
}

/// One of `upstream.routes`: both fields needed.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamRoute {
    pub prefix: String,
    pub url: String,
}

/// The field of the `upstream:` section a plain string stands for: `upstream: URL` is
/// `upstream: {url: URL}`. The environment's overlay keeps the string in that field when a
/// variable sets another one (`env::SHORTHANDS`).
pub(super) const UPSTREAM_SHORTHAND: &str = "url";

/// `upstream:` as written: a URL (the shorthand for `{url: URL}`), the map, or nothing.
fn url_or_upstream<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<RawUpstream>, D::Error> {
    struct Either;
    impl<'de> serde::de::Visitor<'de> for Either {
        type Value = Option<RawUpstream>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(
                "an upstream URL (http://HOST[:PORT] or https://HOST[:PORT]), or {url, routes, host, \
                 connect_timeout, head_timeout, idle_timeout, max_idle}",
            )
        }
        fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<Self::Value, E> {
            let mut shorthand = serde_norway::Mapping::new();
            shorthand.insert(UPSTREAM_SHORTHAND.into(), url.into());
            RawUpstream::deserialize(serde_norway::Value::Mapping(shorthand))
                .map(Some)
                .map_err(E::custom)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            RawUpstream::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    deserializer.deserialize_any(Either)
}

/// The `redis:` section; a field left out takes its value from `RedisSettings::default()`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRedis {
    pub url: Option<String>,
    pub cluster: Vec<String>,
    pub policy: Option<String>,
    pub hosts: Option<u64>,
    pub timeout: Option<String>,
    pub degrade_after: Option<u32>,
    pub prefix: Option<String>,
    /// For `rediss://`: the CA, and a client certificate and key (PEM files).
    pub tls: Option<RawClientTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawKey {
    pub from: Vec<String>,
    pub default: String,
    pub max_length: usize,
}

impl Default for RawKey {
    fn default() -> Self {
        Self {
            from: vec!["header:X-Account-ID".into()],
            default: "ANONYMOUS".into(),
            max_length: 256,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCost {
    pub path: String,
    #[serde(default)]
    pub method: Option<String>,
    pub cost: u64,
}

/// The `rls:` section: Envoy's rate-limit service over gRPC.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRls {
    /// Where RLS listens; left out, the section only sets how the service answers.
    #[serde(default)]
    pub listen: Option<String>,
    /// The rate-limit fields answers carry (`none` when left out).
    #[serde(default)]
    pub headers: Option<String>,
    /// Every request answered OK, counted as if enforced (envoy's `SHADOW_MODE`).
    #[serde(default)]
    pub shadow: bool,
    /// Every rule in quota mode (envoy's `QUOTA_MODE`).
    #[serde(default)]
    pub quota_mode: bool,
    /// Answers carry dynamic metadata (envoy's `RESPONSE_DYNAMIC_METADATA`).
    #[serde(default)]
    pub dynamic_metadata: bool,
    /// Envoy's quota streaming (RLQS) served on the RLS port too.
    #[serde(default)]
    pub rlqs: bool,
    /// RLQS servers behind one address, each handing out its share of a limit (1 when left
    /// out); wider than the setting so any number is refused with the range.
    #[serde(default)]
    pub rlqs_servers: Option<i64>,
    /// TLS on the RLS port.
    #[serde(default)]
    pub tls: Option<RawTls>,
}

/// A section that says where to listen, and how to speak TLS there.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListener {
    pub listen: String,
    #[serde(default)]
    pub tls: Option<RawTls>,
}

/// `otlp:`: the collector traces are exported to, the share of traces kept (1 when left
/// out), and whether decision spans name their keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOtlp {
    pub endpoint: String,
    #[serde(default)]
    pub sample_ratio: Option<f64>,
    #[serde(default)]
    pub keys: bool,
}

/// `metrics:`: whether decisions are counted per rule (true when left out) or per domain.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    #[serde(default)]
    pub per_rule: Option<bool>,
}

/// `client_tls:`: the CA sluice's clients trust (Mozilla's roots if left out) and the client
/// certificate they present, if any.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientTls {
    #[serde(default)]
    pub ca: Option<String>,
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
}

/// `tls:` of a listener: its certificate chain and key (PEM files), and the clients it
/// requires (mTLS): those with a certificate from `client_ca`, named in `allow` if given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub cert: String,
    pub key: String,
    #[serde(default)]
    pub client_ca: Option<String>,
    #[serde(default)]
    pub allow: Vec<String>,
}

/// `rules:` as written: a path, or a map naming a rules service.
#[derive(Debug)]
pub(super) enum RawRules {
    Path(String),
    Service(RawRulesService),
}

/// `rules: {url, ...}`: the rules service a host polls.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRulesService {
    pub url: String,
    #[serde(default)]
    pub poll: Option<String>,
    #[serde(default)]
    pub timeout: Option<String>,
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub snapshot: Option<String>,
}

impl<'de> Deserialize<'de> for RawRules {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = RawRules;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a rules file or directory, or {url, poll, timeout, token, snapshot}")
            }
            fn visit_str<E: serde::de::Error>(self, path: &str) -> Result<RawRules, E> {
                Ok(RawRules::Path(path.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawRules, A::Error> {
                RawRulesService::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawRules::Service)
            }
        }
        deserializer.deserialize_any(Either)
    }
}

/// How an account's (or the server's) requests over their quota are treated; a field left out
/// is the server's.
#[derive(Debug, Default)]
pub(super) struct RawWait {
    pub on_excess: Option<String>,
    pub max_wait: Option<String>,
    pub queue_limit: Option<u64>,
    pub queue_order: Option<String>,
}

/// An account as written: its quota, a list of quotas (`[1/s, 100/day]`, every one enforced),
/// or `{quota, on_excess, max_wait, queue_limit, queue_order}` (`quota` one or a list).
#[derive(Debug)]
pub(super) struct RawAccount {
    pub quotas: Vec<String>,
    pub wait: Option<RawWait>,
}

/// One quota's text, or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(text) => vec![text],
            Self::Many(texts) => texts,
        }
    }
}

/// `{quota, ...}`: an account with its own way of waiting.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccountMap {
    quota: OneOrMany,
    #[serde(default)]
    on_excess: Option<String>,
    #[serde(default)]
    max_wait: Option<String>,
    #[serde(default)]
    queue_limit: Option<u64>,
    #[serde(default)]
    queue_order: Option<String>,
}

impl<'de> Deserialize<'de> for RawAccount {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = RawAccount;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quota (COUNT/PERIOD [burst N]), a list of quotas, or {quota, on_excess, max_wait, queue_limit, queue_order}")
            }
            fn visit_str<E: serde::de::Error>(self, quota: &str) -> Result<RawAccount, E> {
                Ok(RawAccount {
                    quotas: vec![quota.to_owned()],
                    wait: None,
                })
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<RawAccount, A::Error> {
                let quotas = Vec::<String>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(RawAccount { quotas, wait: None })
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<RawAccount, A::Error> {
                let account = RawAccountMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(RawAccount {
                    quotas: account.quota.into_vec(),
                    wait: Some(RawWait {
                        on_excess: account.on_excess,
                        max_wait: account.max_wait,
                        queue_limit: account.queue_limit,
                        queue_order: account.queue_order,
                    }),
                })
            }
        }
        deserializer.deserialize_any(Either)
    }
}
