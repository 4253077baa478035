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
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
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

/// Serves on `threads` threads until `shutdown` completes, then drains in-flight requests.
///
/// Each thread runs its own single-threaded runtime with its own listener on the address
/// (`SO_REUSEPORT`: the kernel spreads new connections over them), like one event loop per
/// core; a connection stays on the thread that accepted it. A shared multi-threaded runtime
/// would wake idle workers across cores on every burst of readiness, which measured as more
/// CPU per request (docs/BENCHMARKS.md). This thread, the first, also runs the config watcher
/// and the quota fetches.
pub async fn serve(
    options: ServeOptions,
    threads: usize,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let addr = options.listen.unwrap_or(options.settings.listen);
    let shared_port = threads > 1 && REUSE_PORT;
    let threads = if shared_port { threads } else { 1 };
    let listener = bind_first(addr, shared_port).map_err(|source| ServeError::Bind { addr, source })?;
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

    let acceptor = Arc::new(Acceptor {
        app,
        connections: Connections::new(),
        idle_timeout: options.settings.idle_timeout,
        stop: watch::Sender::new(false),
        drained: watch::Sender::new(false),
    });
    let workers = (1..threads)
        .map(|i| spawn_worker(i, bound, Arc::clone(&acceptor)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ServeError::Bind { addr: bound, source })?;

    // The one line a spawning process waits for; logs go to stderr.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening on http://{bound}");
    let _ = stdout.flush();
    drop(stdout);
    tracing::info!(%bound, threads, "serving");

    tokio::select! {
        () = acceptor.accept(listener) => {}
        () = shutdown => {}
    }
    acceptor.stop.send_replace(true);
    let connections = &acceptor.connections;
    tracing::info!(
        connections = connections.count(),
        "shutting down: finishing in-flight requests"
    );
    tokio::select! {
        () = connections.shutdown() => tracing::info!("shut down"),
        () = tokio::time::sleep(DRAIN_TIMEOUT) => tracing::warn!("shut down with requests still in flight after {DRAIN_TIMEOUT:?}"),
    }
    acceptor.drained.send_replace(true);
    for worker in workers {
        if worker.join().is_err() {
            tracing::error!("a serving thread panicked");
        }
    }
    Ok(())
}

/// Compiles the block it is given only where listeners can share a port (`SO_REUSEPORT`):
/// the one place that names those platforms.
macro_rules! where_port_is_shareable {
    ($body:block) => {
        #[cfg(all(
            unix,
            not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
        ))]
        $body
    };
}

/// Whether listeners can share a port here (`SO_REUSEPORT`); without it, one thread serves.
#[allow(unused_mut, unused_assignments)] // the value is replaced where the port is shareable
const REUSE_PORT: bool = {
    let mut shareable = false;
    where_port_is_shareable!({
        shareable = true;
    });
    shareable
};

/// The first listener on `addr`. A port other processes may share (`SO_REUSEPORT`) is first
/// bound once without the option, so a port already in use, even by another server that set
/// it too, is an error rather than silently shared.
fn bind_first(addr: SocketAddr, shared_port: bool) -> std::io::Result<TcpListener> {
    if shared_port && addr.port() != 0 {
        drop(bind(addr, false)?);
    }
    bind(addr, shared_port)
}

/// A listener on `addr`; one of several on the same port when `shared_port`.
fn bind(addr: SocketAddr, shared_port: bool) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    where_port_is_shareable!({
        if shared_port {
            socket.set_reuseport(true)?;
        }
    });
    let _ = shared_port; // read only where the port is shareable
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Starts serving thread `i` with its own runtime and listener on `bound`; returns once the
/// listener is bound (or could not be).
fn spawn_worker(
    i: usize,
    bound: SocketAddr,
    acceptor: Arc<Acceptor>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name(format!("sluice-serve-{i}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let runtime = match runtime {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match bind(bound, true) {
                    Ok(listener) => listener,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut stop = acceptor.stop.subscribe();
                tokio::select! {
                    () = acceptor.accept(listener) => {}
                    _ = stop.wait_for(|stop| *stop) => {}
                }
                // Keep running this thread's connections until the drain is over.
                let mut drained = acceptor.drained.subscribe();
                let _ = drained.wait_for(|drained| *drained).await;
            });
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(worker),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::other(
            "a serving thread ended before it was ready",
        )),
    }
}

/// What every serving thread shares.
struct Acceptor {
    app: Arc<ArcSwap<App>>,
    connections: Connections,
    idle_timeout: Duration,
    /// Set when the server stops accepting.
    stop: watch::Sender<bool>,
    /// Set when the connections are drained (or the drain timed out).
    drained: watch::Sender<bool>,
}

impl Acceptor {
    /// Accepts connections on `listener` and serves each on this thread's runtime.
    async fn accept(&self, listener: TcpListener) {
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            // Slow or silent clients are closed by the idle check (`connection.rs`), which
            // costs nothing per request; hyper's header timer would be armed for each one.
            .header_read_timeout(None)
            .keep_alive(true)
            .pipeline_flush(false);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors and the like: wait a little rather than spin.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!("TCP_NODELAY on {peer}: {e}");
            }
            let activity = Arc::new(Activity::default());
            let handler = Handler {
                app: Arc::clone(&self.app),
                peer,
                activity: Arc::clone(&activity),
            };
            let connection = self.connections.serve(
                builder.serve_connection(TokioIo::new(stream), handler),
                activity,
                self.idle_timeout,
            );
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!("connection from {peer}: {e}");
                }
            });
        }
    }
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
