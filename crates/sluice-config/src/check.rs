//! From the file as written to [`Settings`]: each field read with the library's own parser
//! or builder, whose typed error is given the field's path.

use std::collections::HashMap;
use std::net::SocketAddr;

use sluice::{AlgorithmKind, KeyedLimiter, QueueOrder, Quota, TokenBucket, WaitPolicy};
use sluice_http::{
    ClientIpHeader, CostRule, IpNet, KeyPart, LayerBuildError, RateLimitLayer, normalize_path,
};

use super::raw::{RawChargeFrom, RawConfig, RawCost, RawKey, RawWait};
use super::{
    ConfigError, DEFAULT_MAX_WAIT, DEFAULT_QUEUE_LIMIT, ExcessSettings, LimiterSettings, RulesFrom,
    ServiceSettings, Settings, duration, error,
};
use sluice_rules_client::ClientTls;

use super::check_service::{client_tls, rules_fit_redis, service, tls};

/// The most keys a config may ask the limiter to hold (about 6 GB of entries): a bound, so a
/// typo cannot make the server try to allocate without limit at start.
const MAX_CAPACITY: usize = 100_000_000;

/// The most connections a config may allow: far beyond any file-descriptor limit in use, so
/// only a typo is refused.
const MAX_CONNECTIONS: usize = 1 << 24;

/// The bounds of `max_header_bytes`: a request line with a few headers at least; at most
/// 1 MiB, since every connection may buffer that much.
const HEADER_BYTES: std::ops::RangeInclusive<usize> = 1024..=1024 * 1024;

/// The bounds of `max_headers`.
const HEADERS: std::ops::RangeInclusive<usize> = 1..=10_000;

/// The bounds of `max_waiters`: each waiting request holds its connection.
const MAX_WAITERS: std::ops::RangeInclusive<usize> = 1..=1_000_000;

/// The bounds of `queue_limit`, in units of cost.
const QUEUE_LIMIT: std::ops::RangeInclusive<usize> = 1..=1_000_000;

/// The longest `max_wait`: a waiting request holds its connection all along.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// How requests over their quota are treated, as read so far (the server's, then an
/// account's on top).
#[derive(Debug, Clone, Copy)]
struct Waits {
    wait: bool,
    max_wait: std::time::Duration,
    queue_limit: u64,
    order: QueueOrder,
}

impl Default for Waits {
    fn default() -> Self {
        Self {
            wait: false,
            max_wait: DEFAULT_MAX_WAIT,
            queue_limit: DEFAULT_QUEUE_LIMIT,
            order: QueueOrder::OldestFirst,
        }
    }
}

impl Waits {
    /// These settings with the fields `raw` gives; errors name the field after `prefix`.
    fn with(mut self, prefix: &str, raw: &RawWait) -> Result<Self, ConfigError> {
        if let Some(text) = &raw.on_excess {
            self.wait = match text.as_str() {
                "reject" => false,
                "wait" => true,
                other => {
                    return Err(error(
                        format!("{prefix}on_excess"),
                        format!("{other:?}: must be reject or wait"),
                    ));
                }
            };
        }
        if let Some(text) = &raw.max_wait {
            let field = format!("{prefix}max_wait");
            let max_wait = positive(&field, text)?;
            if max_wait > MAX_WAIT {
                return Err(error(field, format!("{text:?} is longer than 1h")));
            }
            self.max_wait = max_wait;
        }
        if let Some(limit) = raw.queue_limit {
            let field = format!("{prefix}queue_limit");
            let limit = usize::try_from(limit).unwrap_or(usize::MAX);
            self.queue_limit = within(&field, limit, QUEUE_LIMIT)? as u64;
        }
        if let Some(text) = &raw.queue_order {
            self.order = match text.as_str() {
                "oldest_first" => QueueOrder::OldestFirst,
                "newest_first" => QueueOrder::NewestFirst,
                other => {
                    return Err(error(
                        format!("{prefix}queue_order"),
                        format!("{other:?}: must be oldest_first or newest_first"),
                    ));
                }
            };
        }
        Ok(self)
    }

