//! TLS on a listener, with rustls and its ring provider: the certificate, key and client CA
//! read from PEM files and read again when they change (a bad new set keeps the running one,
//! logged); under `client_ca` a client must present a certificate it issued, and under
//! `allow` one valid for one of the names given. [`TlsListener`] hands completed handshakes
//! to axum; the main listener calls [`ServerTls::accept`] on each connection itself.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::server::TlsStream;

use crate::config::TlsSettings;
use crate::watch::Watch;

/// The longest a handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once on one [`TlsListener`]; more wait to be accepted.
const MAX_HANDSHAKES: usize = 256;

/// Why a listener's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{path}: {source}", path = path.display())]
    Read {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM of what it should.
    #[error("{path}: {what}", path = path.display())]
    Pem {
        /// Which.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// rustls refused the set (a key that does not match its certificate, ...).
    #[error("{0}")]
    Rustls(String),
}

/// What a listener speaks inside TLS, as ALPN names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// HTTP/1.1: the admin listener, the check API.
    Http1,
    /// HTTP/2: the RLS port's gRPC.
    H2,
    /// Either, as the client prefers: the main listener.
    Http,
}

impl Protocol {
    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Protocol::Http1 => vec![b"http/1.1".to_vec()],
            Protocol::H2 => vec![b"h2".to_vec()],
            Protocol::Http => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
        }
    }
}

/// One listener's TLS, current: what a connection's handshake is made with.
pub(crate) struct ServerTls {
    config: ArcSwap<ServerConfig>,
    /// The client names allowed, if any are named.
    allow: Vec<ServerName<'static>>,
}

/// The files of a listener's TLS, read at once: compared to tell a change.
#[derive(Clone, PartialEq, Eq)]
struct Files(Vec<Vec<u8>>);

impl Files {
    fn read(settings: &TlsSettings) -> Result<Self, TlsError> {
        let mut paths = vec![&settings.cert, &settings.key];
        paths.extend(settings.client_ca.as_ref());
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.clone(),
                source,
            })
        };
        Ok(Self(paths.into_iter().map(read).collect::<Result<_, _>>()?))
    }
}

impl ServerTls {
    /// The TLS of `settings`, read now; with `stop`, a task that reads the files again each
    /// second and takes a changed set once it holds still, until `stop` turns true.
    pub(crate) fn start(
        settings: &TlsSettings,
        protocol: Protocol,
        stop: watch::Receiver<bool>,
    ) -> Result<Arc<Self>, TlsError> {
        let files = Files::read(settings)?;
        let allow = (settings.allow.iter())
            .map(|name| {
                ServerName::try_from(name.clone()).map_err(|e| TlsError::Pem {
                    path: PathBuf::from("allow"),
                    what: format!("{name:?}: {e}"),
                })
            })
            .collect::<Result<_, _>>()?;
        let tls = Arc::new(Self {
            config: ArcSwap::from_pointee(server_config(settings, protocol, &files)?),
            allow,
        });
        tokio::spawn(reload(Arc::clone(&tls), settings.clone(), protocol, files, stop));
        Ok(tls)
    }

    /// Makes the handshake on `stream`: the TLS stream, or why not (logged by the caller at
    /// debug: a client that cannot speak TLS, or is not allowed, is no fault of the server).
    pub(crate) async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.config.load_full());
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        if !self.allow.is_empty() && !self.allowed(&stream) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "client certificate names none of tls.allow",
            ));
        }
        Ok(stream)
    }

    /// Whether the client's certificate is valid for one of the names allowed.
    fn allowed(&self, stream: &TlsStream<TcpStream>) -> bool {
        let Some(leaf) = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
        else {
            return false;
        };
        let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
            return false;
        };
        self.allow
            .iter()
            .any(|name| cert.verify_is_valid_for_subject_name(name).is_ok())
    }
}

