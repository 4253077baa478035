//! The YAML config: read, checked field by field, turned into [`Settings`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use sluice::{
    Algorithm, FixedWindow, LeakyBucket, Quota, SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use sluice_http::{CostRule, IpNet, KeyPart, MAX_KEY_LEN};

/// The most keys a config may ask the limiter to hold (about 6 GB of entries): a bound, so a
/// typo cannot make the server try to allocate without limit at start.
const MAX_CAPACITY: usize = 100_000_000;

/// The demo of seed 000, used when no `--config` is given.
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");

/// A config that cannot be used, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// The field, as a path (`accounts.alice`, `key.from[1]`), or `line L column C`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn error(field: impl Into<String>, message: impl ToString) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.to_string(),
    }
}

/// The file as written. Every field is optional; see `default.yaml` for each one's meaning.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
    listen: String,
    idle_timeout: String,
    key: RawKey,
    trusted_proxies: Vec<String>,
    algorithm: String,
    burst: Option<u64>,
    failsafe: String,
    unknown: String,
    fetch_latency: String,
    refresh: String,
    capacity: usize,
    headers: bool,
    bypass: Vec<String>,
    accounts: BTreeMap<String, String>,
    costs: Vec<RawCost>,
    redis: Option<RawRedis>,
}

impl Default for RawConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            idle_timeout: "30s".into(),
            key: RawKey::default(),
            trusted_proxies: Vec::new(),
            algorithm: "token_bucket".into(),
            burst: None,
            failsafe: "10/s".into(),
            unknown: "0/s".into(),
            fetch_latency: "0s".into(),
            refresh: "10s".into(),
            capacity: 100_000,
            headers: true,
            bypass: Vec::new(),
            accounts: BTreeMap::new(),
            costs: Vec::new(),
            redis: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawRedis {
    url: Option<String>,
    cluster: Vec<String>,
    policy: String,
    hosts: u64,
    timeout: String,
    prefix: String,
}

impl Default for RawRedis {
    fn default() -> Self {
        Self {
            url: None,
            cluster: Vec::new(),
            policy: "local_share".into(),
            hosts: 1,
            timeout: "50ms".into(),
            prefix: "sluice".into(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawKey {
    from: Vec<String>,
    default: String,
    max_length: usize,
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
struct RawCost {
    path: String,
    #[serde(default)]
    method: Option<String>,
    cost: u64,
}

/// Which algorithm the keyed limiter runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmKind {
    /// [`TokenBucket`]
    TokenBucket,
    /// [`LeakyBucket::meter`]
    LeakyBucket,
    /// [`FixedWindow`]
    FixedWindow,
    /// [`SlidingWindowLog`]
    SlidingWindowLog,
    /// [`SlidingWindowCounter`]
    SlidingWindowCounter,
}

const ALGORITHMS: &str =
    "token_bucket, leaky_bucket, fixed_window, sliding_window_log, sliding_window_counter";

impl AlgorithmKind {
    fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "token_bucket" => Self::TokenBucket,
            "leaky_bucket" => Self::LeakyBucket,
            "fixed_window" => Self::FixedWindow,
            "sliding_window_log" => Self::SlidingWindowLog,
            "sliding_window_counter" => Self::SlidingWindowCounter,
            _ => return None,
        })
    }

    /// Whether this algorithm can hold `quota`.
    fn check(self, quota: &Quota) -> Result<(), sluice::QuotaError> {
        match self {
            Self::TokenBucket => TokenBucket.params(quota).map(drop),
            Self::LeakyBucket => LeakyBucket::meter().params(quota).map(drop),
            Self::FixedWindow => FixedWindow.params(quota).map(drop),
            Self::SlidingWindowLog => SlidingWindowLog.params(quota).map(drop),
            Self::SlidingWindowCounter => SlidingWindowCounter.params(quota).map(drop),
        }
    }
}

/// What a check answers when Redis does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisPolicy {
    /// Admit.
    FailOpen,
    /// Deny.
    FailClosed,
    /// This server's share of the quota (`quota / hosts`), in memory.
    LocalShare,
}

const REDIS_POLICIES: &str = "fail_open, fail_closed, local_share";

