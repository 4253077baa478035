//! # sluice-config: the YAML config of `sluice serve`
//!
//! The file read, checked field by field, and turned into [`Settings`]: what `sluice serve`
//! runs and `sluice validate` checks, and what the property tests and the fuzz targets
//! (`crates/sluice-invariants`, `fuzz/`) feed arbitrary bytes to, so all of them parse a
//! config exactly alike. A refused file names the field at fault ([`ConfigError`]), on one
//! line whatever the file holds.
//!
//! (Over 600 lines only with its unit tests, one per setting's default and bound, kept beside
//! the settings they check: the code itself is under 600.)
//!
//! `raw` holds the file as written, `check` turns it into settings with the libraries' own
//! parsers and builders, `redis` reads the `redis:` section and `--redis`, `upstream` the
//! reverse proxy's `upstream:`. Nothing here serves, connects or spawns: the settings are
//! plain data (the rules service's client is built, not used), and the binary turns them into
//! limiters, engines, listeners and the proxy.
//!
//! ```
//! let settings = sluice_config::parse("key:\n  from: [ip]\nipv6_prefix: 56\n")?;
//! assert_eq!(settings.ipv6_prefix, 56);
//! let refused = sluice_config::parse("ipv6_prefix: 0\n").unwrap_err();
//! assert_eq!(refused.field, "ipv6_prefix");
//! # Ok::<(), sluice_config::ConfigError>(())
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod check;
mod check_service;
mod env;
mod otlp;
mod raw;
mod redis;
mod service;
mod upstream;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use sluice::{AlgorithmKind, Quota};
use sluice_http::{ClientIpHeader, CostRule, IpNet, KeyPart};

pub use env::{ENV_KEYS, FromEnv, env_name};
pub use otlp::OtlpSettings;
pub use redis::{RedisSettings, with_redis_url};
pub use service::{
    Answers, DEFAULT_RULES_POLL, DEFAULT_RULES_SNAPSHOT, LoadedRules, RULES_TOKEN_ENV, RulesFrom,
    RulesService, ServiceSettings, TlsSettings,
};
/// `counting:` and `rls.headers:`, as the engine takes them.
pub use sluice_descriptors::Counting;
pub use sluice_http::FieldSet;
pub use upstream::{
    DEFAULT_UPSTREAM_CONNECT_TIMEOUT, DEFAULT_UPSTREAM_HEAD_TIMEOUT, DEFAULT_UPSTREAM_IDLE_TIMEOUT,
    DEFAULT_UPSTREAM_MAX_IDLE, HostHeader, UpstreamRoute, UpstreamSettings, UpstreamUrl, UpstreamUrlError,
};

use raw::RawConfig;

/// The built-in demo (the accounts alice@example.com to eve@example.com, admin@example.com
/// never limited), used when no `--config` is given.
///
/// ```
/// let demo = sluice_config::parse(sluice_config::DEFAULT_CONFIG)?;
/// assert_eq!(demo.bypass, ["admin@example.com"]);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub const DEFAULT_CONFIG: &str = include_str!("default.yaml");

/// A config that cannot be used, naming the field at fault. It prints as one line
/// (`field: message`), control characters escaped, whatever the file holds.
///
/// ```
/// let e = sluice_config::parse("accounts:\n  alice: 1/x\n").unwrap_err();
/// assert_eq!(e.field, "accounts.alice");
/// assert!(e.to_string().starts_with("accounts.alice: invalid quota"));
/// ```
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
        field: one_line(field.into()),
        message: one_line(message.to_string()),
    }
}

