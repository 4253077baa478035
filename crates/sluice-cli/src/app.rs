//! What answers requests: the limiter and the layer built from [`Settings`], and the
//! `Hello World!` service behind them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use sluice::{Algorithm, AlgorithmVisitor, FetchResult, FnSource, KeyedBuildError, KeyedLimiter, Quota};
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

/// One generation of the server's config: replaced whole on a reload.
pub struct App {
    /// The rate-limited service.
    pub service: RateLimit<Hello>,
    /// Whether requests need their peer address.
    pub needs_peer: bool,
    limiter_settings: LimiterSettings,
    limiter: Arc<dyn LimitBackend>,
    accounts: Accounts,
}

impl App {
    /// A new app with a new limiter (connecting to Redis if the settings say so). Must run
    /// inside a tokio runtime (fetches are spawned on it). `url_field` names where the Redis
    /// URL came from, for errors.
    pub async fn new(settings: &Settings, url_field: &'static str) -> Result<Self, AppError> {
        let accounts: Accounts = Arc::new(ArcSwap::from_pointee(settings.accounts.clone()));
        let limiter = match &settings.limiter.redis {
            None => build_limiter(&settings.limiter, Arc::clone(&accounts))?,
            Some(redis) => build_redis_backend(&settings.limiter, redis, Arc::clone(&accounts))
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
        };
        Self::with_limiter(settings, limiter, accounts)
    }

    /// The app for changed settings. The limiter and its counts are kept when its own
    /// settings are unchanged (new account quotas reach held keys at their next refresh);
    /// otherwise a new limiter starts afresh. Returns whether the limiter was kept.
    pub async fn reload(
        &self,
        settings: &Settings,
        url_field: &'static str,
    ) -> Result<(Self, bool), AppError> {
        if settings.limiter == self.limiter_settings {
            self.accounts.store(Arc::new(settings.accounts.clone()));
            let app = Self::with_limiter(settings, Arc::clone(&self.limiter), Arc::clone(&self.accounts))?;
            Ok((app, true))
        } else {
            Ok((Self::new(settings, url_field).await?, false))
        }
    }

    fn with_limiter(
        settings: &Settings,
        limiter: Arc<dyn LimitBackend>,
        accounts: Accounts,
    ) -> Result<Self, AppError> {
        let layer = RateLimitLayer::builder_shared(Arc::clone(&limiter))
            .key(settings.key_parts.iter().cloned())
            .default_key(settings.default_key.clone())
            .max_key_len(settings.max_key_len)
            .trusted_proxies(TrustedProxies::new(settings.trusted_proxies.iter().copied()))
            .bypass(settings.bypass.iter().cloned())
            .costs(RouteCosts::new(settings.costs.iter().cloned()))
            .headers_on_allow(settings.headers)
            .build()?;
        Ok(Self {
            needs_peer: layer.needs_peer_addr(),
            service: layer.layer(Hello),
            limiter_settings: settings.limiter.clone(),
            limiter,
            accounts,
        })
    }
}

fn build_limiter(
    settings: &LimiterSettings,
    accounts: Accounts,
) -> Result<Arc<dyn LimitBackend>, KeyedBuildError> {
    /// The in-memory limiter of any algorithm.
    struct InMemory<'a>(&'a LimiterSettings, Accounts);
    impl AlgorithmVisitor for InMemory<'_> {
        type Output = Result<Arc<dyn LimitBackend>, KeyedBuildError>;
        fn visit<A: Algorithm>(self, algorithm: A) -> Self::Output {
            keyed(algorithm, self.0, self.1)
        }
    }
    settings.algorithm.visit(InMemory(settings, accounts))
}

/// The quota fetch: a look-up in the accounts, after the simulated latency.
fn source(settings: &LimiterSettings, accounts: Accounts) -> impl sluice::QuotaSource<String> {
    let latency = settings.fetch_latency;
    FnSource(move |key: &String| {
        let quota = accounts.load().get(key).copied();
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            FetchResult::Ok(quota)
        }
    })
}

enum RedisBackendError {
    NoUrl,
    Redis(sluice_redis::Error),
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
            .map_err(|e| RedisBackendError::Redis(sluice_redis::Error::Keyed(e))),
    }
}

async fn redis_backend<A: RedisAlgorithm>(
    algorithm: A,
    settings: &LimiterSettings,
    redis: &RedisSettings,
    accounts: Accounts,
) -> Result<Arc<dyn LimitBackend>, RedisBackendError> {
    if redis.url.is_none() && redis.cluster.is_empty() {
        return Err(RedisBackendError::NoUrl);
    }
    let options = RedisOptions {
        timeout: redis.timeout,
        ..RedisOptions::default()
    };
    let store = match &redis.url {
        Some(url) => RedisStore::connect(url, options).await,
        None => {
            let nodes: Vec<&str> = redis.cluster.iter().map(String::as_str).collect();
            RedisStore::connect_cluster(&nodes, options).await
        }
    };
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
    .build(store.map_err(RedisBackendError::Redis)?)
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
) -> Result<Arc<dyn LimitBackend>, KeyedBuildError> {
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
    Ok(Arc::new(limiter))
}
