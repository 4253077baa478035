//! What answers requests: the limiter and the layer built from [`Settings`], and the
//! `Hello World!` service behind them.

use std::any::Any;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use sluice::{
    Algorithm, AlgorithmVisitor, FetchResult, KeyedBuildError, KeyedLimiter, Migrated, Quota, QuotaSource,
};
use sluice_http::{BuildError, LimitBackend, RateLimit, RateLimitLayer, RouteCosts, TrustedProxies};
use tokio::runtime::Handle;
use tower_layer::Layer;
use tower_service::Service;

use sluice_redis::{RedisAlgorithm, RedisAlgorithmVisitor, RedisLimiter, RedisOptions, RedisStore};

use crate::config::{LimiterSettings, RedisSettings, Settings};
use crate::redis_backend::RedisBackend;

/// The service behind the limiter: `200 Hello World!`.
#[derive(Debug, Clone, Copy)]
pub struct Hello;

impl<B> Service<Request<B>> for Hello {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<B>) -> Self::Future {
        ready(Ok(Response::new(Full::new(Bytes::from_static(b"Hello World!")))))
    }
}

/// Why an app could not be built from checked settings.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The keyed limiter refused a setting (a quota its algorithm cannot hold, a refresh
    /// period too long).
    #[error(transparent)]
    Limiter(#[from] KeyedBuildError),
    /// The layer refused a setting.
    #[error(transparent)]
    Layer(#[from] BuildError),
    /// The `redis:` section gives no URL or cluster and no `--redis` was given.
    #[error("redis.url: not set (give it or redis.cluster in the config, or --redis URL)")]
    NoRedisUrl,
    /// Redis could not be used at start-up (`field` is `redis.url`, `redis.cluster` or
    /// `--redis`).
    #[error("{field}: {source}")]
    Redis {
        /// Where the URL came from.
        field: &'static str,
        /// What went wrong.
        source: sluice_redis::Error,
    },
}

/// Quotas by key, swapped whole when the config changes.
type Accounts = Arc<ArcSwap<HashMap<String, Quota>>>;

/// The limiter behind the layer, and the same limiter as an in-memory store whose keys a
/// reload can move (none on Redis).
struct Store {
    backend: Arc<dyn LimitBackend>,
    memory: Option<Arc<dyn InMemory>>,
}

/// An in-memory keyed limiter of some algorithm, seen through what a reload needs of it.
trait InMemory: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    /// Moves every held key into `target`; `None` if it is not a limiter of the same type.
    fn migrate_into(&self, target: &dyn InMemory) -> Option<Migrated>;
}

impl<A: Algorithm> InMemory for KeyedLimiter<String, A, AccountsSource> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn migrate_into(&self, target: &dyn InMemory) -> Option<Migrated> {
        let target = target.as_any().downcast_ref::<Self>()?;
        Some(KeyedLimiter::migrate_into(self, target))
    }
}