/// `text` with control characters escaped (`\n`), so an error stays one line whatever the
/// file's keys hold: a key may contain line breaks, and is echoed in the field path.
fn one_line(text: String) -> String {
    if !text.contains(char::is_control) {
        return text;
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// What shapes the keyed limiter itself; a change to any of these needs a new limiter.
///
/// ```
/// let limiter = sluice_config::parse("algorithm: fixed_window\ncapacity: 5\n")?.limiter;
/// assert_eq!(limiter.algorithm, sluice::AlgorithmKind::FixedWindow);
/// assert_eq!((limiter.capacity, limiter.redis), (5, None));
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimiterSettings {
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// The quota of a key while its own is being fetched.
    pub failsafe: Quota,
    /// One limit shared by everything admitted under the failsafe quota and by keys the
    /// store cannot hold (a token bucket; none when not given).
    pub failsafe_pool: Option<Quota>,
    /// The quota of keys not in `accounts`.
    pub unknown: Quota,
    /// Simulated latency of the quota fetch.
    pub fetch_latency: Duration,
    /// How long a quota fetch may run before it counts as failed.
    pub fetch_timeout: Duration,
    /// How often a key's quota is fetched again.
    pub refresh: Duration,
    /// The most keys held at once.
    pub capacity: usize,
    /// Limits shared through Redis instead of held in memory.
    pub redis: Option<RedisSettings>,
    /// The quota service asked for each key not in `accounts` (`http://.../{key}`), checked.
    pub accounts_url: Option<String>,
    /// Denials logged a second at most (0: none).
    pub denied_log: u32,
    /// Decisions counted per rule and timed (for the admin listener's metrics).
    pub observe: bool,
}

/// Denials logged a second at most when `denied_log` is left out.
///
/// ```
/// let limiter = sluice_config::parse("{}")?.limiter;
/// assert_eq!(limiter.denied_log, sluice_config::DEFAULT_DENIED_LOG);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub const DEFAULT_DENIED_LOG: u32 = 5;

impl LimiterSettings {
    /// The settings that differ in `other`, by their config names (for the reload's log).
    ///
    /// ```
    /// let before = sluice_config::parse("{}")?.limiter;
    /// let after = sluice_config::parse("capacity: 5\nfailsafe: 1/s\n")?.limiter;
    /// assert_eq!(before.changed(&after), ["failsafe", "capacity"]);
    /// # Ok::<(), sluice_config::ConfigError>(())
    /// ```
    pub fn changed(&self, other: &Self) -> Vec<&'static str> {
        // Every field named, so a new one cannot be left out of the log.
        let Self {
            algorithm,
            failsafe,
            failsafe_pool,
            unknown,
            fetch_latency,
            fetch_timeout,
            refresh,
            capacity,
            redis,
            accounts_url,
            denied_log,
            observe,
        } = self;
        let mut changed = Vec::new();
        let mut differs = |name, yes| {
            if yes {
                changed.push(name);
            }
        };
        differs("algorithm", *algorithm != other.algorithm);
        differs("failsafe", *failsafe != other.failsafe);
        differs("failsafe_pool", *failsafe_pool != other.failsafe_pool);
        differs("unknown", *unknown != other.unknown);
        differs("fetch_latency", *fetch_latency != other.fetch_latency);
        differs("fetch_timeout", *fetch_timeout != other.fetch_timeout);
        differs("refresh", *refresh != other.refresh);
        differs("capacity", *capacity != other.capacity);
        differs("redis", *redis != other.redis);
        differs("accounts_url", *accounts_url != other.accounts_url);
        differs("denied_log", *denied_log != other.denied_log);
        differs("admin", *observe != other.observe);
        changed
    }
}

/// A checked config: every field within its bounds, and accepted by the library that will
/// use it (the layer's builder for the key, `sluice_redis` for quotas on Redis).
///
/// ```
/// let s = sluice_config::parse("listen: 0.0.0.0:9000\naccounts:\n  alice: 5/s\n")?;
/// assert_eq!(s.listen.port(), 9000);
/// assert_eq!(s.accounts["alice"], "5/s".parse().unwrap());
/// assert!(s.service.is_none() && s.admin.is_none());
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// How long a connection may go without starting a request.
    pub idle_timeout: Duration,
    /// After SIGTERM, how long the listeners keep accepting while `/readyz` and gRPC health
    /// say the process is stopping (0: stop accepting at once).
    pub drain_delay: Duration,
    /// Then, how long in-flight requests and waiters have to finish before the process exits.
    pub shutdown_timeout: Duration,
    /// The most connections served at once (`None`: the binary derives it from the
    /// file-descriptor limit).
    pub max_connections: Option<usize>,
    /// The largest request head (request line and headers) in bytes; larger ones are
    /// answered 431 and the connection closed.
    pub max_header_bytes: usize,
    /// The most headers in a request; more are answered 431.
    pub max_headers: usize,
    /// The limiter's shape.
    pub limiter: LimiterSettings,
    /// Quotas by key.
    pub accounts: HashMap<String, Quota>,
    /// The quotas after the first of each account given several (`alice: [1/s, 100/day]`),
    /// every one enforced, all or nothing. (`burst` shapes an account's first quota only.)
    ///
    /// ```
    /// let s = sluice_config::parse("accounts:\n  alice: [10/s, 1000/day]\n  bob: {quota: [1/s, 5/min], on_excess: wait}\n")?;
    /// assert_eq!(s.accounts["alice"], "10/s".parse()?);
    /// assert_eq!(s.accounts_stacked["alice"], ["1000/day".parse()?]);
    /// assert_eq!(s.accounts_stacked["bob"], ["5/min".parse()?]);
    /// let e = sluice_config::parse("accounts:\n  carol: [1/s, often]\n").unwrap_err();
    /// assert_eq!(e.field, "accounts.carol[1]");
    /// assert_eq!(sluice_config::parse("accounts:\n  dave: []\n").unwrap_err().field, "accounts.dave");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub accounts_stacked: HashMap<String, Vec<Quota>>,
    /// What a key is made of.
    pub key_parts: Vec<KeyPart>,
    /// The key of a request that does not say who it is.
    pub default_key: String,
    /// The longest key accepted.
    pub max_key_len: usize,
    /// Proxies whose client IP header is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// The one header those proxies report the client's address in.
    pub client_ip_header: ClientIpHeader,
    /// IPv6 clients are keyed by their network of this many bits.
    pub ipv6_prefix: u8,
    /// Keys never limited.
    pub bypass: Vec<String>,
    /// Costs by route and method.
    pub costs: Vec<CostRule>,
    /// Whether admitted responses carry the rate-limit fields.
    pub headers: bool,
    /// The response header whose cost is charged after each admitted response, if any
    /// (`charge_from: {header, max, strip}`).
    ///
    /// ```
    /// let s = sluice_config::parse("charge_from: {header: x-usage, max: 5000, strip: true}\n")?;
    /// assert_eq!(s.charge_from.unwrap().header().as_str(), "x-usage");
    /// let e = sluice_config::parse("charge_from: {header: 'x usage', max: 5}\n").unwrap_err();
    /// assert_eq!(e.field, "charge_from.header");
    /// assert_eq!(sluice_config::parse("charge_from: {header: x-usage, max: 0}\n").unwrap_err().field, "charge_from.max");
    /// let on_redis = "charge_from: {header: x-usage, max: 5}\nalgorithm: fixed_window\nredis: {url: redis://127.0.0.1:1}\n";
    /// assert_eq!(sluice_config::parse(on_redis).unwrap_err().field, "charge_from");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub charge_from: Option<sluice_http::ChargeFrom>,
    /// Where admitted requests are forwarded (`upstream:`), if anywhere; `None`: `sluice serve`
    /// answers them itself (the demo answer).
    ///
    /// ```
    /// use std::time::Duration;
    /// let s = sluice_config::parse("upstream: http://127.0.0.1:3000\n")?;
    /// let upstream = s.upstream.unwrap();
    /// assert_eq!(upstream.default.unwrap().authority, "127.0.0.1:3000");
    /// assert_eq!(upstream.head_timeout, Duration::from_secs(60));
    /// let file = "upstream:\n  routes:\n    - {prefix: /api/, url: 'http://127.0.0.1:3001'}\n  connect_timeout: 2s\n";
    /// let upstream = sluice_config::parse(file)?.upstream.unwrap();
    /// assert_eq!((upstream.default, upstream.routes[0].prefix.as_str()), (None, "/api/"));
    /// assert_eq!(upstream.connect_timeout, Duration::from_secs(2));
    /// let e = sluice_config::parse("upstream: {routes: [{prefix: /api/, url: 'http://a/app'}]}\n").unwrap_err();
    /// assert_eq!(e.field, "upstream.routes[0].url");
    /// assert!(e.message.contains("a path prefix on the upstream is not supported"), "{e}");
    /// assert_eq!(sluice_config::parse("upstream: {url: 'http://a', max_idle: -1}\n").unwrap_err().field, "upstream.max_idle");
    /// assert!(sluice_config::parse(sluice_config::DEFAULT_CONFIG)?.upstream.is_none());
    /// # Ok::<(), sluice_config::ConfigError>(())
    /// ```
    pub upstream: Option<UpstreamSettings>,
    /// Whether requests over their quota wait.
    pub excess: ExcessSettings,
    /// The rate-limit service, if rules are configured.
    pub service: Option<ServiceSettings>,
    /// Where the admin listener (metrics, health, top keys, console) listens, if anywhere.
    pub admin: Option<SocketAddr>,
    /// TLS on the admin listener (`admin.tls`).
    pub admin_tls: Option<TlsSettings>,
    /// TLS on `listen` (`tls`).
    pub tls: Option<TlsSettings>,
    /// How sluice's own clients (the rules service's `rules.url`, `accounts_url`, an
    /// `https://` upstream) speak TLS to an `https://` service (`client_tls`); Mozilla's roots
    /// and no client certificate if left out.
    pub client_tls: Option<sluice_rules_client::ClientTls>,
    /// Traces exported over OTLP (`otlp`, or `OTEL_EXPORTER_OTLP_ENDPOINT`), if anywhere.
    pub otlp: Option<OtlpSettings>,
    /// What `/metrics` labels its series with (`metrics`).
    pub metrics: MetricsSettings,
}

