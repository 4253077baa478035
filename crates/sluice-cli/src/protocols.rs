//! Which HTTP a client connection speaks, and the hyper connection that serves it: HTTP/2
//! when a cleartext connection opens with the HTTP/2 preface (prior knowledge, as gRPC and
//! `curl --http2-prior-knowledge` do) or TLS negotiated `h2` over ALPN, HTTP/1.1 otherwise,
//! with upgrades (WebSocket) passed on to the service.

use std::pin::Pin;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::connection::Closable;

/// hyper's own bound on a request's headers: not set unless the config asks for another,
/// since setting it moves hyper's header table from the stack to the heap.
const HYPER_MAX_HEADERS: usize = 100;
/// The least read buffer hyper accepts (`max_buf_size` asserts it).
const HYPER_MIN_BUFFER: usize = 8192;
/// What every HTTP/2 connection opens with (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Streams one HTTP/2 connection may have open at once.
const MAX_STREAMS: u32 = 128;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A service hyper can serve a connection with, in either HTTP: its futures and bodies may
/// move to HTTP/2's stream tasks.
pub trait ConnectionService:
    HttpService<
        Incoming,
        Future: Send + 'static,
        Error: Into<BoxError>,
        ResBody: hyper::body::Body<Data: Send, Error: Into<BoxError>> + Send + 'static,
    >
{
}

impl<S> ConnectionService for S where
    S: HttpService<
            Incoming,
            Future: Send + 'static,
            Error: Into<BoxError>,
            ResBody: hyper::body::Body<Data: Send, Error: Into<BoxError>> + Send + 'static,
        >
{
}

/// The HTTP a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speaks {
    /// HTTP/1.1 (or 1.0).
    Http1,
    /// HTTP/2.
    Http2,
}

/// The hyper builders of the listener's connections.
#[derive(Clone)]
pub struct Protocols {
    h1: http1::Builder,
    h2: http2::Builder<TokioExecutor>,
}

impl Protocols {
    /// Builders bounding request heads to `max_header_bytes` and `max_headers`.
    pub fn new(max_header_bytes: usize, max_headers: usize) -> Self {
        let mut h1 = http1::Builder::new();
        h1.timer(TokioTimer::new())
            // Slow or silent clients are closed by the idle check (`connection.rs`), which
            // costs nothing per request; hyper's header timer would be armed for each one.
            .header_read_timeout(None)
            .keep_alive(true)
            .pipeline_flush(false)
            // One buffer, written by one call: a small answer's body is copied after its head
            // rather than queued beside it (fewer instructions per answer, and what TLS wants).
            .writev(false)
            // A complete head above the limit is answered 431; an incomplete one stops
            // growing at the buffer's bound, which cannot go below hyper's minimum.
            .max_header_size(max_header_bytes)
            .max_buf_size(max_header_bytes.max(HYPER_MIN_BUFFER));
        if max_headers != HYPER_MAX_HEADERS {
            h1.max_headers(max_headers);
        }
        let mut h2 = http2::Builder::new(TokioExecutor::new());
        h2.timer(TokioTimer::new())
            .max_concurrent_streams(MAX_STREAMS)
            .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX));
        Self { h1, h2 }
    }

    /// Serves `io`, speaking `speaks`.
    pub fn serve<I, S>(&self, io: I, speaks: Speaks, service: S) -> Served<I, S>
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        S: ConnectionService + Clone + Send + 'static,
    {
        let io = TokioIo::new(io);
        match speaks {
            Speaks::Http1 => Served::Http1 {
                connection: self.h1.serve_connection(io, service).with_upgrades(),
            },
            Speaks::Http2 => Served::Http2 {
                connection: self.h2.serve_connection(io, service),
            },
        }
    }
}

/// Whether a cleartext connection opens with the HTTP/2 preface, looking at its first bytes
/// without taking them. A preface that arrives in pieces is looked at again shortly, for at
/// most `patience`.
pub async fn sniff(stream: &TcpStream, patience: Duration) -> std::io::Result<Speaks> {
    let look = async {
        let mut first = [0u8; PREFACE.len()];
        loop {
            let seen = stream.peek(&mut first).await?;
            if seen == 0 || first[..seen] != PREFACE[..seen] {
                return Ok(Speaks::Http1);
            }
            if seen == PREFACE.len() {
                return Ok(Speaks::Http2);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    match tokio::time::timeout(patience, look).await {
        Ok(speaks) => speaks,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no request within the idle timeout",
        )),
    }
}

/// What TLS negotiated over ALPN.
pub fn negotiated<IO>(stream: &tokio_rustls::server::TlsStream<IO>) -> Speaks {
    match stream.get_ref().1.alpn_protocol() {
        Some(b"h2") => Speaks::Http2,
        _ => Speaks::Http1,
    }
}

pin_project_lite::pin_project! {
    /// A connection served in the HTTP it speaks.
    #[project = ServedProj]
    pub enum Served<I, S>
    where
        S: HttpService<Incoming>,
    {
        /// HTTP/1.1, with upgrades.
        Http1 { #[pin] connection: http1::UpgradeableConnection<TokioIo<I>, S> },
        /// HTTP/2.
        Http2 { #[pin] connection: http2::Connection<TokioIo<I>, S, TokioExecutor> },
    }
}

impl<I, S> std::future::Future for Served<I, S>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: ConnectionService,
{
    type Output = Result<(), hyper::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        match self.project() {
            ServedProj::Http1 { connection } => connection.poll(cx),
            ServedProj::Http2 { connection } => connection.poll(cx),
        }
    }
}

impl<I, S> Closable for Served<I, S>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: ConnectionService,
{
    fn close_gracefully(self: Pin<&mut Self>) {
        match self.project() {
            ServedProj::Http1 { connection } => connection.graceful_shutdown(),
            ServedProj::Http2 { connection } => connection.graceful_shutdown(),
        }
    }
}