/// Limits shared through Redis (the `redis:` section, or `--redis URL`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// Where Redis is (`None` until `--redis` gives it, or when `cluster` does).
    pub url: Option<String>,
    /// The nodes of a Redis Cluster to use instead (any of them leads to the rest; empty: a
    /// single server at `url`).
    pub cluster: Vec<String>,
    /// The answer while Redis does not answer.
    pub policy: RedisPolicy,
    /// How many servers share the limits (the local share is `quota / hosts`).
    pub hosts: u64,
    /// The longest a check waits for Redis.
    pub timeout: Duration,
    /// The prefix of every Redis key.
    pub prefix: String,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: None,
            cluster: Vec::new(),
            policy: RedisPolicy::LocalShare,
            hosts: 1,
            timeout: Duration::from_millis(50),
            prefix: "sluice".into(),
        }
    }
}

/// Sets (or overrides) the Redis URL, as `--redis URL` does: that one server is used, even
/// where the config names a cluster.
pub fn with_redis_url(mut settings: Settings, url: &str) -> Result<Settings, ConfigError> {
    check_redis_url("--redis", url)?;
    check_redis_algorithm("--redis", settings.limiter.algorithm)?;
    let redis = settings.limiter.redis.get_or_insert_with(RedisSettings::default);
    redis.url = Some(url.to_string());
    redis.cluster.clear();
    Ok(settings)
}

fn check_redis_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let schemes = ["redis://", "unix://", "redis+unix://"];
    if schemes.iter().any(|scheme| url.starts_with(scheme)) {
        Ok(())
    } else {
        Err(error(
            field,
            format!("invalid Redis URL {url:?}: expected redis://HOST[:PORT][/DB] or unix://PATH"),
        ))
    }
}

fn check_redis_algorithm(field: &str, algorithm: AlgorithmKind) -> Result<(), ConfigError> {
    if algorithm == AlgorithmKind::LeakyBucket {
        return Err(error(
            field,
            "the leaky_bucket algorithm has no Redis backend: use token_bucket, fixed_window, \
             sliding_window_log or sliding_window_counter",
        ));
    }
    Ok(())
}

impl RawRedis {
    fn check(self, algorithm: AlgorithmKind) -> Result<RedisSettings, ConfigError> {
        if let Some(url) = &self.url {
            check_redis_url("redis.url", url)?;
        }
        for (i, url) in self.cluster.iter().enumerate() {
            check_redis_url(&format!("redis.cluster[{i}]"), url)?;
        }
        if self.url.is_some() && !self.cluster.is_empty() {
            return Err(error(
                "redis.cluster",
                "give either redis.url (one server) or redis.cluster (a cluster's nodes), not both",
            ));
        }
        check_redis_algorithm("redis", algorithm)?;
        let policy = match self.policy.as_str() {
            "fail_open" => RedisPolicy::FailOpen,
            "fail_closed" => RedisPolicy::FailClosed,
            "local_share" => RedisPolicy::LocalShare,
            other => {
                return Err(error(
                    "redis.policy",
                    format!("unknown policy {other:?}: expected one of {REDIS_POLICIES}"),
                ));
            }
        };
        if self.hosts == 0 {
            return Err(error("redis.hosts", "must be at least 1"));
        }
        let timeout = duration("redis.timeout", &self.timeout)?;
        if timeout.is_zero() {
            return Err(error("redis.timeout", "must be longer than 0"));
        }
        if self.prefix.is_empty() {
            return Err(error("redis.prefix", "must not be empty"));
        }
        Ok(RedisSettings {
            url: self.url,
            cluster: self.cluster,
            policy,
            hosts: self.hosts,
            timeout,
            prefix: self.prefix,
        })
    }
}

/// What shapes the keyed limiter itself; a change to any of these needs a new limiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterSettings {
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// The quota of a key while its own is being fetched.
    pub failsafe: Quota,
    /// The quota of keys not in `accounts`.
    pub unknown: Quota,
    /// Simulated latency of the quota fetch.
    pub fetch_latency: Duration,
    /// How often a key's quota is fetched again.
    pub refresh: Duration,
    /// The most keys held at once.
    pub capacity: usize,
    /// Limits shared through Redis instead of held in memory.
    pub redis: Option<RedisSettings>,
}