/// How `/metrics` counts decisions: per rule (a series per rule and outcome, and per value of
/// a `detailed_metric` rule), or with `per_rule: false` per domain, for rule sets so large that
/// a series per rule costs the metrics store more than it tells.
///
/// ```
/// let s = sluice_config::parse("metrics: {per_rule: false}\n")?;
/// assert!(!s.metrics.per_rule);
/// assert!(sluice_config::parse("{}\n")?.metrics.per_rule);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSettings {
    /// A series per rule (true), or per domain.
    pub per_rule: bool,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self { per_rule: true }
    }
}

/// How requests over their quota are treated: refused at once, or queued for capacity.
///
/// ```
/// use sluice::WaitPolicy;
/// let s = sluice_config::parse("accounts:\n  a: {quota: 1/s, on_excess: wait}\n")?;
/// assert_eq!(s.excess.default, WaitPolicy::reject());
/// assert!(s.excess.by_account["a"] != WaitPolicy::reject());
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExcessSettings {
    /// The server's policy (`on_excess`, `max_wait`, `queue_limit`, `queue_order`).
    pub default: sluice::WaitPolicy,
    /// Accounts that say otherwise.
    pub by_account: HashMap<String, sluice::WaitPolicy>,
    /// Requests waiting in the whole server; read at start.
    pub max_waiters: usize,
}

