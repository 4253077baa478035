//! What answers requests: the limiter and the layer built from [`Settings`], and the
//! `Hello World!` service behind them.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use sluice::{
    Algorithm, FetchResult, FixedWindow, FnSource, KeyedLimiter, LeakyBucket, Quota, QuotaError,
    SlidingWindowCounter, SlidingWindowLog, TokenBucket,
};
use sluice_http::{BuildError, KeyLimiter, RateLimit, RateLimitLayer, RouteCosts, TrustedProxies};
use tokio::runtime::Handle;
use tower_layer::Layer;
use tower_service::Service;

use crate::config::{AlgorithmKind, LimiterSettings, Settings};

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
    /// The algorithm cannot hold the failsafe or unknown-key quota.
    #[error(transparent)]
    Quota(#[from] QuotaError),
    /// The layer refused a setting.
    #[error(transparent)]
    Layer(#[from] BuildError),
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
    limiter: Arc<dyn KeyLimiter>,
    accounts: Accounts,
}

impl App {
    /// A new app with a new limiter. Must run inside a tokio runtime (fetches are spawned on it).
    pub fn new(settings: &Settings) -> Result<Self, AppError> {
        let accounts: Accounts = Arc::new(ArcSwap::from_pointee(settings.accounts.clone()));
        let limiter = build_limiter(&settings.limiter, Arc::clone(&accounts))?;
        Self::with_limiter(settings, limiter, accounts)
    }

    /// The app for changed settings. The limiter and its counts are kept when its own
    /// settings are unchanged (new account quotas reach held keys at their next refresh);
    /// otherwise a new limiter starts afresh. Returns whether the limiter was kept.
    pub fn reload(&self, settings: &Settings) -> Result<(Self, bool), AppError> {
        if settings.limiter == self.limiter_settings {
            self.accounts.store(Arc::new(settings.accounts.clone()));
            let app = Self::with_limiter(settings, Arc::clone(&self.limiter), Arc::clone(&self.accounts))?;
            Ok((app, true))
        } else {
            Ok((Self::new(settings)?, false))
        }
    }

    fn with_limiter(
        settings: &Settings,
        limiter: Arc<dyn KeyLimiter>,
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

fn build_limiter(settings: &LimiterSettings, accounts: Accounts) -> Result<Arc<dyn KeyLimiter>, QuotaError> {
    match settings.algorithm {
        AlgorithmKind::TokenBucket => keyed(TokenBucket, settings, accounts),
        AlgorithmKind::LeakyBucket => keyed(LeakyBucket::meter(), settings, accounts),
        AlgorithmKind::FixedWindow => keyed(FixedWindow, settings, accounts),
        AlgorithmKind::SlidingWindowLog => keyed(SlidingWindowLog, settings, accounts),
        AlgorithmKind::SlidingWindowCounter => keyed(SlidingWindowCounter, settings, accounts),
    }
}

fn keyed<A: Algorithm>(
    algorithm: A,
    settings: &LimiterSettings,
    accounts: Accounts,
) -> Result<Arc<dyn KeyLimiter>, QuotaError> {
    let latency = settings.fetch_latency;
    // The quota fetch: a look-up in the accounts, after the simulated latency.
    let source = FnSource(move |key: &String| {
        let quota = accounts.load().get(key).copied();
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            FetchResult::Ok(quota)
        }
    });
    let runtime = Handle::current();
    let limiter = KeyedLimiter::builder(algorithm, settings.failsafe)
        .capacity(settings.capacity)
        .unknown_key_quota(settings.unknown)
        .refresh_every(settings.refresh)
        .spawner(move |task| {
            runtime.spawn(task);
        })
        .on_fetch_error(|key: &String, e| tracing::warn!(key = %key, "quota fetch failed: {e}"))
        .source(source)
        .build()?;
    Ok(Arc::new(limiter))
}