/// A checked config.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How long a connection may go without starting a request.
    pub idle_timeout: Duration,
    /// The limiter's shape.
    pub limiter: LimiterSettings,
    /// Quotas by key.
    pub accounts: HashMap<String, Quota>,
    /// What a key is made of.
    pub key_parts: Vec<KeyPart>,
    /// The key of a request that does not say who it is.
    pub default_key: String,
    /// The longest key accepted.
    pub max_key_len: usize,
    /// Proxies whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Keys never limited.
    pub bypass: Vec<String>,
    /// Costs by route and method.
    pub costs: Vec<CostRule>,
    /// Whether admitted responses carry the rate-limit fields.
    pub headers: bool,
}

/// Reads and checks a config file.
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    load_with_bytes(path).map(|(settings, _)| settings)
}

/// Reads and checks a config file, returning the bytes read too (what a reload compares with).
pub fn load_with_bytes(path: &Path) -> Result<(Settings, Vec<u8>), ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| error("file", e))?;
    let settings = parse_bytes(&bytes)?;
    Ok((settings, bytes))
}

/// Checks config bytes, which must be UTF-8 text.
pub fn parse_bytes(bytes: &[u8]) -> Result<Settings, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|_| error("file", "not UTF-8 text"))?;
    parse(text)
}

/// Checks config text.
pub fn parse(text: &str) -> Result<Settings, ConfigError> {
    let deserializer = serde_norway::Deserializer::from_str(text);
    let raw: RawConfig = serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // Unknown parts of the path (a syntax error inside a map) read as `?`: say where.
        let known = path
            .split(".?")
            .next()
            .unwrap_or_default()
            .trim_matches('.')
            .to_string();
        let field = match inner.location() {
            Some(at) if known.is_empty() => format!("line {} column {}", at.line(), at.column()),
            Some(at) if known != path => format!("{known} (line {} column {})", at.line(), at.column()),
            _ if known.is_empty() => "config".to_string(),
            _ => known,
        };
        let message = strip_location(&inner.to_string());
        let message = message
            .strip_prefix(&format!("{field}: "))
            .unwrap_or(&message)
            .to_string();
        error(field, message)
    })?;
    raw.check()
}

/// serde_norway appends "at line L column C" to messages; the field path says more.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

fn quota(field: &str, text: &str) -> Result<Quota, ConfigError> {
    text.parse::<Quota>()
        .map_err(|e| error(field, format!("invalid quota {text:?}: {e}")))
}