/// `max_wait` when left out.
///
/// ```
/// use sluice::WaitPolicy;
/// let s = sluice_config::parse("on_excess: wait\n")?;
/// let policy = WaitPolicy::wait_up_to(sluice_config::DEFAULT_MAX_WAIT)
///     .with_queue_limit(sluice_config::DEFAULT_QUEUE_LIMIT);
/// assert_eq!(s.excess.default, policy);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(2);

/// `queue_limit` when left out, in units of cost.
///
/// ```
/// use sluice::WaitPolicy;
/// let s = sluice_config::parse("on_excess: wait\nmax_wait: 1s\n")?;
/// let policy = WaitPolicy::wait_up_to(std::time::Duration::from_secs(1))
///     .with_queue_limit(sluice_config::DEFAULT_QUEUE_LIMIT);
/// assert_eq!(s.excess.default, policy);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub const DEFAULT_QUEUE_LIMIT: u64 = 100;

/// Reads and checks a config file; relative paths in it (`rules`) are read from its
/// directory.
///
/// ```
/// let path = std::env::temp_dir().join(format!("sluice-config-load-{}.yaml", std::process::id()));
/// std::fs::write(&path, "accounts:\n  alice: 5/s\n").unwrap();
/// let settings = sluice_config::load(&path);
/// std::fs::remove_file(&path).unwrap();
/// assert_eq!(settings?.accounts.len(), 1);
/// let missing = sluice_config::load(std::path::Path::new("/nonexistent/sluice.yaml")).unwrap_err();
/// assert_eq!(missing.field, "file");
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub fn load(path: &Path) -> Result<Settings, ConfigError> {
    load_with_bytes(path).map(|(settings, _)| settings)
}