/// What a reload did with the limiter and the counts it holds.
#[derive(Debug)]
pub enum Reloaded {
    /// The limiter's settings are unchanged: the same limiter, every count kept.
    Kept,
    /// A new in-memory limiter took the held keys with their counts.
    Migrated {
        /// The limiter settings that changed.
        changed: Vec<&'static str>,
        /// How many keys moved, and how many found no room.
        migrated: Migrated,
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

impl std::fmt::Display for Reloaded {
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
    pub service: RateLimit<Hello>,
    /// Whether requests need their peer address.
    pub needs_peer: bool,
    limiter_settings: LimiterSettings,
    store: Store,
    accounts: Accounts,
}

impl App {
    /// A new app with a new limiter (connecting to Redis if the settings say so). Must run
    /// inside a tokio runtime (fetches are spawned on it). `url_field` names where the Redis
    /// URL came from, for errors.
    pub async fn new(settings: &Settings, url_field: &'static str) -> Result<Self, AppError> {
        let accounts: Accounts = Arc::new(ArcSwap::from_pointee(settings.accounts.clone()));
        let store = match &settings.limiter.redis {
            None => build_limiter(&settings.limiter, Arc::clone(&accounts))?,
            Some(redis) => Store {
                backend: build_redis_backend(&settings.limiter, redis, Arc::clone(&accounts))
                    .await
                    .map_err(|source| match source {
                        RedisBackendError::NoUrl => AppError::NoRedisUrl,
                        RedisBackendError::Redis(source) => AppError::Redis {
                            // With no URL from either place, the config named a cluster.
                            field: if redis.url.is_none() {
                                "redis.cluster"
                            } else {
                                url_field
                            },
                            source,
                        },
                    })?,
                memory: None,
            },
        };
        Self::with_store(settings, store, accounts)
    }

    /// The app for changed settings, keeping every held count where it can:
    /// - the limiter's own settings unchanged: the same limiter (new account quotas reach
    ///   held keys at their next refresh, by the carry-over rule);
    /// - in memory, with the same algorithm: a new limiter with the new settings takes every
    ///   held key with its count (its quota carried over where it changed);
    /// - on the same Redis keys (URL or cluster, prefix, algorithm): the counts are in Redis;
    /// - otherwise (another algorithm, another Redis, memory to Redis or back): afresh.
    ///
    /// Nothing of the running app changes unless this returns `Ok`; after a migration the
    /// running limiter denies the moved keys, so the returned app must be put in its place.
    pub async fn reload(
        &self,
        settings: &Settings,
        url_field: &'static str,
    ) -> Result<(Self, Reloaded), AppError> {
        let (old, new) = (&self.limiter_settings, &settings.limiter);
        if new == old {
            let store = Store {
                backend: Arc::clone(&self.store.backend),
                memory: self.store.memory.clone(),
            };
            let app = Self::with_store(settings, store, Arc::clone(&self.accounts))?;
            self.accounts.store(Arc::new(settings.accounts.clone()));
            return Ok((app, Reloaded::Kept));
        }
        let changed = old.changed(new);
        let afresh = |why| Reloaded::Afresh {
            changed: changed.clone(),
            why,
        };
        let reloaded = match (&old.redis, &new.redis) {
            _ if old.algorithm != new.algorithm => afresh("another algorithm"),
            (None, None) => {
                let accounts: Accounts = Arc::new(ArcSwap::from_pointee(settings.accounts.clone()));
                let store = build_limiter(new, Arc::clone(&accounts))?;
                let app = Self::with_store(settings, store, accounts)?;
                // Last, once nothing can fail: the keys leave the running limiter.
                let migrated = match (&self.store.memory, &app.store.memory) {
                    (Some(running), Some(next)) => running.migrate_into(next.as_ref()),
                    _ => None,
                };
                let reloaded = match migrated {
                    Some(migrated) => Reloaded::Migrated {
                        changed: changed.clone(),
                        migrated,
                    },
                    None => afresh("the running limiter cannot hand its keys over"),
                };
                return Ok((app, reloaded));
            }
            (Some(a), Some(b)) if (&a.url, &a.cluster, &a.prefix) == (&b.url, &b.cluster, &b.prefix) => {
                Reloaded::Shared {
                    changed: changed.clone(),
                }
            }
            (Some(_), Some(_)) => afresh("another Redis or key prefix"),
            (None, Some(_)) => afresh("from memory to Redis"),
            (Some(_), None) => afresh("from Redis to memory"),
        };
        Ok((Self::new(settings, url_field).await?, reloaded))
    }

    fn with_store(settings: &Settings, store: Store, accounts: Accounts) -> Result<Self, AppError> {
        let layer = RateLimitLayer::builder_shared(Arc::clone(&store.backend))
            .key(settings.key_parts.iter().cloned())
            .default_key(settings.default_key.clone())
            .max_key_len(settings.max_key_len)
            .trusted_proxies(TrustedProxies::new(settings.trusted_proxies.iter().copied()))
            .client_ip_header(settings.client_ip_header)
            .ipv6_prefix(settings.ipv6_prefix)
            .bypass(settings.bypass.iter().cloned())
            .costs(RouteCosts::new(settings.costs.iter().cloned()))
            .headers_on_allow(settings.headers)
            .build()?;
        Ok(Self {
            needs_peer: layer.needs_peer_addr(),
            service: layer.layer(Hello),
            limiter_settings: settings.limiter.clone(),
            store,
            accounts,
        })
    }
}

fn build_limiter(settings: &LimiterSettings, accounts: Accounts) -> Result<Store, KeyedBuildError> {
    /// The in-memory limiter of any algorithm.
    struct Memory<'a>(&'a LimiterSettings, Accounts);
    impl AlgorithmVisitor for Memory<'_> {
        type Output = Result<Store, KeyedBuildError>;
        fn visit<A: Algorithm>(self, algorithm: A) -> Self::Output {
            keyed(algorithm, self.0, self.1)
        }
    }
    settings.algorithm.visit(Memory(settings, accounts))
}

/// The quota fetch: a look-up in the accounts, after the simulated latency. A named type, so
/// a reload can find its limiter's type again (`InMemory`).
struct AccountsSource {
    accounts: Accounts,
    latency: Duration,
}