    fn policy(self) -> WaitPolicy {
        if !self.wait {
            return WaitPolicy::reject();
        }
        WaitPolicy::wait_up_to(self.max_wait)
            .with_queue_limit(self.queue_limit)
            .with_queue_order(self.order)
    }
}

/// `value` if it is in `range`, else an error naming `field`.
fn within(field: &str, value: usize, range: std::ops::RangeInclusive<usize>) -> Result<usize, ConfigError> {
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(error(
            field,
            format!(
                "must be between {} and {}, not {value}",
                range.start(),
                range.end()
            ),
        ))
    }
}

fn quota(field: &str, text: &str) -> Result<Quota, ConfigError> {
    text.parse::<Quota>()
        .map_err(|e| error(field, format!("invalid quota {text:?}: {e}")))
}

/// A duration that must be longer than zero.
/// The longest `drain_delay` and `shutdown_timeout`: an orchestrator kills a process that
/// takes longer anyway.
const MAX_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

fn positive(field: &str, text: &str) -> Result<std::time::Duration, ConfigError> {
    let value = duration(field, text)?;
    if value.is_zero() {
        return Err(error(field, "must be longer than 0"));
    }
    Ok(value)
}

impl RawConfig {
    /// The checked settings, or the first field at fault. Each section is checked by its own
    /// function, in the order the fields were always checked.
    pub(super) fn check(mut self, dir: Option<&std::path::Path>) -> Result<Settings, ConfigError> {
        let listen = self
            .listen
            .parse::<SocketAddr>()
            .map_err(|e| error("listen", format!("invalid address {:?}: {e}", self.listen)))?;
        let idle_timeout = positive("idle_timeout", &self.idle_timeout)?;
        let drain_delay = duration("drain_delay", &self.drain_delay)?;
        if drain_delay > MAX_SHUTDOWN_WAIT {
            return Err(error("drain_delay", "at most 10m"));
        }
        let shutdown_timeout = positive("shutdown_timeout", &self.shutdown_timeout)?;
        if shutdown_timeout > MAX_SHUTDOWN_WAIT {
            return Err(error("shutdown_timeout", "at most 10m"));
        }
        let max_connections = (self.max_connections)
            .map(|n| within("max_connections", n, 1..=MAX_CONNECTIONS))
            .transpose()?;
        let max_header_bytes = within("max_header_bytes", self.max_header_bytes, HEADER_BYTES)?;
        let max_headers = within("max_headers", self.max_headers, HEADERS)?;
        let client_tls = (self.client_tls.as_ref())
            .map(|raw| client_tls(raw, dir))
            .transpose()?;
        let otlp = (self.otlp.as_ref())
            .map(|raw| crate::otlp::check(raw, self.client_tls.as_ref(), dir))
            .transpose()?;
        let limiter = self.limiter(client_tls.as_ref(), dir)?;
        let ipv6_prefix = match self.ipv6_prefix {
            None => sluice_http::DEFAULT_IPV6_PREFIX,
            Some(bits) => u8::try_from(bits).map_err(|_| {
                error(
                    "ipv6_prefix",
                    format!("the IPv6 prefix must be between 1 and 128 bits, not {bits}"),
                )
            })?,
        };
        let key_parts = key_parts(&self.key, ipv6_prefix)?;
        let max_key_len = self.key.max_length;
        let ((accounts, accounts_stacked), server_waits, by_account) = self.accounts(&limiter)?;
        for (i, key) in self.bypass.iter().enumerate() {
            fits_key(format!("bypass[{i}]"), key, max_key_len)?;
        }
        let trusted_proxies = (self.trusted_proxies.iter().enumerate())
            .map(|(i, net)| {
                net.parse::<IpNet>()
                    .map_err(|e| error(format!("trusted_proxies[{i}]"), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client_ip_header = match &self.client_ip_header {
            None => ClientIpHeader::default(),
            Some(name) => name.parse().map_err(|e| error("client_ip_header", e))?,
        };
        let costs = (self.costs.iter().enumerate())
            .map(|(i, rule)| cost(i, rule))
            .collect::<Result<Vec<_>, _>>()?;
        let charge_from = self.charge_from.as_ref().map(charge_from).transpose()?;
        let upstream = (self.upstream.as_ref()).map(crate::upstream::check).transpose()?;
        let admin_tls = (self.admin.as_ref().and_then(|a| a.tls.as_ref()))
            .map(|raw| tls("admin.tls", raw, dir))
            .transpose()?;
        let tls = (self.tls.as_ref()).map(|raw| tls("tls", raw, dir)).transpose()?;
        let admin = (self.admin.as_ref())
            .map(|a| {
                a.listen
                    .parse::<SocketAddr>()
                    .map_err(|e| error("admin.listen", format!("invalid address {:?}: {e}", a.listen)))
            })
            .transpose()?;
        let service = service(
            self.rules.as_ref(),
            self.rls.as_ref(),
            self.api.as_ref(),
            self.counting.as_deref(),
            self.merge_domains,
            client_tls.as_ref(),
            dir,
        )?;
        if let Some(ServiceSettings {
            rules: RulesFrom::Files { loaded, .. },
            ..
        }) = &service
            && limiter.redis.is_some()
        {
            rules_fit_redis(&loaded.0, limiter.algorithm).map_err(|e| error("rules", e))?;
        }
        if charge_from.is_some() && limiter.redis.is_some() && limiter.algorithm != AlgorithmKind::TokenBucket
        {
            return Err(error(
                "charge_from",
                format!(
                    "on Redis only the token_bucket algorithm takes charges after the fact, not {}",
                    limiter.algorithm
                ),
            ));
        }
        Ok(Settings {
            listen,
            idle_timeout,
            drain_delay,
            shutdown_timeout,
            max_connections,
            max_header_bytes,
            max_headers,
            limiter,
            accounts,
            accounts_stacked,
            key_parts,
            default_key: self.key.default,
            max_key_len,
            trusted_proxies,
            client_ip_header,
            ipv6_prefix,
            bypass: self.bypass,
            costs,
            headers: self.headers,
            charge_from,
            upstream,
            excess: ExcessSettings {
                default: server_waits.policy(),
                by_account,
                max_waiters: within(
                    "max_waiters",
                    self.max_waiters.unwrap_or(sluice_http::DEFAULT_MAX_WAITERS),
                    MAX_WAITERS,
                )?,
            },
            service,
            admin,
            admin_tls,
            tls,
            client_tls,
            otlp,
            metrics: crate::MetricsSettings {
                per_rule: (self.metrics.as_ref())
                    .and_then(|metrics| metrics.per_rule)
                    .unwrap_or(true),
            },
        })
    }

    /// The limiter's section: algorithm, Redis, failsafe and its pool, the unknown-key quota,
    /// capacity, fetches and refresh, the quota service.
    fn limiter(
        &mut self,
        client_tls: Option<&ClientTls>,
        dir: Option<&std::path::Path>,
    ) -> Result<LimiterSettings, ConfigError> {
        let algorithm: AlgorithmKind = self.algorithm.parse().map_err(|e| error("algorithm", e))?;
        let redis = self.redis.take().map(|r| r.check(algorithm, dir)).transpose()?;
        let on_redis = redis.is_some();
        let failsafe = held(
            algorithm,
            on_redis,
            "failsafe",
            quota("failsafe", &self.failsafe)?,
        )?;
        // The pool is a token bucket whatever the keys' algorithm.
        let failsafe_pool = match &self.failsafe_pool {
            Some(text) => {
                let pool = quota("failsafe_pool", text)?;
                let bucket = AlgorithmKind::TokenBucket;
                bucket
                    .check(&pool)
                    .map_err(|e| error("failsafe_pool", format!("{bucket} cannot hold {pool}: {e}")))?;
                Some(pool)
            }
            None => None,
        };
        let unknown = held(algorithm, on_redis, "unknown", quota("unknown", &self.unknown)?)?;
        let capacity = self.capacity.unwrap_or(sluice::DEFAULT_CAPACITY);
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(error(
                "capacity",
                format!("must be between 1 and {MAX_CAPACITY} keys, not {capacity}"),
            ));
        }
        let fetch_latency = duration("fetch_latency", &self.fetch_latency)?;
        let fetch_timeout = match &self.fetch_timeout {
            Some(text) => positive("fetch_timeout", text)?,
            None => sluice::DEFAULT_FETCH_TIMEOUT,
        };
        let refresh = positive("refresh", &self.refresh)?;
        if refresh > sluice::MAX_REFRESH {
            return Err(error(
                "refresh",
                format!(
                    "{:?} is too long: at most 2^63 − 1 ns (about 292 years)",
                    self.refresh
                ),
            ));
        }
        if let Some(url) = &self.accounts_url {
            sluice_rules_client::HttpQuotas::with_tls(url, fetch_timeout, client_tls.cloned())
                .map_err(|e| error("accounts_url", e))?;
        }
        Ok(LimiterSettings {
            algorithm,
            failsafe,
            failsafe_pool,
            unknown,
            fetch_latency,
            fetch_timeout,
            refresh,
            capacity,
            redis,
            accounts_url: self.accounts_url.clone(),
            denied_log: self.denied_log.unwrap_or(super::DEFAULT_DENIED_LOG),
            // Counted only where something reads the counts.
            observe: self.admin.is_some(),
        })
    }

    /// The accounts' quotas (with the server's `burst`), the server's waiting policy, and each
    /// account's own.
    #[allow(clippy::type_complexity)]
    fn accounts(
        &self,
        limiter: &LimiterSettings,
    ) -> Result<(Accounts, Waits, HashMap<String, WaitPolicy>), ConfigError> {
        let (algorithm, on_redis) = (limiter.algorithm, limiter.redis.is_some());
        let max_key_len = self.key.max_length;
        let mut accounts = HashMap::with_capacity(self.accounts.len());
        let mut stacked = HashMap::new();
        // The accounts become rules of one domain: as many as a domain holds.
        if self.accounts.len() > sluice_descriptors::MAX_DESCRIPTORS {
            return Err(error(
                "accounts",
                format!(
                    "{} accounts, at most {}",
                    self.accounts.len(),
                    sluice_descriptors::MAX_DESCRIPTORS
                ),
            ));
        }
        let server_wait = RawWait {
            on_excess: self.on_excess.clone(),
            max_wait: self.max_wait.clone(),
            queue_limit: self.queue_limit,
            queue_order: self.queue_order.clone(),
        };
        let server_waits = Waits::default().with("", &server_wait)?;
        let mut by_account = HashMap::new();
        for (name, account) in &self.accounts {
            let field = format!("accounts.{name}");
            if name.is_empty() {
                return Err(error("accounts", "an account's name is empty"));
            }
            fits_key(field.clone(), name, max_key_len)?;
            if let Some(wait) = &account.wait {
                let waits = server_waits.with(&format!("{field}."), wait)?;
                by_account.insert(name.clone(), waits.policy());
            }
            let field = if account.wait.is_some() {
                format!("{field}.quota")
            } else {
                field
            };
            let texts = &account.quotas;
            let most = sluice_descriptors::MAX_STACKED + 1;
            if texts.is_empty() || texts.len() > most {
                let told = format!("a list of 1 to {most} quotas, not {}", texts.len());
                return Err(error(&field, told));
            }
            let mut quotas = Vec::with_capacity(texts.len());
            for (i, text) in texts.iter().enumerate() {
                let field = if texts.len() > 1 {
                    format!("{field}[{i}]")
                } else {
                    field.clone()
                };
                let mut q = quota(&field, text)?;
                // `burst` shapes the account's first quota (a day's quota has no burst to take).
                let burst = self
                    .burst
                    .filter(|_| i == 0 && !text.contains("burst") && !q.is_deny_all());
                if let Some(burst) = burst {
                    q = q
                        .with_capacity(burst)
                        .map_err(|e| error(&field, format!("burst {burst} with {text:?}: {e}")))?;
                }
                quotas.push(held(algorithm, on_redis, &field, q)?);
            }
            let first = quotas.remove(0);
            accounts.insert(name.clone(), first);
            if !quotas.is_empty() {
                stacked.insert(name.clone(), quotas);
            }
        }
        Ok(((accounts, stacked), server_waits, by_account))
    }
}

/// Each account's first quota, and the others of those with several.
type Accounts = (HashMap<String, Quota>, HashMap<String, Vec<Quota>>);

/// `quota` if the keys' algorithm can hold it (and, on Redis, the script's numbers too:
/// refused here rather than denying every request for it at run time).
fn held(algorithm: AlgorithmKind, on_redis: bool, field: &str, quota: Quota) -> Result<Quota, ConfigError> {
    algorithm
        .check(&quota)
        .map_err(|e| error(field, format!("{algorithm} cannot hold {quota}: {e}")))?;
    if on_redis {
        sluice_redis::check_quota(algorithm, &quota).map_err(|e| error(field, e))?;
    }
    Ok(quota)
}

/// The `charge_from:` section: a header name, and a maximum of at least 1.
fn charge_from(raw: &RawChargeFrom) -> Result<sluice_http::ChargeFrom, ConfigError> {
    let header = (raw.header.parse::<http::HeaderName>()).map_err(|e| {
        error(
            "charge_from.header",
            format!("{:?} is not a header name: {e}", raw.header),
        )
    })?;
    if raw.max == 0 {
        return Err(error(
            "charge_from.max",
            "the most one response may charge must be at least 1",
        ));
    }
    Ok(sluice_http::ChargeFrom::new(header, raw.max).strip(raw.strip))
}

/// A key (an account's name, a bypassed key) no longer than `key.max_length`.
fn fits_key(field: String, key: &str, max_key_len: usize) -> Result<(), ConfigError> {
    if key.len() > max_key_len {
        return Err(error(
            field,
            format!("key longer than key.max_length ({max_key_len})"),
        ));
    }
    Ok(())
}

/// A path as written in the config: a relative one is read from the config's directory.
pub(super) fn in_dir(dir: Option<&std::path::Path>, written: &str) -> std::path::PathBuf {
    let written = std::path::PathBuf::from(written);
    match dir {
        Some(dir) if written.is_relative() => dir.join(&written),
        _ => written,
    }
}

/// The key's parts, and the layer's own check of them with the default key, the maximum
/// length and the IPv6 prefix.
fn key_parts(key: &RawKey, ipv6_prefix: u8) -> Result<Vec<KeyPart>, ConfigError> {
    let parts = (key.from.iter().enumerate())
        .map(|(i, part)| {
            part.parse::<KeyPart>()
                .map_err(|e| error(format!("key.from[{i}]"), e))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The layer refuses what it cannot serve; a limiter of one key is enough to ask it.
    let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, Quota::deny_all())
        .capacity(1)
        .shards(1)
        .build()
        .map_err(|e| error("key", e))?;
    let built = RateLimitLayer::builder(limiter)
        .key(parts.iter().cloned())
        .default_key(key.default.clone())
        .max_key_len(key.max_length)
        .ipv6_prefix(ipv6_prefix)
        .build();
    match built {
        Ok(_) => Ok(parts),
        Err(e) => {
            let field = match e {
                LayerBuildError::NoKeyParts => "key.from",
                LayerBuildError::MaxKeyLength(_) => "key.max_length",
                LayerBuildError::DefaultKey(_) => "key.default",
                LayerBuildError::Ipv6Prefix(_) => "ipv6_prefix",
                _ => "key",
            };
            Err(error(field, e))
        }
    }
}

fn cost(i: usize, rule: &RawCost) -> Result<CostRule, ConfigError> {
    if !rule.path.starts_with('/') {
        return Err(error(format!("costs[{i}].path"), "must start with '/'"));
    }
    // Requests are matched on their normalised path; a prefix that has none matches nothing.
    if let Err(e) = normalize_path(&rule.path) {
        return Err(error(
            format!("costs[{i}].path"),
            format!("{:?} cannot be normalised: {e}", rule.path),
        ));
    }
    let method = match &rule.method {
        Some(m) => Some(
            http::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                .map_err(|_| error(format!("costs[{i}].method"), format!("invalid method {m:?}")))?,
        ),
        None => None,
    };
    Ok(CostRule::new(rule.path.clone(), method, rule.cost))
}