/// Reads and checks a config file, returning the bytes read too (what a reload compares with).
///
/// ```
/// let path = std::env::temp_dir().join(format!("sluice-config-bytes-{}.yaml", std::process::id()));
/// std::fs::write(&path, "{}\n").unwrap();
/// let loaded = sluice_config::load_with_bytes(&path);
/// std::fs::remove_file(&path).unwrap();
/// let (settings, bytes) = loaded?;
/// assert_eq!((settings.accounts.len(), bytes.as_slice()), (0, b"{}\n".as_slice()));
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub fn load_with_bytes(path: &Path) -> Result<(Settings, Vec<u8>), ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| error("file", e))?;
    let text = std::str::from_utf8(&bytes).map_err(|_| error("file", "not UTF-8 text"))?;
    let settings = parse_in(text, path.parent())?;
    Ok((settings, bytes))
}

/// Checks config bytes, which must be UTF-8 text.
///
/// ```
/// assert!(sluice_config::parse_bytes(b"{}").is_ok());
/// assert_eq!(sluice_config::parse_bytes(b"\xff").unwrap_err().field, "file");
/// ```
pub fn parse_bytes(bytes: &[u8]) -> Result<Settings, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|_| error("file", "not UTF-8 text"))?;
    parse(text)
}

/// Checks config text. A file with no settings at all (empty, or only blanks and comments)
/// is refused: it is far more likely a file caught while being written, or truncated, than a
/// wish for every default (`{}` says that).
///
/// # Example
/// ```
/// let e = sluice_config::parse("ipv6_prefix: 0\n").unwrap_err();
/// assert_eq!(e.field, "ipv6_prefix");
/// ```
pub fn parse(text: &str) -> Result<Settings, ConfigError> {
    parse_in(text, None)
}

/// Checks config text whose relative paths (`rules`) are read from `dir` (the config file's
/// directory; the working directory if `None`).
///
/// ```
/// let e = sluice_config::parse_in("rules: limits.yaml\n", Some(std::path::Path::new("/nonexistent"))).unwrap_err();
/// assert_eq!(e.field, "rules");
/// assert!(e.message.contains("/nonexistent/limits.yaml"), "{e}");
/// ```
pub fn parse_in(text: &str, dir: Option<&Path>) -> Result<Settings, ConfigError> {
    parse_with_env(text, dir, &|name| std::env::var(name).ok()).map(|(settings, _)| settings)
}

