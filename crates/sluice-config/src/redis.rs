//! The `redis:` section and `--redis URL`.

use std::time::Duration;

use sluice::AlgorithmKind;
use sluice_redis::{FailurePolicy, UnsupportedAlgorithm};

use super::raw::RawRedis;
use super::{ConfigError, Settings, duration, error};

/// Limits shared through Redis (the `redis:` section, or `--redis URL`).
///
/// ```
/// use sluice_config::RedisSettings;
/// let file = "redis:\n  url: redis://127.0.0.1:6379\n  hosts: 3\n";
/// let redis = sluice_config::parse(file)?.limiter.redis.unwrap();
/// assert_eq!(redis.url.as_deref(), Some("redis://127.0.0.1:6379"));
/// assert_eq!((redis.hosts, redis.prefix), (3, RedisSettings::default().prefix));
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// Where Redis is (`None` until `--redis` gives it, or when `cluster` does).
    pub url: Option<String>,
    /// The nodes of a Redis Cluster to use instead (any of them leads to the rest; empty: a
    /// single server at `url`).
    pub cluster: Vec<String>,
    /// The answer while Redis does not answer.
    pub policy: FailurePolicy,
    /// How many servers share the limits (the local share is `quota / hosts`).
    pub hosts: u64,
    /// The longest a check waits for Redis.
    pub timeout: Duration,
    /// Failed calls in a row after which Redis counts as unavailable.
    pub degrade_after: u32,
    /// The prefix of every Redis key.
    pub prefix: String,
    /// For `rediss://`: the CA and the client certificate (`redis.tls`), read.
    pub tls: Option<sluice_redis::RedisTls>,
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            url: None,
            cluster: Vec::new(),
            policy: FailurePolicy::default(),
            hosts: 1,
            timeout: sluice_redis::DEFAULT_TIMEOUT,
            degrade_after: sluice_redis::DEFAULT_DEGRADE_AFTER,
            prefix: "sluice".into(),
            tls: None,
        }
    }
}

/// Sets (or overrides) the Redis URL, as `--redis URL` does: that one server is used, even
/// where the config names a cluster. The quotas, checked without Redis' bounds when the file
/// names no Redis, are checked against them now.
///
/// ```
/// let settings = sluice_config::parse("{}")?;
/// let on_redis = sluice_config::with_redis_url(settings.clone(), "redis://10.0.0.1")?;
/// assert_eq!(on_redis.limiter.redis.unwrap().url.as_deref(), Some("redis://10.0.0.1"));
/// let e = sluice_config::with_redis_url(settings, "10.0.0.1:6379").unwrap_err();
/// assert_eq!(e.field, "--redis");
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub fn with_redis_url(mut settings: Settings, url: &str) -> Result<Settings, ConfigError> {
    check_url("--redis", url)?;
    check_algorithm("--redis", settings.limiter.algorithm)?;
    // The file's quotas were checked without Redis' bounds: check them now.
    let algorithm = settings.limiter.algorithm;
    let fits = |field: String, quota: &sluice::Quota| {
        sluice_redis::check_quota(algorithm, quota).map_err(|e| error(format!("{field} (with --redis)"), e))
    };
    fits("failsafe".into(), &settings.limiter.failsafe)?;
    fits("unknown".into(), &settings.limiter.unknown)?;
    for (name, quota) in &settings.accounts {
        fits(format!("accounts.{name}"), quota)?;
    }
    if let Some(super::ServiceSettings {
        rules: super::RulesFrom::Files { loaded, .. },
        ..
    }) = &settings.service
    {
        super::check_service::rules_fit_redis(&loaded.0, algorithm)
            .map_err(|e| error("rules (with --redis)", e))?;
    }
    let redis = settings.limiter.redis.get_or_insert_with(RedisSettings::default);
    redis.url = Some(url.to_string());
    redis.cluster.clear();
    Ok(settings)
}

fn check_url(field: &str, url: &str) -> Result<(), ConfigError> {
    let schemes = ["redis://", "rediss://", "unix://", "redis+unix://"];
    if schemes.iter().any(|scheme| url.starts_with(scheme)) {
        Ok(())
    } else {
        Err(error(
            field,
            format!(
                "invalid Redis URL {url:?}: expected redis://HOST[:PORT][/DB], rediss:// (TLS) or unix://PATH"
            ),
        ))
    }
}

fn check_algorithm(field: &str, algorithm: AlgorithmKind) -> Result<(), ConfigError> {
    UnsupportedAlgorithm::check(algorithm).map_err(|e| error(field, e))
}

impl RawRedis {
    /// The section checked, for a limiter running `algorithm`.
    pub(super) fn check(
        self,
        algorithm: AlgorithmKind,
        dir: Option<&std::path::Path>,
    ) -> Result<RedisSettings, ConfigError> {
        if let Some(url) = &self.url {
            check_url("redis.url", url)?;
        }
        for (i, url) in self.cluster.iter().enumerate() {
            check_url(&format!("redis.cluster[{i}]"), url)?;
        }
        if self.url.is_some() && !self.cluster.is_empty() {
            return Err(error(
                "redis.cluster",
                "give either redis.url (one server) or redis.cluster (a cluster's nodes), not both",
            ));
        }
        check_algorithm("redis", algorithm)?;
        let defaults = RedisSettings::default();
        let policy = match &self.policy {
            Some(name) => name.parse().map_err(|e| error("redis.policy", e))?,
            None => defaults.policy,
        };
        let hosts = self.hosts.unwrap_or(defaults.hosts);
        if hosts == 0 {
            return Err(error("redis.hosts", "must be at least 1"));
        }
        let timeout = match &self.timeout {
            Some(text) => duration("redis.timeout", text)?,
            None => defaults.timeout,
        };
        if timeout.is_zero() {
            return Err(error("redis.timeout", "must be longer than 0"));
        }
        let degrade_after = self.degrade_after.unwrap_or(defaults.degrade_after);
        if degrade_after == 0 {
            return Err(error(
                "redis.degrade_after",
                "must be at least 1 (failed calls in a row)",
            ));
        }
        let prefix = self.prefix.unwrap_or(defaults.prefix);
        if prefix.is_empty() {
            return Err(error("redis.prefix", "must not be empty"));
        }
        let tls = (self.tls.as_ref())
            .map(|raw| super::check_service::tls_files("redis.tls", raw, dir))
            .transpose()?;
        Ok(RedisSettings {
            url: self.url,
            cluster: self.cluster,
            policy,
            hosts,
            timeout,
            degrade_after,
            prefix,
            tls,
        })
    }
}
