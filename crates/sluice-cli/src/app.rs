//! What answers requests: the limiter and the layer built from [`Settings`], and the service
//! behind them (`Hello World!`, or the upstream's reverse proxy).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use sluice_descriptors::{DomainRules, RuleSet};
use sluice_http::{
    ChargeCounts, ChargeTally, LayerBuildError, RateLimit, RateLimitLayer, RouteCosts, TrustedProxies,
    WaitRoom,
};
use sluice_redis::{RedisOptions, RedisStore};
use sluice_service::{
    CounterSettings, Engine, EngineSettings, LayerBackend, RedisCounters, ValueQuotaSource, ValueQuotas,
};
use tower_layer::Layer;

use crate::config::{LimiterSettings, RedisSettings, Settings};
use crate::upstream::{Backend, Proxy, ProxyContext, UpstreamStats};

/// Why an app could not be built from checked settings.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The engine refused a setting (a quota its algorithm cannot hold, a refresh period too
    /// long, a quota Redis cannot hold).
    #[error(transparent)]
    Limiter(#[from] sluice_service::EngineError),
    /// The accounts cannot be made into rules.
    #[error("accounts: {0}")]
    Accounts(#[from] sluice_descriptors::RulesError),
    /// The layer refused a setting.
    #[error(transparent)]
    Layer(#[from] LayerBuildError),
    /// The quota service's URL.
    #[error("accounts_url: {0}")]
    AccountsUrl(#[from] sluice_rules_client::UrlError),
    /// The `redis:` section gives no URL or cluster and no `--redis` was given.
    #[error("redis.url: not set (give it or redis.cluster in the config, or --redis URL)")]
    NoRedisUrl,
    /// Redis could not be used at start-up (`field` is `redis.url`, `redis.cluster` or
    /// `--redis`).
    #[error("{field}: {source}")]
    Redis {
        /// Where the URL came from.
        field: &'static str,
        /// What went wrong (boxed: the error is large, and `AppError` is returned often).
        source: Box<sluice_redis::SetupError>,
    },
    /// The roots `https://` upstreams are checked against could not be loaded.
    #[error("upstream: {0}")]
    UpstreamTls(#[from] sluice_rules_client::ClientTlsError),
}

/// The domain the accounts map becomes, and the descriptor key of each request's key in it.
pub const ACCOUNTS_DOMAIN: &str = "accounts";
/// See [`ACCOUNTS_DOMAIN`].
pub const ACCOUNT_KEY: &str = "account";

/// What a reload did with the limiter and the counts it holds.
#[derive(Debug)]
pub enum LimiterReload {
    /// The limiter's settings are unchanged: the same limiter, every count kept.
    Kept,
    /// A new in-memory limiter took the held keys with their counts.
    Migrated {
        /// The limiter settings that changed.
        changed: Vec<&'static str>,
        /// How many keys moved, and how many found no room.
        migrated: sluice_service::Reloaded,
    },
    /// A new limiter on the same Redis keys: the counts live there and stay.
    Shared {
        /// The limiter settings that changed.
        changed: Vec<&'static str>,
    },
    /// A new limiter whose counts start afresh.
    Afresh {
        /// The limiter settings that changed.
        changed: Vec<&'static str>,
        /// Why the counts could not be kept.
        why: &'static str,
    },
}

impl std::fmt::Display for LimiterReload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kept => write!(f, "limiter unchanged, counts kept"),
            Self::Migrated { changed, migrated } => {
                write!(
                    f,
                    "limiter settings changed ({}): {} held keys keep their counts (a changed \
                     quota by the carry-over rule)",
                    changed.join(", "),
                    migrated.moved
                )?;
                if migrated.dropped > 0 {
                    write!(f, "; {} found no room and start afresh", migrated.dropped)?;
                }
                Ok(())
            }
            Self::Shared { changed } => write!(
                f,
                "limiter settings changed ({}): counts kept in Redis",
                changed.join(", ")
            ),
            Self::Afresh { changed, why } => write!(
                f,
                "limiter settings changed ({}): counts start afresh ({why})",
                changed.join(", ")
            ),
        }
    }
}

/// One generation of the server's config: replaced whole on a reload.
pub struct App {
    /// The rate-limited service.
    pub service: RateLimit<Backend>,
    /// Whether the layer needs requests' peer address (for keys, trusted proxies).
    pub needs_peer: bool,
    /// Whether requests go to an upstream (`upstream:`), not to the demo's answer.
    pub proxying: bool,
    limiter_settings: LimiterSettings,
    /// The engine deciding every request's key, on the accounts' rules.
    engine: Arc<Engine>,
    /// The queues of requests waiting for capacity: kept across reloads, so waiters keep
    /// their places and the bound on them holds for the whole server.
    room: Arc<WaitRoom>,
    /// Where the charges after responses are counted (`charge_from`): kept across reloads.
    charges: ChargeTally,
    /// What the proxy counted: kept across reloads.
    upstream_stats: Arc<UpstreamStats>,
}

impl App {
    /// The engine deciding the layer's requests.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The requests waiting for capacity.
    pub fn wait_room(&self) -> &Arc<WaitRoom> {
        &self.room
    }

    /// What the charges after responses came to (`charge_from`), if the layer charges.
    pub fn charge_counts(&self) -> Option<ChargeCounts> {
        self.service.charge_counts()
    }

    /// What the proxy counted, if requests go to an upstream.
    pub fn upstream_stats(&self) -> Option<&UpstreamStats> {
        self.proxying.then_some(&*self.upstream_stats)
    }

    /// A new app with a new engine (connecting to Redis if the settings say so). Must run
    /// inside a tokio runtime (fetches are spawned on it). `url_field` names where the Redis
    /// URL came from, for errors.
    pub async fn new(settings: &Settings, url_field: &'static str) -> Result<Self, AppError> {
        let rules = accounts_rules(settings)?;
        let engine_settings = engine_settings(&settings.limiter, settings)?;
        let engine = match &settings.limiter.redis {
            None => Engine::new(rules, engine_settings)?,
            Some(redis) => {
                let store = connect_redis(redis).await.map_err(|source| match source {
                    RedisBackendError::NoUrl => AppError::NoRedisUrl,
                    RedisBackendError::Redis(source) => AppError::Redis {
                        // With no URL from either place, the config named a cluster.
                        field: if redis.url.is_none() {
                            "redis.cluster"
                        } else {
                            url_field
                        },
                        source: Box::new(source),
                    },
                })?;
                let counters = RedisCounters {
                    policy: redis.policy,
                    hosts: redis.hosts,
                    prefix: redis.prefix.clone(),
                    ..RedisCounters::new(store)
                };
                let at = redis
                    .url
                    .clone()
                    .unwrap_or_else(|| format!("cluster {}", redis.cluster.join(",")));
                tracing::info!(redis = at, policy = %redis.policy, hosts = redis.hosts, "limits shared through Redis");
                Engine::on_redis(rules, engine_settings, counters)?
            }
        };
        let room = Arc::new(WaitRoom::new(settings.excess.max_waiters));
        let kept = Kept {
            room,
            charges: ChargeTally::default(),
            upstream_stats: Arc::default(),
        };
        Self::with_engine(settings, Arc::new(engine), kept)
    }

    /// The app that replaces `self` on a reload: the same waiters, the same charge counts.
    fn next(&self, settings: &Settings, engine: Arc<Engine>) -> Result<Self, AppError> {
        let kept = Kept {
            room: Arc::clone(&self.room),
            charges: self.charges.clone(),
            upstream_stats: Arc::clone(&self.upstream_stats),
        };
        Self::with_engine(settings, engine, kept)
    }

    /// The last step of a reload that built a new engine: the running one hands over to it,
    /// so requests still held by the old layer (waiting for capacity) ask the new one (after
    /// a migration the old one denies the keys it gave away).
    fn take_over_from(self, old: &App) -> Self {
        old.engine.replaced_by(Arc::clone(&self.engine));
        self
    }

    /// The app for changed settings, keeping every held count where it can:
    /// - the limiter's own settings unchanged: the same engine on the new accounts' rules
    ///   (a changed quota applies to held keys at once, by the carry-over rule);
    /// - in memory, with the same algorithm: a new engine with the new settings takes every
    ///   held key with its count (its quota carried over where it changed);
    /// - on the same Redis keys (URL or cluster, prefix, algorithm): the counts are in Redis;
    /// - otherwise (another algorithm, another Redis, memory to Redis or back): afresh.
    ///
    /// Nothing of the running app changes unless this returns `Ok`, except that the accounts'
    /// new rules are in force when the limiter settings are unchanged; after a migration the
    /// running engine denies the moved keys, so the returned app must be put in its place.
    pub async fn reload(
        &self,
        settings: &Settings,
        url_field: &'static str,
    ) -> Result<(Self, LimiterReload), AppError> {
        let (old, new) = (&self.limiter_settings, &settings.limiter);
        if new == old {
            let app = self.next(settings, Arc::clone(&self.engine))?;
            // Last, once nothing can fail.
            self.engine.reload(accounts_rules(settings)?)?;
            return Ok((app, LimiterReload::Kept));
        }
        let changed = old.changed(new);
        let afresh = |why| LimiterReload::Afresh {
            changed: changed.clone(),
            why,
        };
        let reloaded = match (&old.redis, &new.redis) {
            _ if old.algorithm != new.algorithm => afresh("another algorithm"),
            (None, None) => {
                let engine = Engine::new(accounts_rules(settings)?, engine_settings(new, settings)?)?;
                let app = self.next(settings, Arc::new(engine))?;
                // Last, once nothing can fail: the keys leave the running engine.
                let reloaded = match self.engine.migrate_into(&app.engine) {
                    Some(migrated) => LimiterReload::Migrated {
                        changed: changed.clone(),
                        migrated,
                    },
                    None => afresh("the running engine cannot hand its keys over"),
                };
                return Ok((app.take_over_from(self), reloaded));
            }
            (Some(a), Some(b)) if (&a.url, &a.cluster, &a.prefix) == (&b.url, &b.cluster, &b.prefix) => {
                LimiterReload::Shared {
                    changed: changed.clone(),
                }
            }
            (Some(_), Some(_)) => afresh("another Redis or key prefix"),
            (None, Some(_)) => afresh("from memory to Redis"),
            (Some(_), None) => afresh("from Redis to memory"),
        };
        let app = Self::new(settings, url_field).await?;
        let app = self.next(settings, app.engine)?;
        Ok((app.take_over_from(self), reloaded))
    }

    fn with_engine(settings: &Settings, engine: Arc<Engine>, kept: Kept) -> Result<Self, AppError> {
        let Kept {
            room,
            charges,
            upstream_stats,
        } = kept;
        let layer = RateLimitLayer::builder(accounts_backend(&engine))
            .key(settings.key_parts.iter().cloned())
            .default_key(settings.default_key.clone())
            .max_key_len(settings.max_key_len)
            .trusted_proxies(TrustedProxies::new(settings.trusted_proxies.iter().copied()))
            .client_ip_header(settings.client_ip_header)
            .ipv6_prefix(settings.ipv6_prefix)
            .bypass(settings.bypass.iter().cloned())
            .costs(RouteCosts::new(settings.costs.iter().cloned()))
            .headers_on_allow(settings.headers)
            .on_excess(settings.excess.default)
            .wait_room(Arc::clone(&room))
            .charge_tally(charges.clone());
        let layer = match &settings.charge_from {
            Some(from) => layer.charge_from(from.clone()),
            None => layer,
        };
        let layer = (settings.excess.by_account.iter())
            .fold(layer, |layer, (account, policy)| {
                layer.on_excess_for(account.clone(), *policy)
            })
            .build()?;
        let backend = match &settings.upstream {
            None => Backend::Hello,
            Some(upstream) => {
                let context = ProxyContext {
                    trusted: TrustedProxies::new(settings.trusted_proxies.iter().copied()),
                    tls: settings.tls.is_some(),
                    client_tls: settings.client_tls.as_ref(),
                    stats: Arc::clone(&upstream_stats),
                };
                Backend::proxy(Proxy::new(upstream, context)?)
            }
        };
        let proxying = backend.is_proxy();
        Ok(Self {
            // The proxy is told the peer apart (`Backend::serving`).
            needs_peer: layer.needs_peer_addr(),
            proxying,
            service: layer.layer(backend),
            limiter_settings: settings.limiter.clone(),
            engine,
            room,
            charges,
            upstream_stats,
        })
    }
}

/// What an app hands on to the app that replaces it on a reload.
struct Kept {
    /// The requests waiting for capacity.
    room: Arc<WaitRoom>,
    /// The charges after responses.
    charges: ChargeTally,
    /// The proxy's counts.
    upstream_stats: Arc<UpstreamStats>,
}

/// The layer's backend on `engine`: each request's key is an account.
fn accounts_backend(engine: &Arc<Engine>) -> LayerBackend {
    LayerBackend::new(Arc::clone(engine), ACCOUNTS_DOMAIN, ACCOUNT_KEY)
}

/// The accounts map as rules of one domain: each account's quotas for its own value of the
/// request's key, and the unknown-key quota for every other value.
fn accounts_rules(settings: &Settings) -> Result<RuleSet, sluice_descriptors::RulesError> {
    let accounts = settings
        .accounts
        .iter()
        .map(|(name, quota)| (name.clone(), *quota));
    let mut domain = DomainRules::by_value(
        ACCOUNTS_DOMAIN,
        ACCOUNT_KEY,
        accounts,
        Some(settings.limiter.unknown),
    )?;
    for (name, quotas) in &settings.accounts_stacked {
        domain.stack(ACCOUNT_KEY, name, quotas.clone())?;
    }
    RuleSet::from_domains(vec![domain])
}

/// The engine's settings from the limiter's: the quota of a key not yet fetched is the
/// failsafe one (and the pool), for the simulated fetch latency or while the quota service
/// of `accounts_url` answers (asked through `settings.client_tls`); decisions' spans name their
/// keys if `otlp.keys` asks.
fn engine_settings(
    limiter: &LimiterSettings,
    settings: &Settings,
) -> Result<EngineSettings, sluice_rules_client::UrlError> {
    let client_tls = settings.client_tls.as_ref();
    let by_value = match &limiter.accounts_url {
        Some(url) => Some(ValueQuotas {
            domain: ACCOUNTS_DOMAIN.into(),
            source: Arc::new(AccountsService(sluice_rules_client::HttpQuotas::with_tls(
                url,
                limiter.fetch_timeout,
                client_tls.cloned(),
            )?)),
        }),
        None => None,
    };
    Ok(EngineSettings {
        algorithm: limiter.algorithm,
        counters: CounterSettings {
            capacity: limiter.capacity,
            failsafe: limiter.failsafe,
            failsafe_pool: limiter.failsafe_pool,
            fetch_latency: limiter.fetch_latency,
            fetch_timeout: limiter.fetch_timeout,
            refresh: limiter.refresh,
        },
        by_value,
        denied_log_per_second: limiter.denied_log,
        observe: limiter.observe,
        trace_keys: settings.otlp.as_ref().is_some_and(|otlp| otlp.keys),
        ..EngineSettings::default()
    })
}

/// The quota service of `accounts_url`, asked for an account's quota by the engine.
struct AccountsService(sluice_rules_client::HttpQuotas);

impl ValueQuotaSource for AccountsService {
    fn fetch(&self, account: &str) -> Pin<Box<dyn Future<Output = sluice::FetchResult> + Send + 'static>> {
        Box::pin(self.0.fetch(account))
    }
}

pub(crate) enum RedisBackendError {
    NoUrl,
    Redis(sluice_redis::SetupError),
}

/// A connection to the Redis (or cluster) of the `redis:` section.
pub(crate) async fn connect_redis(redis: &RedisSettings) -> Result<RedisStore, RedisBackendError> {
    if redis.url.is_none() && redis.cluster.is_empty() {
        return Err(RedisBackendError::NoUrl);
    }
    let options = RedisOptions {
        timeout: redis.timeout,
        degrade_after: redis.degrade_after,
        tls: redis.tls.clone(),
        ..RedisOptions::default()
    };
    match &redis.url {
        Some(url) => RedisStore::connect(url, options).await,
        None => {
            let nodes: Vec<&str> = redis.cluster.iter().map(String::as_str).collect();
            RedisStore::connect_cluster(&nodes, options).await
        }
    }
    .map_err(RedisBackendError::Redis)
}