impl QuotaSource<String> for AccountsSource {
    fn fetch(&self, key: &String) -> impl Future<Output = FetchResult> + Send + 'static {
        let quota = self.accounts.load().get(key).copied();
        let latency = self.latency;
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            FetchResult::Ok(quota)
        }
    }
}

fn source(settings: &LimiterSettings, accounts: Accounts) -> AccountsSource {
    AccountsSource {
        accounts,
        latency: settings.fetch_latency,
    }
}

pub(crate) enum RedisBackendError {
    NoUrl,
    Redis(sluice_redis::Error),
}

/// A connection to the Redis (or cluster) of the `redis:` section.
pub(crate) async fn connect_redis(redis: &RedisSettings) -> Result<RedisStore, RedisBackendError> {
    if redis.url.is_none() && redis.cluster.is_empty() {
        return Err(RedisBackendError::NoUrl);
    }
    let options = RedisOptions {
        timeout: redis.timeout,
        degrade_after: redis.degrade_after,
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

type Building<'a> =
    Pin<Box<dyn Future<Output = Result<Arc<dyn LimitBackend>, RedisBackendError>> + Send + 'a>>;

/// The Redis limiter of a scripted algorithm.
struct OnRedis<'a> {
    settings: &'a LimiterSettings,
    redis: &'a RedisSettings,
    accounts: Accounts,
}

impl<'a> RedisAlgorithmVisitor for OnRedis<'a> {
    type Output = Building<'a>;
    fn visit<A: RedisAlgorithm>(self, algorithm: A) -> Building<'a> {
        Box::pin(redis_backend(algorithm, self.settings, self.redis, self.accounts))
    }
}

async fn build_redis_backend(
    settings: &LimiterSettings,
    redis: &RedisSettings,
    accounts: Accounts,
) -> Result<Arc<dyn LimitBackend>, RedisBackendError> {
    let on_redis = OnRedis {
        settings,
        redis,
        accounts: Arc::clone(&accounts),
    };
    match sluice_redis::visit_scripted(settings.algorithm, on_redis) {
        Ok(building) => building.await,
        // Refused when the config is checked; kept in memory should a caller skip the check.
        Err(_) => build_limiter(settings, accounts)
            .map(|store| store.backend)
            .map_err(|e| RedisBackendError::Redis(sluice_redis::Error::Keyed(e))),
    }
}

async fn redis_backend<A: RedisAlgorithm>(
    algorithm: A,
    settings: &LimiterSettings,
    redis: &RedisSettings,
    accounts: Accounts,
) -> Result<Arc<dyn LimitBackend>, RedisBackendError> {
    let store = connect_redis(redis).await;
    let limiter = RedisLimiter::builder(algorithm, settings.failsafe)
        .source(source(settings, accounts))
        .unknown_key_quota(settings.unknown)
        .policy(redis.policy)
        .hosts(redis.hosts)
        .prefix(redis.prefix.clone())
        .capacity(settings.capacity)
        .refresh_every(settings.refresh);
    let limiter = match settings.failsafe_pool {
        Some(pool) => limiter.failsafe_pool(pool),
        None => limiter,
    }
    .build(store?)
    .map_err(RedisBackendError::Redis)?;
    let at = redis
        .url
        .clone()
        .unwrap_or_else(|| format!("cluster {}", redis.cluster.join(",")));
    tracing::info!(redis = at, policy = %redis.policy, hosts = redis.hosts, "limits shared through Redis");
    Ok(Arc::new(RedisBackend(limiter)))
}

fn keyed<A: Algorithm>(
    algorithm: A,
    settings: &LimiterSettings,
    accounts: Accounts,
) -> Result<Store, KeyedBuildError> {
    let source = source(settings, accounts);
    let runtime = Handle::current();
    let builder = KeyedLimiter::builder(algorithm, settings.failsafe)
        .capacity(settings.capacity)
        .unknown_key_quota(settings.unknown)
        .refresh_every(settings.refresh)
        .fetch_timeout(settings.fetch_timeout)
        .spawner(move |task| {
            runtime.spawn(task);
        })
        .on_fetch_error(|key: &String, e| tracing::warn!(key = %key, "quota fetch failed: {e}"))
        .source(source);
    let limiter = match settings.failsafe_pool {
        Some(pool) => builder.failsafe_pool(pool),
        None => builder,
    }
    .build()?;
    // Two handles on one limiter (a clone shares it).
    Ok(Store {
        backend: Arc::new(limiter.clone()),
        memory: Some(Arc::new(limiter)),
    })
}
