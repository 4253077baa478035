//! The rate-limit service inside `sluice serve`: one engine on the config's descriptor rules,
//! asked over RLS v3 gRPC (`rls.listen`, with Envoy's RLQS beside it on `rls.rlqs`) and the
//! HTTP check API (`api.listen`), and a watcher that reloads the rules when their files
//! change, or polls the rules service for them, keeping every counter.

use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use sluice_descriptors::{LoadOptions, RuleSet};

use crate::tls::{Protocol, ServerTls, TlsListener};
use sluice_rules_client::{DEFAULT_MAX_BYTES, Fetched, PollError, Snapshot, SnapshotError};
use sluice_service::rlqs::QuotaService;
use sluice_service::{CheckApi, Engine, EngineSettings, RateLimitService, RedisCounters};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::RedisBackendError;
use crate::config::{RulesFrom, RulesService, Settings};
use crate::metrics::HostState;
use crate::watch::{Watch, contents};

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The engine refused a setting or a rule.
    #[error("rules: {0}")]
    Engine(#[from] sluice_service::EngineError),
    /// The `redis:` section names no server.
    #[error("redis.url: not set (give it or redis.cluster in the config, or --redis URL)")]
    NoRedisUrl,
    /// Redis could not be used at start-up.
    #[error("redis: {0}")]
    Redis(sluice_redis::SetupError),
    /// The rules service could not be asked at start-up and there is no snapshot to start from.
    #[error(
        "rules.url: {url} cannot give the rules ({fetch}) and there is no snapshot to start from ({snapshot})"
    )]
    NoRules {
        /// The rules service.
        url: String,
        /// Why it gave none.
        fetch: Box<dyn std::error::Error + Send + Sync>,
        /// Why the snapshot could not be used.
        snapshot: Box<SnapshotError>,
    },
    /// A listener's TLS could not be set up.
    #[error("{field}: {source}")]
    Tls {
        /// `api.tls`.
        field: &'static str,
        /// Why.
        source: crate::tls::TlsError,
    },
    /// A listener could not be bound.
    #[error("{field}: cannot listen on {addr}: {source}")]
    Bind {
        /// `rls.listen` or `api.listen`.
        field: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The service once started: its engine and the addresses its listeners are bound to, which
/// every other serving thread shares ([`Running::serve_here`]).
#[derive(Clone)]
pub struct Running {
    engine: Arc<Engine>,
    /// The host's readiness, which the gRPC health service reports.
    ready: watch::Receiver<bool>,
    rls: Option<SocketAddr>,
    api: Option<SocketAddr>,
    /// TLS on the check API (`api.tls`).
    api_tls: Option<Arc<ServerTls>>,
    /// TLS on the RLS port (`rls.tls`).
    rls_tls: Option<Arc<ServerTls>>,
    /// RLQS on the RLS port (`rls.rlqs`): one service, so one set of buckets, for every
    /// serving thread. A client's share is the process's to give, whichever thread its
    /// stream landed on.
    rlqs: Option<QuotaService>,
}

/// Starts the service's listeners and rules watcher on this runtime, if the config has rules.
/// Prints `rls listening on ADDR` and `api listening on http://ADDR/` to stdout for each
/// listener bound; with `shared_port`, other threads may bind the same ports
/// ([`Running::serve_here`]). Everything stops when `stop` turns true, RLQS streams too.
pub async fn start(
    settings: &Settings,
    stop: watch::Receiver<bool>,
    shared_port: bool,
    state: Arc<HostState>,
    ready: watch::Receiver<bool>,
) -> Result<Option<Running>, ServiceError> {
    let Some(service) = &settings.service else {
        return Ok(None);
    };
    let engine_settings = EngineSettings {
        algorithm: settings.limiter.algorithm,
        counting: service.counting,
        headers: service.headers,
        shadow: service.answers.shadow,
        quota_mode: service.answers.quota_mode,
        dynamic_metadata: service.answers.dynamic_metadata,
        counters: sluice_service::CounterSettings {
            capacity: settings.limiter.capacity,
            ..sluice_service::CounterSettings::default()
        },
        denied_log_per_second: settings.limiter.denied_log,
        observe: settings.limiter.observe,
        trace_keys: settings.otlp.as_ref().is_some_and(|otlp| otlp.keys),
        ..EngineSettings::default()
    };
    let build = async |rules: RuleSet| -> Result<Engine, ServiceError> {
        match &settings.limiter.redis {
            None => Ok(Engine::new(rules, engine_settings.clone())?),
            Some(redis) => {
                let store = crate::app::connect_redis(redis).await.map_err(|e| match e {
                    RedisBackendError::NoUrl => ServiceError::NoRedisUrl,
                    RedisBackendError::Redis(e) => ServiceError::Redis(e),
                })?;
                let counters = RedisCounters {
                    policy: redis.policy,
                    hosts: redis.hosts,
                    // The demo's limits use the prefix itself: the rules' counters keep apart.
                    prefix: format!("{}:descriptors", redis.prefix),
                    ..RedisCounters::new(store)
                };
                Ok(Engine::on_redis(rules, engine_settings.clone(), counters)?)
            }
        }
    };
    let (engine, held) = match &service.rules {
        RulesFrom::Files { loaded, .. } => (build(loaded.0.clone()).await?, None),
        RulesFrom::Service(remote) => first_rules(remote, build, &state).await?,
    };
    let engine = Arc::new(engine);
    let rlqs = (service.rlqs && service.rls.is_some()).then(|| {
        let rlqs = QuotaService::bounded(
            Arc::clone(&engine),
            sluice_service::rlqs::QuotaBounds {
                servers: service.rlqs_servers,
                ..sluice_service::rlqs::QuotaBounds::default()
            },
        )
        .stopping(stop.clone());
        // Read by the admin listener's metrics.
        let _ = state.rlqs.set(Arc::clone(rlqs.quotas()));
        rlqs
    });
    let mut running = Running {
        engine,
        ready,
        rls: None,
        api: None,
        api_tls: (service.api_tls.as_ref())
            .map(|tls| ServerTls::start(tls, Protocol::Http1, stop.clone()))
            .transpose()
            .map_err(|source| ServiceError::Tls {
                field: "api.tls",
                source,
            })?,
        rls_tls: (service.rls_tls.as_ref())
            .map(|tls| ServerTls::start(tls, Protocol::H2, stop.clone()))
            .transpose()
            .map_err(|source| ServiceError::Tls {
                field: "rls.tls",
                source,
            })?,
        rlqs,
    };
    let mut stdout = std::io::stdout().lock();
    if let Some(addr) = service.rls {
        let (listener, bound) = bind("rls.listen", addr, shared_port)?;
        let _ = writeln!(stdout, "rls listening on {bound}");
        serve_rls(
            &running.engine,
            listener,
            running.rls_tls.clone(),
            running.rlqs.clone(),
            &running.ready,
            stop.clone(),
        );
        running.rls = Some(bound);
        if running.rlqs.is_some() {
            tracing::info!(%bound, "rate-limit service (Envoy RLS v3 and RLQS, gRPC)");
        } else {
            tracing::info!(%bound, "rate-limit service (Envoy RLS v3, gRPC)");
        }
    }
    if let Some(addr) = service.api {
        let (listener, bound) = bind("api.listen", addr, shared_port)?;
        let scheme = if running.api_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let _ = writeln!(stdout, "api listening on {scheme}://{bound}/");
        serve_api(&running.engine, listener, running.api_tls.clone(), stop.clone());
        running.api = Some(bound);
        tracing::info!(%bound, "check API (POST /v1/check)");
    }
    let _ = stdout.flush();
    drop(stdout);
    let engine = Arc::clone(&running.engine);
    match &service.rules {
        RulesFrom::Files { path, options, .. } => {
            tokio::spawn(watch_files(path.clone(), *options, engine, state, stop));
        }
        RulesFrom::Service(remote) => {
            tokio::spawn(poll_service(
                RulesService::clone(remote),
                held,
                engine,
                state,
                stop,
            ));
        }
    }
    Ok(Some(running))
}

impl Running {
    /// The service's engine.
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Serves the service on this thread's runtime too, on listeners sharing the ports
    /// [`start`] bound (`SO_REUSEPORT`: the kernel spreads connections over the threads).
    pub fn serve_here(&self, stop: &watch::Receiver<bool>) -> std::io::Result<()> {
        if let Some(addr) = self.rls {
            serve_rls(
                &self.engine,
                crate::server::bind(addr, true)?,
                self.rls_tls.clone(),
                self.rlqs.clone(),
                &self.ready,
                stop.clone(),
            );
        }
        if let Some(addr) = self.api {
            serve_api(
                &self.engine,
                crate::server::bind(addr, true)?,
                self.api_tls.clone(),
                stop.clone(),
            );
        }
        Ok(())
    }
}

/// Serves RLS (and `rlqs`, whose clones share its buckets) on `listener` until `stop`.
fn serve_rls(
    engine: &Arc<Engine>,
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    rlqs: Option<QuotaService>,
    ready: &watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) {
    let mut rls = RateLimitService::new(Arc::clone(engine)).reporting(ready.clone());
    if crate::traces::on() {
        rls = rls.traced(crate::traces::request_span);
    }
    if let Some(rlqs) = rlqs {
        rls = rls.with_quotas(rlqs);
    }
    tokio::spawn(async move {
        let served = match tls {
            None => rls.serve(listener, stopped(stop)).await,
            Some(tls) => match TlsListener::new(listener, tls, stop.clone()) {
                Ok(listener) => rls.serve_incoming(listener.into_incoming(), stopped(stop)).await,
                Err(e) => {
                    tracing::error!("rls: {e}");
                    return;
                }
            },
        };
        if let Err(e) = served {
            tracing::error!("rls: {e}");
        }
    });
}

fn serve_api(
    engine: &Arc<Engine>,
    listener: TcpListener,
    tls: Option<Arc<ServerTls>>,
    stop: watch::Receiver<bool>,
) {
    let mut routes = CheckApi::new(Arc::clone(engine)).router();
    if crate::traces::on() {
        routes = routes.layer(crate::traces::RequestSpans("POST /v1/check"));
    }
    tokio::spawn(async move {
        let served = match tls {
            None => {
                axum::serve(listener, routes)
                    .with_graceful_shutdown(stopped(stop))
                    .await
            }
            Some(tls) => match TlsListener::new(listener, tls, stop.clone()) {
                Ok(listener) => {
                    axum::serve(listener, routes)
                        .with_graceful_shutdown(stopped(stop))
                        .await
                }
                Err(e) => Err(e),
            },
        };
        if let Err(e) = served {
            tracing::error!("api: {e}");
        }
    });
}

/// The first listener of `field` on `addr`, and the address it is bound to.
fn bind(
    field: &'static str,
    addr: SocketAddr,
    shared_port: bool,
) -> Result<(TcpListener, SocketAddr), ServiceError> {
    let error = |source| ServiceError::Bind { field, addr, source };
    let listener = crate::server::bind_first(addr, shared_port).map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}

/// Completes when `stop` turns true (or its sender is gone).
async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Reloads the rules when their files change and hold still; a bad set is logged once and the
/// running rules stay.
async fn watch_files(
    path: PathBuf,
    options: LoadOptions,
    engine: Arc<Engine>,
    state: Arc<HostState>,
    stop: watch::Receiver<bool>,
) {
    // What the running rules were loaded from: coming back to it needs no reload.
    let mut applied = contents(&path);
    let mut watch = Watch::new(applied.clone(), || Ok::<_, Infallible>(contents(&path)));
    let stopped = stopped(stop);
    tokio::pin!(stopped);
    loop {
        let Ok(now) = tokio::select! {
            () = &mut stopped => return,
            now = watch.next() => now,
        };
        if now == applied {
            continue;
        }
        match RuleSet::load_with(&path, options) {
            Ok(rules) => {
                let count = rules.len();
                match engine.reload(rules) {
                    Ok(kept) => {
                        state.rules_reloads.fetch_add(1, Relaxed);
                        tracing::info!(
                            rules = count,
                            kept = kept.moved,
                            dropped = kept.dropped,
                            "rules reloaded; counters kept"
                        );
                    }
                    Err(e) => {
                        state.rules_reloads_failed.fetch_add(1, Relaxed);
                        tracing::error!("rules not reloaded: {e}");
                    }
                }
                applied = now;
            }
            Err(e) => {
                state.rules_reloads_failed.fetch_add(1, Relaxed);
                tracing::error!("rules not reloaded, the running rules stay: {e}");
            }
        }
    }
}

/// The engine on the rules service's rules, and the revision they are at; when the service
/// cannot give them (down, garbage, rules the engine refuses), on the snapshot's.
async fn first_rules(
    remote: &RulesService,
    build: impl AsyncFn(RuleSet) -> Result<Engine, ServiceError>,
    state: &HostState,
) -> Result<(Engine, Option<u64>), ServiceError> {
    let failed: Box<dyn std::error::Error + Send + Sync> = match remote.source.fetch(None).await {
        Ok(Fetched::Changed(mut fetched)) => {
            let revision = fetched.revision;
            match build(std::mem::take(&mut fetched.rules)).await {
                Ok(engine) => {
                    save(&fetched, &remote.snapshot);
                    tracing::info!(url = %remote.url, revision, "rules fetched from the rules service");
                    state.rules_revision.store(revision, Relaxed);
                    return Ok((engine, Some(revision)));
                }
                Err(ServiceError::Engine(e)) => Box::new(e),
                Err(other) => return Err(other),
            }
        }
        Ok(Fetched::Unchanged) => Box::new(PollError::Http("304 to a first request".into())),
        Err(e) => Box::new(e),
    };
    let kept =
        Snapshot::load(&remote.snapshot, DEFAULT_MAX_BYTES).map_err(|snapshot| ServiceError::NoRules {
            url: remote.url.clone(),
            fetch: failed.to_string().into(),
            snapshot: Box::new(snapshot),
        })?;
    tracing::warn!(
        url = %remote.url,
        snapshot = %remote.snapshot.display(),
        revision = kept.revision,
        "the rules service gave no rules ({failed}); starting from the snapshot"
    );
    let revision = kept.revision;
    let engine = build(kept.rules).await?;
    state.rules_revision.store(revision, Relaxed);
    state.rules_from_snapshot.store(true, Relaxed);
    state.rules_service_down.store(true, Relaxed);
    Ok((engine, Some(revision)))
}

/// Keeps the last good rules on disk; a failure is logged and the host goes on.
fn save(snapshot: &Snapshot, path: &Path) {
    if let Err(e) = snapshot.save(path) {
        tracing::warn!("rules snapshot not written: {e}");
    }
}

/// Asks the rules service every `poll` for a change (a 304 while there is none) and applies
/// one without resetting any counter. While the service is down or answers garbage, the
/// running rules stay and that is logged once per outage; a set the engine refuses is logged
/// once per revision.
async fn poll_service(
    remote: RulesService,
    mut held: Option<u64>,
    engine: Arc<Engine>,
    state: Arc<HostState>,
    stop: watch::Receiver<bool>,
) {
    let mut outage = false;
    let stopped = stopped(stop);
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            () = &mut stopped => return,
            () = tokio::time::sleep(remote.poll) => {}
        }
        let fetched = match remote.source.fetch(held).await {
            Ok(fetched) => fetched,
            Err(e) => {
                state.rules_service_down.store(true, Relaxed);
                if !outage {
                    state.rules_reloads_failed.fetch_add(1, Relaxed);
                    tracing::warn!(
                        url = %remote.url,
                        revision = held,
                        "rules service: {e}; the running rules stay, polling on"
                    );
                    outage = true;
                }
                continue;
            }
        };
        state.rules_service_down.store(false, Relaxed);
        if outage {
            tracing::info!(url = %remote.url, "rules service answers again");
            outage = false;
        }
        let Fetched::Changed(mut fetched) = fetched else {
            continue;
        };
        let revision = fetched.revision;
        let count = fetched.rules.len();
        // Asked with this revision from now on: a refused set is not fetched again.
        held = Some(revision);
        match engine.reload(std::mem::take(&mut fetched.rules)) {
            Ok(kept) => {
                state.rules_reloads.fetch_add(1, Relaxed);
                state.rules_revision.store(revision, Relaxed);
                state.rules_from_snapshot.store(false, Relaxed);
                tracing::info!(
                    revision,
                    rules = count,
                    kept = kept.moved,
                    dropped = kept.dropped,
                    "rules from the rules service applied; counters kept"
                );
                save(&fetched, &remote.snapshot);
            }
            Err(e) => {
                state.rules_reloads_failed.fetch_add(1, Relaxed);
                tracing::error!(revision, "rules refused, the running rules stay: {e}");
            }
        }
    }
}
