//! The connections to upstreams: TCP, with TLS for `https://` (trusting `client_tls`), made
//! within the connect timeout (and kept alive in `pool`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sluice_config::UpstreamUrl;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Makes upstream connections for the pool.
#[derive(Clone)]
pub struct Connector {
    /// How `https://` upstreams are spoken to.
    pub tls: Arc<rustls::ClientConfig>,
    /// The longest a connection (and its TLS handshake) may take.
    pub timeout: Duration,
}

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The pool was not built for this upstream (the proxy builds it from every configured
    /// upstream: never).
    #[error("no connections are kept for {0}")]
    Unknown(String),
    /// Not made within the connect timeout.
    #[error("no connection within {0:?}")]
    TimedOut(Duration),
    /// Refused, unreachable, not resolved, or the TLS handshake failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl Connector {
    /// A new connection to `upstream`, within the connect timeout.
    pub async fn connect(&self, upstream: &UpstreamUrl) -> Result<UpstreamStream, ConnectError> {
        match tokio::time::timeout(self.timeout, connect(upstream, &self.tls)).await {
            Ok(connected) => connected,
            Err(_) => Err(ConnectError::TimedOut(self.timeout)),
        }
    }
}

async fn connect(
    upstream: &UpstreamUrl,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<UpstreamStream, ConnectError> {
    // A bracketed IPv6 literal connects by its address.
    let bare = upstream.host().trim_start_matches('[').trim_end_matches(']');
    let stream = TcpStream::connect((bare, upstream.port())).await?;
    stream.set_nodelay(true)?;
    if !upstream.tls {
        return Ok(UpstreamStream::Plain(stream));
    }
    let name = rustls::pki_types::ServerName::try_from(bare.to_owned())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::clone(tls))
        .connect(name, stream)
        .await?;
    Ok(UpstreamStream::Tls(Box::new(stream)))
}

/// One upstream connection.
pub enum UpstreamStream {
    /// `http://`.
    Plain(TcpStream),
    /// `https://` (boxed: a TLS session is large).
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls(io) => Pin::new(io.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Self::Tls(io) => Pin::new(io.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(io) => Pin::new(io.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(io) => Pin::new(io.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Self::Tls(io) => Pin::new(io.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls(io) => io.is_write_vectored(),
        }
    }
}