/// Reads the files again each second; a changed set that holds still is taken, a bad one
/// logged and the running one kept.
async fn reload(
    tls: Arc<ServerTls>,
    settings: TlsSettings,
    protocol: Protocol,
    running: Files,
    mut stop: watch::Receiver<bool>,
) {
    let mut watch = Watch::new(running, || Files::read(&settings));
    loop {
        let changed = tokio::select! {
            changed = watch.next() => changed,
            () = stopped(&mut stop) => return,
        };
        let applied = changed.and_then(|files| server_config(&settings, protocol, &files));
        match applied {
            Ok(config) => {
                tls.config.store(Arc::new(config));
                tracing::info!(cert = %settings.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => tracing::error!("TLS certificate not reloaded, the running one stays: {e}"),
        }
    }
}

/// Completes when `stop` turns true (or its sender is gone); holds no borrow of it after.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await.map(|_| ());
}

/// The rustls config of `files` (cert, key, client CA if any, in that order).
fn server_config(
    settings: &TlsSettings,
    protocol: Protocol,
    files: &Files,
) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem = |path: &Path, what: &str| TlsError::Pem {
        path: path.to_path_buf(),
        what: what.to_owned(),
    };
    let certs = |path: &Path, bytes: &[u8]| -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs: Vec<_> = CertificateDer::pem_slice_iter(bytes)
            .collect::<Result<_, _>>()
            .map_err(|e| pem(path, &format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(pem(path, "no certificate in it"));
        }
        Ok(certs)
    };
    let chain = certs(&settings.cert, &files.0[0])?;
    let key = PrivateKeyDer::from_pem_slice(&files.0[1])
        .map_err(|e| pem(&settings.key, &format!("no private key in it: {e}")))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Rustls(e.to_string()))?;
    let builder = match (&settings.client_ca, files.0.get(2)) {
        (Some(path), Some(bytes)) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certs(path, bytes)? {
                roots
                    .add(cert)
                    .map_err(|e| pem(path, &format!("not a CA certificate: {e}")))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Rustls(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Rustls(format!("{}: {e}", settings.key.display())))?;
    config.alpn_protocols = protocol.alpn();
    Ok(config)
}

/// A listener whose connections come out of their handshake: what axum serves.
pub(crate) struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` and makes each handshake with `tls` (at most
    /// [`MAX_HANDSHAKES`] at once) until `stop` turns true.
    pub(crate) fn new(
        listener: TcpListener,
        tls: Arc<ServerTls>,
        mut stop: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (ready, handshaken) = mpsc::channel(64);
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(place) = Arc::clone(&handshakes).acquire_owned().await else {
                    return;
                };
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    () = stopped(&mut stop) => return,
                };
                let (tls, ready) = (Arc::clone(&tls), ready.clone());
                tokio::spawn(async move {
                    match tls.accept(stream).await {
                        Ok(stream) => {
                            let _ = ready.send((stream, peer)).await;
                        }
                        Err(e) => tracing::debug!("TLS from {peer}: {e}"),
                    }
                    drop(place);
                });
            }
        });
        Ok(Self { handshaken, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The acceptor stopped: nothing more comes; axum's graceful shutdown ends the serve.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

impl TlsListener {
    /// The connections as tonic serves them (the RLS port).
    pub(crate) fn into_incoming(self) -> TlsIncoming {
        TlsIncoming(self.handshaken)
    }
}

/// The handshaken connections of a [`TlsListener`], as a stream.
pub(crate) struct TlsIncoming(mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>);

impl futures_util::Stream for TlsIncoming {
    type Item = Result<TlsIo, std::io::Error>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0
            .poll_recv(cx)
            .map(|accepted| accepted.map(|(stream, _)| Ok(TlsIo(stream))))
    }
}

/// A TLS connection as tonic takes one (it asks what is known of the peer: nothing more).
pub(crate) struct TlsIo(TlsStream<TcpStream>);

impl tonic::transport::server::Connected for TlsIo {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl tokio::io::AsyncRead for TlsIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TlsIo {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
