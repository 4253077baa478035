//! `sluice serve`: HTTP/1.1 with keep-alive on hyper, the rate-limit layer in front of
//! `Hello World!`, config reload, graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use sluice_http::PeerAddr;
use tokio::net::TcpListener;
use tower_service::Service as _;

use crate::app::{App, Hello};
use crate::config::{self, Settings};
use crate::connection::{Activity, Connections};

/// How long in-flight requests may take to finish after a shutdown signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the config file is looked at.
const RELOAD_POLL: Duration = Duration::from_secs(1);

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listen address could not be bound.
    #[error("listen {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The reason.
        source: std::io::Error,
    },
    /// The limiter or the layer could not be built.
    #[error("{0}")]
    App(#[from] crate::app::AppError),
}

/// What the server runs with.
pub struct ServeOptions {
    /// The checked config.
    pub settings: Settings,
    /// The file it came from and the bytes read from it, watched for changes (none for the
    /// built-in demo).
    pub config_file: Option<(PathBuf, Vec<u8>)>,
    /// Overrides the config's listen address (and makes reloads ignore it).
    pub listen: Option<SocketAddr>,
    /// Sets or overrides the config's Redis URL (`--redis`), on reloads too.
    pub redis_url: Option<String>,
}

/// Where the Redis URL comes from, for errors.
fn url_field(redis_url: Option<&str>) -> &'static str {
    if redis_url.is_some() {
        "--redis"
    } else {
        "redis.url"
    }
}

/// Serves until `shutdown` completes, then drains in-flight requests.
pub async fn serve(options: ServeOptions, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let addr = options.listen.unwrap_or(options.settings.listen);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })?;
    let field = url_field(options.redis_url.as_deref());
    let app = Arc::new(ArcSwap::from_pointee(App::new(&options.settings, field).await?));

    if let Some((file, bytes)) = options.config_file {
        let fixed_listen = options.listen.is_some();
        let watch = watch_config(
            file,
            bytes,
            Arc::clone(&app),
            options.settings.listen,
            fixed_listen,
            options.redis_url,
        );
        tokio::spawn(watch);
    }

    // The one line a spawning process waits for; logs go to stderr.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening on http://{bound}");
    let _ = stdout.flush();
    drop(stdout);
    tracing::info!(%bound, "serving");

    let idle_timeout = options.settings.idle_timeout;
    let connections = Connections::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        // Slow or silent clients are closed by the idle check (`connection.rs`), which costs
        // nothing per request; hyper's header timer would be armed for each one.
        .header_read_timeout(None)
        .keep_alive(true)
        .pipeline_flush(false);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on {peer}: {e}");
        }
        let activity = Arc::new(Activity::default());
        let handler = Handler {
            app: Arc::clone(&app),
            peer,
            activity: Arc::clone(&activity),
        };
        let connection = connections.serve(
            builder.serve_connection(TokioIo::new(stream), handler),
            activity,
            idle_timeout,
        );
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
    drop(listener);
    tracing::info!(
        connections = connections.count(),
        "shutting down: finishing in-flight requests"
    );
    tokio::select! {
        () = connections.shutdown() => tracing::info!("shut down"),
        () = tokio::time::sleep(DRAIN_TIMEOUT) => tracing::warn!("shut down with requests still in flight after {DRAIN_TIMEOUT:?}"),
    }
    Ok(())
}

/// Serves one connection's requests through the current app.
#[derive(Clone)]
struct Handler {
    app: Arc<ArcSwap<App>>,
    peer: SocketAddr,
    activity: Arc<Activity>,
}

type Body = http_body_util::Full<bytes::Bytes>;

impl hyper::service::Service<Request<Incoming>> for Handler {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = sluice_http::ResponseFuture<Hello, Incoming, Body>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        self.activity.started();
        let app = self.app.load();
        if app.needs_peer {
            request.extensions_mut().insert(PeerAddr(self.peer));
        }
        app.service.clone().call(request)
    }
}

/// Polls the config file; applies a good edit, keeps the running config on a bad one.
async fn watch_config(
    file: PathBuf,
    running: Vec<u8>,
    app: Arc<ArcSwap<App>>,
    mut listen: SocketAddr,
    fixed_listen: bool,
    redis_url: Option<String>,
) {
    // Compared with what was actually parsed at start, so an edit made meanwhile is seen.
    let mut last = Some(running);
    let mut interval = tokio::time::interval(RELOAD_POLL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let bytes = match std::fs::read(&file) {
            Ok(bytes) => bytes,
            Err(e) => {
                if last.take().is_some() {
                    tracing::warn!(
                        "{}: cannot read ({e}); keeping the running config",
                        file.display()
                    );
                }
                continue;
            }
        };
        if last.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        last = Some(bytes.clone());
        let parsed = config::parse_bytes(&bytes).and_then(|settings| match &redis_url {
            Some(url) => config::with_redis_url(settings, url),
            None => Ok(settings),
        });
        let settings = match parsed {
            Ok(settings) => settings,
            Err(e) => {
                tracing::error!("{}: {e}; keeping the running config", file.display());
                continue;
            }
        };
        let reloaded = app
            .load()
            .reload(&settings, url_field(redis_url.as_deref()))
            .await;
        match reloaded {
            Ok((next, kept)) => {
                app.store(Arc::new(next));
                if !kept {
                    tracing::warn!("limiter settings changed: counts start afresh");
                }
                tracing::info!("{}: config reloaded", file.display());
            }
            Err(e) => {
                tracing::error!("{}: {e}; keeping the running config", file.display());
                continue;
            }
        }
        if settings.listen != listen && !fixed_listen {
            tracing::warn!(
                "{}: listen changed to {}; the server keeps its address until restarted",
                file.display(),
                settings.listen
            );
            listen = settings.listen;
        }
    }
}