/// A duration such as `100ms`, `1.5s`, `2min`, `0`.
pub fn duration(field: &str, text: &str) -> Result<Duration, ConfigError> {
    let bad = || {
        error(
            field,
            format!("invalid duration {text:?}: expected e.g. \"100ms\", \"1s\", \"2min\""),
        )
    };
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let unit_secs = match unit.trim() {
        "" if number == 0.0 => 0.0,
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(number * unit_secs).map_err(|_| bad())
}

impl RawConfig {
    fn check(self) -> Result<Settings, ConfigError> {
        let listen = self
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| error("listen", format!("invalid address {:?}: {e}", self.listen)))?;
        let idle_timeout = duration("idle_timeout", &self.idle_timeout)?;
        if idle_timeout.is_zero() {
            return Err(error("idle_timeout", "must be longer than 0"));
        }
        let algorithm = AlgorithmKind::parse(&self.algorithm).ok_or_else(|| {
            error(
                "algorithm",
                format!(
                    "unknown algorithm {:?}: expected one of {ALGORITHMS}",
                    self.algorithm
                ),
            )
        })?;
        let held = |field: &str, quota: Quota| -> Result<Quota, ConfigError> {
            algorithm
                .check(&quota)
                .map(|()| quota)
                .map_err(|e| error(field, format!("{} cannot hold {quota}: {e}", self.algorithm)))
        };
        let failsafe = held("failsafe", quota("failsafe", &self.failsafe)?)?;
        let unknown = held("unknown", quota("unknown", &self.unknown)?)?;
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(error(
                "capacity",
                format!("must be between 1 and {MAX_CAPACITY} keys, not {}", self.capacity),
            ));
        }
        let limiter = LimiterSettings {
            algorithm,
            failsafe,
            unknown,
            fetch_latency: duration("fetch_latency", &self.fetch_latency)?,
            refresh: duration("refresh", &self.refresh)?,
            capacity: self.capacity,
            redis: self.redis.map(|r| r.check(algorithm)).transpose()?,
        };
        if limiter.refresh.is_zero() {
            return Err(error("refresh", "must be longer than 0"));
        }

        let max_key_len = self.key.max_length;
        if max_key_len == 0 || max_key_len > MAX_KEY_LEN {
            return Err(error(
                "key.max_length",
                format!("must be between 1 and {MAX_KEY_LEN}, not {max_key_len}"),
            ));
        }
        if self.key.from.is_empty() {
            return Err(error(
                "key.from",
                "needs at least one part: header:NAME, bearer or ip",
            ));
        }
        let key_parts = (self.key.from.iter().enumerate())
            .map(|(i, part)| {
                part.parse::<KeyPart>()
                    .map_err(|e| error(format!("key.from[{i}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.key.default.is_empty() || self.key.default.len() > max_key_len {
            return Err(error(
                "key.default",
                "must be non-empty and no longer than key.max_length",
            ));
        }
        let too_long = |field: String, key: &str| {
            if key.len() > max_key_len {
                Err(error(
                    field,
                    format!("key longer than key.max_length ({max_key_len})"),
                ))
            } else {
                Ok(())
            }
        };

        let mut accounts = HashMap::with_capacity(self.accounts.len());
        for (name, text) in &self.accounts {
            let field = format!("accounts.{name}");
            too_long(field.clone(), name)?;
            let mut q = quota(&field, text)?;
            let burst = self.burst.filter(|_| !text.contains("burst") && !q.is_deny_all());
            if let Some(burst) = burst {
                q = q
                    .with_capacity(burst)
                    .map_err(|e| error(&field, format!("burst {burst} with {text:?}: {e}")))?;
            }
            accounts.insert(name.clone(), held(&field, q)?);
        }
        for (i, key) in self.bypass.iter().enumerate() {
            too_long(format!("bypass[{i}]"), key)?;
        }
        let trusted_proxies = (self.trusted_proxies.iter().enumerate())
            .map(|(i, net)| {
                net.parse::<IpNet>()
                    .map_err(|e| error(format!("trusted_proxies[{i}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut costs = Vec::with_capacity(self.costs.len());
        for (i, rule) in self.costs.iter().enumerate() {
            if !rule.path.starts_with('/') {
                return Err(error(format!("costs[{i}].path"), "must start with '/'"));
            }
            let method = match &rule.method {
                Some(m) => Some(
                    http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                        .map_err(|_| error(format!("costs[{i}].method"), format!("invalid method {m:?}")))?,
                ),
                None => None,
            };
            costs.push(CostRule::new(rule.path.clone(), method, rule.cost));
        }
        Ok(Settings {
            listen,
            idle_timeout,
            limiter,
            accounts,
            key_parts,
            default_key: self.key.default,
            max_key_len,
            trusted_proxies,
            bypass: self.bypass,
            costs,
            headers: self.headers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_config_is_the_demo() {
        let s = parse(DEFAULT_CONFIG).unwrap();
        assert_eq!(s.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(s.accounts.len(), 9);
        assert_eq!(s.accounts["bob@example.com"], "1.1/s".parse().unwrap());
        assert_eq!(s.accounts["ANONYMOUS"], "0.1/s".parse().unwrap());
        assert_eq!(s.bypass, ["admin@example.com"]);
        assert!(s.limiter.unknown.is_deny_all());
        assert!(!s.limiter.fetch_latency.is_zero());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("accounts:\n  alice: 1/x\n", "accounts.alice"),
            ("acounts: {}\n", "acounts"),
            ("accounts: {a: 1/s\nlisten: x\n", "accounts (line 2 column 7)"),
            ("[1, 2]\n", "line 1 column 1"),
            ("accounts: [1/s]\n", "accounts"),
            ("key:\n  from: [cookie]\n", "key.from[0]"),
            ("key:\n  frm: []\n", "key.frm"),
            ("capacity: lots\n", "capacity"),
            ("capacity: 1000000000000\n", "capacity"),
            ("fetch_latency: soon\n", "fetch_latency"),
            ("trusted_proxies: [10.0.0.0/99]\n", "trusted_proxies[0]"),
            ("costs:\n  - {path: api, cost: 2}\n", "costs[0].path"),
            ("algorithm: magic\n", "algorithm"),
            ("listen: here\n", "listen"),
            ("idle_timeout: 0s\n", "idle_timeout"),
            ("redis:\n  policy: retry\n", "redis.policy"),
            ("redis:\n  url: http://x\n", "redis.url"),
            ("redis:\n  hosts: 0\n", "redis.hosts"),
            ("redis:\n  timeout: 0s\n", "redis.timeout"),
            ("redis:\n  db: 1\n", "redis.db"),
            ("algorithm: leaky_bucket\nredis: {}\n", "redis"),
        ];
        for (text, field) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.field, field, "{text:?} gave {e}");
        }
    }

    #[test]
    fn the_redis_section_and_the_flag() {
        let s = parse(
            "redis:\n  url: redis://127.0.0.1:6390\n  policy: fail_closed\n  hosts: 3\n  timeout: 20ms\n",
        )
        .unwrap();
        let redis = s.limiter.redis.clone().unwrap();
        assert_eq!(redis.url.as_deref(), Some("redis://127.0.0.1:6390"));
        assert_eq!(redis.policy, RedisPolicy::FailClosed);
        assert_eq!((redis.hosts, redis.timeout), (3, Duration::from_millis(20)));
        let s = with_redis_url(s, "redis://10.0.0.1").unwrap();
        assert_eq!(s.limiter.redis.unwrap().url.as_deref(), Some("redis://10.0.0.1"));
        assert!(parse(DEFAULT_CONFIG).unwrap().limiter.redis.is_none());
        let e = with_redis_url(parse("").unwrap(), "localhost:6379").unwrap_err();
        assert_eq!(e.field, "--redis");
    }

    #[test]
    fn a_redis_cluster_by_its_nodes() {
        let s = parse("redis:\n  cluster: [redis://10.0.0.1:7000, redis://10.0.0.2:7000]\n").unwrap();
        let redis = s.limiter.redis.clone().unwrap();
        assert_eq!(redis.cluster, ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
        assert_eq!(redis.url, None);
        // `--redis` names one server, which is then used instead.
        let redis = with_redis_url(s, "redis://10.0.0.3")
            .unwrap()
            .limiter
            .redis
            .unwrap();
        assert_eq!(
            (redis.url.as_deref(), redis.cluster.len()),
            (Some("redis://10.0.0.3"), 0)
        );
        let e = parse("redis:\n  cluster: [redis://10.0.0.1:7000, 10.0.0.2:7000]\n").unwrap_err();
        assert_eq!(e.field, "redis.cluster[1]");
        assert!(e.message.contains("invalid Redis URL \"10.0.0.2:7000\""), "{e}");
        let e = parse("redis:\n  url: redis://10.0.0.1\n  cluster: [redis://10.0.0.2:7000]\n").unwrap_err();
        assert_eq!(e.field, "redis.cluster");
        assert!(e.message.contains("not both"), "{e}");
    }

    #[test]
    fn the_commented_redis_example_is_valid() {
        let start = DEFAULT_CONFIG.find("# redis:").unwrap();
        let example: String = DEFAULT_CONFIG[start..]
            .lines()
            .map(|line| format!("{}\n", line.strip_prefix("# ").unwrap_or(line)))
            .collect();
        let s = parse(&format!("{}{example}", &DEFAULT_CONFIG[..start])).unwrap();
        assert_eq!(
            s.limiter.redis,
            Some(RedisSettings {
                url: Some("redis://127.0.0.1:6379".into()),
                cluster: Vec::new(),
                ..RedisSettings::default()
            })
        );
    }

    #[test]
    fn durations() {
        assert_eq!(duration("f", "100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(duration("f", "1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(duration("f", "0").unwrap(), Duration::ZERO);
        assert!(duration("f", "5").is_err());
        assert!(duration("f", "-1s").is_err());
    }

    #[test]
    fn a_global_burst_applies_to_quotas_without_their_own() {
        let s = parse("burst: 5\naccounts:\n  a: 1/s\n  b: 1/s burst 2\n").unwrap();
        assert_eq!(s.accounts["a"].capacity(), 5);
        assert_eq!(s.accounts["b"].capacity(), 2);
    }
}