/// [`parse_in`], with the settings `lookup` gives as the environment ([`ENV_KEYS`]) laid over
/// the file's; also says which came from there.
///
/// ```
/// let env = |name: &str| (name == "SLUICE_REDIS_URL").then(|| "redis://10.0.0.7:6379".to_string());
/// let (settings, from_env) = sluice_config::parse_with_env("{}", None, &env)?;
/// assert_eq!(settings.limiter.redis.unwrap().url.as_deref(), Some("redis://10.0.0.7:6379"));
/// assert_eq!(from_env[0].variable, "SLUICE_REDIS_URL");
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub fn parse_with_env(
    text: &str,
    dir: Option<&Path>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(Settings, Vec<FromEnv>), ConfigError> {
    if is_empty_document(text) {
        return Err(error(
            "file",
            "empty (no settings; write `{}` for every default). Was it caught mid-write? \
             Write config files whole: to a temporary name, then rename",
        ));
    }
    let given = env::read(lookup)?;
    let raw: RawConfig = if given.is_empty() {
        serde_path_to_error::deserialize(serde_norway::Deserializer::from_str(text)).map_err(field_error)?
    } else {
        let file: serde_norway::Value = serde_norway::from_str(text).map_err(|e| {
            let field = match e.location() {
                Some(at) => format!("line {} column {}", at.line(), at.column()),
                None => "config".to_string(),
            };
            error(field, strip_location(&e.to_string()))
        })?;
        let merged = env::overlay(file, &given);
        serde_path_to_error::deserialize(merged).map_err(|e| blame(field_error(e), &given))?
    };
    let settings = raw.check(dir).map_err(|e| blame(e, &given))?;
    Ok((settings, given.into_iter().map(|(from, _)| from).collect()))
}

/// `e`, saying which variable gave the value at fault if the environment did (the one that
/// set the field most closely: `SLUICE_UPSTREAM_ROUTES` rather than `SLUICE_UPSTREAM` for
/// `upstream.routes[0].url`).
fn blame(mut e: ConfigError, given: &[(FromEnv, serde_norway::Value)]) -> ConfigError {
    let within = |path: &str| {
        e.field == path || (e.field.strip_prefix(path)).is_some_and(|rest| rest.starts_with(['.', '[']))
    };
    let from = (given.iter())
        .filter(|(from, _)| within(from.path))
        .max_by_key(|(from, _)| from.path.len());
    if let Some((from, _)) = from {
        e.message = format!("{} (from {})", e.message, from.variable);
    }
    e
}

/// A serde error as the field at fault and what is wrong with it.
fn field_error(e: serde_path_to_error::Error<serde_norway::Error>) -> ConfigError {
    {
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
        // The parser may name the field, or a section holding it, again: once is enough.
        let message = (field.match_indices('.').map(|(i, _)| &field[..i]))
            .chain([field.as_str()])
            .find_map(|named| message.strip_prefix(&format!("{named}: ")))
            .unwrap_or(&message)
            .to_string();
        error(field, message)
    }
}

/// Whether `text` is a YAML document with nothing in it (as YAML reads it: blanks, comments,
/// document markers). Text that is not YAML is left to the real parse, which says where.
fn is_empty_document(text: &str) -> bool {
    matches!(
        serde_norway::from_str::<serde_norway::Value>(text),
        Ok(serde_norway::Value::Null)
    )
}

/// serde_norway appends "at line L column C" to messages; the field path says more.
fn strip_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// A duration such as `100ms`, `1.5s`, `2min`, `0` ([`sluice::parse_duration`]).
fn duration(field: &str, text: &str) -> Result<Duration, ConfigError> {
    sluice::parse_duration(text).map_err(|e| error(field, e))
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
        assert_eq!(s.limiter.failsafe_pool, Some("20/s".parse().unwrap()));
        assert_eq!(s.limiter.fetch_timeout, Duration::from_secs(5));
    }

    #[test]
    fn the_pool_and_the_fetch_timeout_are_optional_and_checked() {
        let s = parse("{}").unwrap();
        assert_eq!(s.limiter.failsafe_pool, None);
        assert_eq!(s.limiter.fetch_timeout, sluice::DEFAULT_FETCH_TIMEOUT);
        let s =
            parse("algorithm: fixed_window\nfailsafe_pool: 5/min burst 2\nfetch_timeout: 250ms\n").unwrap();
        assert_eq!(s.limiter.failsafe_pool, Some("5/min burst 2".parse().unwrap()));
        assert_eq!(s.limiter.fetch_timeout, Duration::from_millis(250));
        let e = parse("failsafe_pool: 18446744073709551615/ns burst 1\n").unwrap_err();
        assert_eq!(e.field, "failsafe_pool");
        assert!(e.message.contains("token_bucket cannot hold"), "{e}");
        assert!(e.message.contains("2^40 ns"), "the limit: {e}");
        let e = parse("refresh: 110000day\n").unwrap_err();
        assert_eq!(e.field, "refresh");
        assert!(e.message.contains("at most 2^63 − 1 ns"), "{e}");
    }

    #[test]
    fn excess_requests_wait_by_the_servers_policy_unless_an_account_says_otherwise() {
        use sluice::{QueueOrder, WaitPolicy};
        let s = parse("{}").unwrap();
        assert_eq!(s.excess.default, WaitPolicy::reject());
        assert_eq!(s.excess.max_waiters, sluice_http::DEFAULT_MAX_WAITERS);
        let s = parse(
            "on_excess: wait\nmax_wait: 500ms\nqueue_order: newest_first\nmax_waiters: 7\naccounts:\n  \
             a: 1/s\n  b: {quota: 2/s, queue_limit: 3}\n  c: {quota: 3/s, on_excess: reject}\n",
        )
        .unwrap();
        let server = WaitPolicy::wait_up_to(Duration::from_millis(500))
            .with_queue_limit(DEFAULT_QUEUE_LIMIT)
            .with_queue_order(QueueOrder::NewestFirst);
        assert_eq!(s.excess.default, server);
        assert_eq!(s.excess.max_waiters, 7);
        assert_eq!(s.excess.by_account.len(), 2, "a waits as the server does");
        assert_eq!(s.excess.by_account["b"], server.with_queue_limit(3));
        assert_eq!(s.excess.by_account["c"], WaitPolicy::reject());
        assert_eq!(s.accounts["b"], "2/s".parse().unwrap());
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("accounts:\n  alice: 1/x\n", "accounts.alice"),
            ("acounts: {}\n", "acounts"),
            ("accounts: {a: 1/s\nlisten: x\n", "accounts (line 2 column 7)"),
            ("[1, 2]\n", "line 1 column 1"),
            ("accounts: [1/s]\n", "accounts"),
            ("accounts:\n  \"\": 1/s\n", "accounts"),
            ("key:\n  from: [cookie]\n", "key.from[0]"),
            ("key:\n  frm: []\n", "key.frm"),
            ("capacity: lots\n", "capacity"),
            ("capacity: 1000000000000\n", "capacity"),
            ("fetch_latency: soon\n", "fetch_latency"),
            ("fetch_timeout: 0s\n", "fetch_timeout"),
            ("failsafe_pool: lots\n", "failsafe_pool"),
            ("refresh: 110000day\n", "refresh"),
            ("trusted_proxies: [10.0.0.0/99]\n", "trusted_proxies[0]"),
            ("client_ip_header: via\n", "client_ip_header"),
            ("ipv6_prefix: 0\n", "ipv6_prefix"),
            ("ipv6_prefix: 129\n", "ipv6_prefix"),
            ("ipv6_prefix: 300\n", "ipv6_prefix"),
            ("ipv6_prefix: -1\n", "ipv6_prefix"),
            ("ipv6_prefix: wide\n", "ipv6_prefix"),
            ("on_excess: queue\n", "on_excess"),
            ("max_wait: 0s\n", "max_wait"),
            ("max_wait: 2h\n", "max_wait"),
            ("queue_limit: 0\n", "queue_limit"),
            ("queue_order: fifo\n", "queue_order"),
            ("max_waiters: 0\n", "max_waiters"),
            (
                "accounts:\n  a: {quota: 1/s, max_wait: soon}\n",
                "accounts.a.max_wait",
            ),
            (
                "accounts:\n  a: {quota: 1/x, on_excess: wait}\n",
                "accounts.a.quota",
            ),
            (
                "accounts:\n  a: {quota: 1/s, on_exces: wait}\n",
                "accounts.a.on_exces",
            ),
            ("costs:\n  - {path: /a%2Fb, cost: 2}\n", "costs[0].path"),
            ("costs:\n  - {path: /a%zz, cost: 2}\n", "costs[0].path"),
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
    fn errors_are_one_line_whatever_the_keys_hold() {
        // Found by the config fuzz target: a flow mapping's key with line breaks in it.
        let e = parse("costs:\n  - {p\r\r\rath: /a, cost: 1}\n").unwrap_err();
        assert!(e.field.starts_with("costs[0].p\\n"), "{e}");
        assert!(!e.to_string().contains(['\n', '\r']), "{e}");
        let e = parse("accounts:\n  \"a\\nb\\u0000\": 1/x\n").unwrap_err();
        assert_eq!(e.field, "accounts.a\\nb\\u{0}");
        assert!(!e.to_string().contains(['\n', '\0']), "{e}");
    }

    #[test]
    fn the_redis_section_and_the_flag() {
        let s = parse(
            "redis:\n  url: redis://127.0.0.1:6390\n  policy: fail_closed\n  hosts: 3\n  timeout: 20ms\n",
        )
        .unwrap();
        let redis = s.limiter.redis.clone().unwrap();
        assert_eq!(redis.url.as_deref(), Some("redis://127.0.0.1:6390"));
        assert_eq!(redis.policy, sluice_redis::FailurePolicy::FailClosed);
        assert_eq!((redis.hosts, redis.timeout), (3, Duration::from_millis(20)));
        let s = with_redis_url(s, "redis://10.0.0.1").unwrap();
        assert_eq!(s.limiter.redis.unwrap().url.as_deref(), Some("redis://10.0.0.1"));
        assert!(parse(DEFAULT_CONFIG).unwrap().limiter.redis.is_none());
        let e = with_redis_url(parse("{}").unwrap(), "localhost:6379").unwrap_err();
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
    fn quotas_beyond_the_redis_scripts_bounds_are_refused_up_front() {
        let file = "algorithm: fixed_window\naccounts:\n  big: 100000/day\n";
        // In memory the quota is fine; on Redis its window × capacity passes 2^50 µs.
        let settings = parse(file).unwrap();
        let err = with_redis_url(settings, "redis://127.0.0.1:6379").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("accounts.big (with --redis): quota 100000/day"),
            "{err}"
        );
        let err = parse(&format!("{file}redis:\n  url: redis://127.0.0.1:6379\n")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("accounts.big: quota 100000/day is too large"),
            "{err}"
        );
        // The token bucket's script holds it.
        let file = file.replace("fixed_window", "token_bucket");
        assert!(parse(&format!("{file}redis:\n  url: redis://127.0.0.1:6379\n")).is_ok());
    }

    #[test]
    fn redis_degrade_after_is_at_least_one() {
        let base = "redis:\n  url: redis://127.0.0.1:6379\n";
        assert_eq!(
            parse(&format!("{base}  degrade_after: 5\n"))
                .unwrap()
                .limiter
                .redis
                .unwrap()
                .degrade_after,
            5
        );
        let err = parse(&format!("{base}  degrade_after: 0\n")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("redis.degrade_after: must be at least 1"),
            "{err}"
        );
    }

    #[test]
    fn client_identity_settings() {
        let s = parse("{}").unwrap();
        assert_eq!(s.client_ip_header, ClientIpHeader::XForwardedFor);
        assert_eq!(s.ipv6_prefix, sluice_http::DEFAULT_IPV6_PREFIX);
        let demo = parse(DEFAULT_CONFIG).unwrap();
        assert_eq!(
            (demo.client_ip_header, demo.ipv6_prefix),
            (ClientIpHeader::XForwardedFor, 64)
        );
        let s = parse("client_ip_header: Forwarded\nipv6_prefix: 128\n").unwrap();
        assert_eq!(
            (s.client_ip_header, s.ipv6_prefix),
            (ClientIpHeader::Forwarded, 128)
        );
        let s = parse("client_ip_header: x-real-ip\nipv6_prefix: 1\n").unwrap();
        assert_eq!((s.client_ip_header, s.ipv6_prefix), (ClientIpHeader::XRealIp, 1));
        let e = parse("ipv6_prefix: 300\n").unwrap_err();
        assert!(e.message.contains("between 1 and 128"), "{e}");
        let e = parse("client_ip_header: x-client-ip\n").unwrap_err();
        assert!(
            e.message.contains("x-forwarded-for, forwarded or x-real-ip"),
            "{e}"
        );
        let e = parse("costs:\n  - {path: /a%2Fb, cost: 2}\n").unwrap_err();
        assert!(e.message.contains("cannot be normalised"), "{e}");
    }

    #[test]
    fn a_file_without_settings_is_refused_and_braces_take_every_default() {
        for text in [
            "",
            "\n  \n",
            "# only a comment\n\n# another\n",
            "---\n",
            "---\n...\n",
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.field, "file", "{text:?}");
            assert!(e.message.starts_with("empty"), "{text:?}: {e}");
        }
        let s = parse("{}").unwrap();
        assert_eq!(s.listen, "127.0.0.1:8080".parse().unwrap());
        assert!(s.accounts.is_empty());
    }

    #[test]
    fn server_bounds_have_defaults_and_refuse_nonsense() {
        let s = parse("{}").unwrap();
        assert_eq!(s.max_connections, None);
        assert_eq!(s.max_header_bytes, 32 * 1024);
        assert_eq!(s.max_headers, 100);
        let s = parse("max_connections: 2\nmax_header_bytes: 8192\nmax_headers: 20\n").unwrap();
        assert_eq!(
            (s.max_connections, s.max_header_bytes, s.max_headers),
            (Some(2), 8192, 20)
        );
        for (text, field) in [
            ("max_connections: 0\n", "max_connections"),
            ("max_connections: -1\n", "max_connections"),
            ("max_connections: 100000000000\n", "max_connections"),
            ("max_header_bytes: 100\n", "max_header_bytes"),
            ("max_header_bytes: 100000000\n", "max_header_bytes"),
            ("max_headers: 0\n", "max_headers"),
            ("max_headers: 1000000\n", "max_headers"),
        ] {
            assert_eq!(parse(text).unwrap_err().field, field, "{text:?}");
        }
    }

    #[test]
    fn limiter_changes_are_named() {
        let a = parse("{}").unwrap().limiter;
        let b = parse("capacity: 5\nfailsafe: 1/s\n").unwrap().limiter;
        assert_eq!(a.changed(&b), ["failsafe", "capacity"]);
        assert!(a.changed(&a).is_empty());
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
