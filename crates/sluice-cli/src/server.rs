//! `sluice serve`: HTTP/1.1 with keep-alive and HTTP/2 on hyper, the rate-limit layer in
//! front of `Hello World!` or an upstream, config reload, graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::Request;
use hyper::body::Incoming;
use sluice_http::PeerAddr;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tower_service::Service as _;

use crate::app::App;
use crate::config::Settings;
use crate::connection::{Activity, Connections, Held};
use crate::limits::ConnectionLimit;
use crate::metrics::{HostState, Observed};
use crate::protocols::{Protocols, negotiated, sniff};
use crate::tls::{Protocol, ServerTls, TlsError};
use crate::upstream::{Backend, ConnectionPlace, ServeBody};
use crate::{Stop, StopSignals};

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
    /// The admin listener could not be bound.
    #[error("admin.listen: cannot listen on {addr}: {source}")]
    AdminBind {
        /// The address.
        addr: SocketAddr,
        /// The reason.
        source: std::io::Error,
    },
    /// The limiter or the layer could not be built.
    #[error("{0}")]
    App(#[from] crate::app::AppError),
    /// The rate-limit service could not start.
    #[error("{0}")]
    Service(#[from] crate::service::ServiceError),
    /// A listener's TLS could not be set up.
    #[error("{field}: {source}")]
    Tls {
        /// The config's section (`tls`, `admin.tls`).
        field: &'static str,
        /// Why.
        source: TlsError,
    },
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
pub(crate) fn url_field(redis_url: Option<&str>) -> &'static str {
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
    mut signals: StopSignals,
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
    if let Some(upstream) = &options.settings.upstream {
        let routes: Vec<String> = (upstream.routes.iter())
            .map(|route| format!("{} -> {}", route.prefix, route.url))
            .chain(upstream.default.iter().map(|url| format!("* -> {url}")))
            .collect();
        tracing::info!("forwarding admitted requests: {}", routes.join(", "));
    }
    let connection_limit = ConnectionLimit::new(options.settings.max_connections);
    if connection_limit.exceeds_descriptors() {
        tracing::warn!("{connection_limit}");
    }

    let state = Arc::new(HostState::default());
    (state.metrics_per_domain).store(
        !options.settings.metrics.per_rule,
        std::sync::atomic::Ordering::Relaxed,
    );
    if let Some((file, bytes)) = options.config_file {
        let watch = crate::reload::watch_config(
            file,
            bytes,
            Arc::clone(&app),
            Arc::clone(&state),
            crate::reload::StartOnly::of(&options.settings),
            options.listen.is_some(),
            options.redis_url,
        );
        tokio::spawn(watch);
    }

    let stop = watch::Sender::new(false);
    let tls = (options.settings.tls.as_ref())
        .map(|settings| ServerTls::start(settings, Protocol::Http, stop.subscribe()))
        .transpose()
        .map_err(|e| ServeError::Tls {
            field: "tls",
            source: e,
        })?;
    let admin_tls = (options.settings.admin_tls.as_ref())
        .map(|settings| ServerTls::start(settings, Protocol::Http1, stop.subscribe()))
        .transpose()
        .map_err(|e| ServeError::Tls {
            field: "admin.tls",
            source: e,
        })?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let acceptor = Arc::new(Acceptor {
        app,
        connections: Connections::new(),
        places: Arc::new(Semaphore::new(connection_limit.max)),
        idle_timeout: options.settings.idle_timeout,
        protocols: Arc::new(Protocols::new(
            options.settings.max_header_bytes,
            options.settings.max_headers,
        )),
        stop: stop.clone(),
        drained: watch::Sender::new(false),
        tls,
    });
    // Its lines go to stdout before the one a spawning process waits for.
    let (ready, ready_now) = watch::channel(true);
    let service = crate::service::start(
        &options.settings,
        acceptor.stop.subscribe(),
        shared_port,
        Arc::clone(&state),
        ready_now,
    )
    .await?;
    let observed = Observed {
        app: Arc::clone(&acceptor.app),
        service: service.as_ref().map(|running| Arc::clone(running.engine())),
        state,
        open: acceptor.connections.open(),
        rules_service: match options.settings.service.as_ref().map(|service| &service.rules) {
            Some(crate::config::RulesFrom::Service(remote)) => Some(remote.source.clone()),
            _ => None,
        },
    };
    // Says the process is stopping, at once, to the gRPC health service.
    let draining = watch::Sender::new(false);
    // Only the RLS port's gRPC health service reads it (`/readyz` checks when asked).
    if options
        .settings
        .service
        .as_ref()
        .is_some_and(|service| service.rls.is_some())
    {
        crate::admin::watch_readiness(
            observed.clone(),
            ready,
            draining.subscribe(),
            acceptor.stop.subscribe(),
        );
    }
    if let Some(addr) = options.settings.admin {
        let admin = bind_first(addr, false).map_err(|source| ServeError::AdminBind { addr, source })?;
        let admin_bound = admin
            .local_addr()
            .map_err(|source| ServeError::AdminBind { addr, source })?;
        let mut stdout = std::io::stdout().lock();
        let admin_scheme = if admin_tls.is_some() { "https" } else { "http" };
        let _ = writeln!(stdout, "admin listening on {admin_scheme}://{admin_bound}/");
        let _ = stdout.flush();
        drop(stdout);
        tracing::info!(bound = %admin_bound, "admin: /metrics /healthz /readyz /v1/top /ui");
        crate::admin::serve(observed.clone(), admin, admin_tls, acceptor.stop.subscribe());
    }
    let workers = (1..threads)
        .map(|i| spawn_worker(i, bound, Arc::clone(&acceptor), service.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ServeError::Bind { addr: bound, source })?;

    // The one line a spawning process waits for; logs go to stderr.
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening on {scheme}://{bound}");
    let _ = stdout.flush();
    drop(stdout);
    tracing::info!(%bound, threads, "serving; {connection_limit}");

    let accept = acceptor.accept(listener);
    tokio::pin!(accept);
    let signal = tokio::select! {
        () = &mut accept => None,
        signal = signals.next() => Some(signal),
    };
    let (drain_delay, shutdown_timeout) = (options.settings.drain_delay, options.settings.shutdown_timeout);
    if signal == Some(Stop::Terminate) && !drain_delay.is_zero() {
        // Not ready from now on, while still accepting: load balancers and Envoy see it and
        // send elsewhere before anything is refused.
        observed
            .state
            .draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        draining.send_replace(true);
        tracing::info!(
            "SIGTERM: not ready; still accepting for {drain_delay:?}, then finishing in-flight requests"
        );
        tokio::select! {
            () = &mut accept => {}
            () = tokio::time::sleep(drain_delay) => {}
            second = signals.next() => exit_now(second),
        }
    }
    acceptor.stop.send_replace(true);
    let connections = &acceptor.connections;
    tracing::info!(
        connections = connections.count(),
        "shutting down: finishing in-flight requests"
    );
    tokio::select! {
        () = connections.shutdown() => tracing::info!("shut down"),
        () = tokio::time::sleep(shutdown_timeout) => tracing::warn!("shut down with requests still in flight after {shutdown_timeout:?}"),
        second = signals.next() => exit_now(second),
    }
    acceptor.drained.send_replace(true);
    for worker in workers {
        if worker.join().is_err() {
            tracing::error!("a serving thread panicked");
        }
    }
    Ok(())
}

/// A second stop signal: the process exits now, whatever is in flight.
fn exit_now(signal: Stop) -> ! {
    tracing::warn!("{signal:?} again: exiting now");
    std::process::exit(signal.exit_code())
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
pub(crate) fn bind_first(addr: SocketAddr, shared_port: bool) -> std::io::Result<TcpListener> {
    if shared_port && addr.port() != 0 {
        drop(bind(addr, false)?);
    }
    bind(addr, shared_port)
}

/// A listener on `addr`; one of several on the same port when `shared_port`.
pub(crate) fn bind(addr: SocketAddr, shared_port: bool) -> std::io::Result<TcpListener> {
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
    service: Option<crate::service::Running>,
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
                let mut stop = acceptor.stop.subscribe();
                let listener = bind(bound, true).and_then(|listener| {
                    if let Some(service) = &service {
                        service.serve_here(&stop)?;
                    }
                    Ok(listener)
                });
                let listener = match listener {
                    Ok(listener) => listener,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
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
    /// One permit per connection that may be served at once (`max_connections`).
    places: Arc<Semaphore>,
    idle_timeout: Duration,
    /// How connections are served, in the HTTP each speaks.
    protocols: Arc<Protocols>,
    /// Set when the server stops accepting.
    stop: watch::Sender<bool>,
    /// Set when the connections are drained (or the drain timed out).
    drained: watch::Sender<bool>,
    /// TLS on the listener (`tls:`), if configured.
    tls: Option<Arc<ServerTls>>,
}

impl Acceptor {
    /// Accepts connections on `listener` and serves each on this thread's runtime, at most
    /// `max_connections` at once over every thread.
    ///
    /// At the limit a thread holds the connection it has just accepted, unserved, until a
    /// place frees, and accepts no other meanwhile: further clients wait in the kernel's
    /// listen backlog (then their SYNs are dropped and retried), costing this process nothing.
    /// Each thread holds at most one such connection; it takes the place before accepting
    /// again, so a freed place never goes to a thread whose listener has no client waiting
    /// (the kernel spreads clients over the threads' listeners).
    async fn accept(&self, listener: TcpListener) {
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
            let place = match Arc::clone(&self.places).try_acquire_owned() {
                Ok(place) => place,
                Err(_) => {
                    tracing::debug!("at max_connections: {peer} waits for a place");
                    match Arc::clone(&self.places).acquire_owned().await {
                        Ok(place) => place,
                        // Never closed; were it, no connection could be served.
                        Err(_) => return,
                    }
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
                place: Arc::new(place),
            };
            let (tls, protocols, connections, idle_timeout) = (
                self.tls.clone(),
                Arc::clone(&self.protocols),
                self.connections.clone(),
                self.idle_timeout,
            );
            let admitted = connections.admit();
            // The first bytes or the handshake on the connection's own task, so a slow one
            // holds up no other; a stop drops a connection still at that stage.
            tokio::spawn(async move {
                let served = match tls {
                    None => {
                        let sniffed = tokio::select! {
                            sniffed = sniff(&stream, idle_timeout) => sniffed,
                            () = connections.stopping() => return,
                        };
                        match sniffed {
                            Ok(speaks) => {
                                let connection = protocols.serve(stream, speaks, handler);
                                connections
                                    .serve(admitted, connection, activity, idle_timeout)
                                    .await
                            }
                            Err(e) => return tracing::debug!("connection from {peer}: {e}"),
                        }
                    }
                    Some(tls) => {
                        let handshake = tokio::select! {
                            handshake = tls.accept(stream) => handshake,
                            () = connections.stopping() => return,
                        };
                        match handshake {
                            Ok(stream) => {
                                let speaks = negotiated(&stream);
                                let connection = protocols.serve(stream, speaks, handler);
                                connections
                                    .serve(admitted, connection, activity, idle_timeout)
                                    .await
                            }
                            Err(e) => return tracing::debug!("TLS from {peer}: {e}"),
                        }
                    }
                };
                if let Err(e) = served {
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
    /// The connection's place under `max_connections`, kept by a tunnel it upgrades to.
    place: Arc<OwnedSemaphorePermit>,
}

type Body = ServeBody;

impl hyper::service::Service<Request<Incoming>> for Handler {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Answering;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        self.activity.started();
        let app = self.app.load();
        if app.needs_peer {
            request.extensions_mut().insert(PeerAddr(self.peer));
        }
        if app.proxying && request.headers().contains_key(http::header::UPGRADE) {
            request
                .extensions_mut()
                .insert(ConnectionPlace(Arc::clone(&self.place)));
        }
        // Only when traces are exported: the request's span, the decision's parent.
        let span = crate::traces::on()
            .then(|| crate::traces::request_span(request.method().as_str(), request.headers()));
        let mut service = app.service.clone();
        if app.proxying {
            service.get_mut().serving(self.peer.ip());
        }
        let future = match &span {
            None => service.call(request),
            Some(span) => span.in_scope(|| service.call(request)),
        };
        // Answered now unless the limiter holds it or an upstream answers: only then can the
        // answer take longer than the idle timeout, and only then is the activity carried
        // along (into the upstream's body, until it is written).
        let held = if future.is_held() || app.proxying {
            Some(Held::new(&self.activity))
        } else {
            self.activity.answered();
            None
        };
        Answering { future, held, span }
    }
}

pin_project_lite::pin_project! {
    /// A request's answer, with the mark of a request the limiter holds.
    struct Answering {
        #[pin]
        future: sluice_http::ResponseFuture<Backend, Incoming, Body>,
        held: Option<Held>,
        span: Option<tracing::Span>,
    }
}

impl Future for Answering {
    type Output = Result<http::Response<Body>, Infallible>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut answer = match this.span {
            None => this.future.poll(cx),
            Some(span) => span.in_scope(|| this.future.poll(cx)),
        };
        if let Poll::Ready(Ok(response)) = &mut answer
            && let Some(held) = this.held.take()
        {
            response.body_mut().hold(held);
        }
        answer
    }
}
