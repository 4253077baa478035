//! What the proxy tests put behind `sluice serve`: a real HTTP/1.1 application ([`Upstream`],
//! hyper on a runtime of its own, answering by path), raw TCP listeners that fail the ways
//! upstreams fail ([`RawUpstream`], [`Blackhole`], [`refusing`]), and a client for bodies too
//! large to hold, checked by their [`Digest`] as they stream.
//!
//! The paths of [`Upstream`]:
//!
//! - `/echo`: the request's body back, streamed as it arrives;
//! - `/sink`: the whole body read, then answered with its digest (`LEN HASH`);
//! - `/headers`: the request line and headers as they arrived, one a line;
//! - `/bytes/N`: N bytes of [`pattern`], chunked; `/bytes-len/N`: the same with Content-Length;
//! - `/slow-head/MS`: the head after MS milliseconds;
//! - `/slow-body/MS`: `first part`, a pause of MS milliseconds, `second part` (chunked);
//! - `/status/CODE`: that status, with `Retry-After: 7`;
//! - `/hop`: an answer with hop-by-hop headers (`Connection: x-private`, `X-Private: 1`,
//!   `Keep-Alive: timeout=5`) beside `X-Kept: 1`;
//! - `/ws`: switches protocols (101, `Upgrade: websocket`), then echoes raw bytes;
//! - anything else: `Hello World!`, with Content-Length.
//!
//! Every answer carries `X-Upstream: NAME`; [`Upstream::hits`] counts the requests to a path,
//! [`Upstream::abandoned`] the bodies left half-way (an upload that broke off, a download whose
//! reader went away).

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Client, PATIENCE, Server};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Answer = Response<UnsyncBoxBody<Bytes, BoxError>>;

/// The size of the chunks bodies are written in.
pub const CHUNK: usize = 64 * 1024;

/// Byte `i` of every body these tests send or ask for is `i % 251`: a shifted, dropped or
/// repeated piece changes the digest.
static PATTERN: LazyLock<Bytes> = LazyLock::new(|| (0..CHUNK + 251).map(|i| (i % 251) as u8).collect());

/// `len` (at most [`CHUNK`]) bytes of the pattern from byte `offset` of a body.
pub fn pattern(offset: u64, len: usize) -> Bytes {
    let start = (offset % 251) as usize;
    PATTERN.slice(start..start + len)
}

/// A body's length and FNV-1a hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Digest {
    pub len: u64,
    hash: u64,
}

impl Default for Digest {
    fn default() -> Self {
        Self {
            len: 0,
            hash: 0xcbf2_9ce4_8422_2325,
        }
    }
}

impl Digest {
    pub fn update(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.hash = (self.hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
        self.len += bytes.len() as u64;
    }

    /// The digest of `len` bytes of [`pattern`].
    pub fn of_pattern(len: u64) -> Self {
        let mut digest = Self::default();
        while digest.len < len {
            let n = (len - digest.len).min(CHUNK as u64) as usize;
            digest.update(&pattern(digest.len, n));
        }
        digest
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:016x}", self.len, self.hash)
    }
}

/// The test application: an HTTP/1.1 server on a free local port until dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Whether it speaks TLS (`https://`).
    tls: bool,
    state: Arc<State>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct State {
    name: String,
    hits: Mutex<HashMap<String, u64>>,
    abandoned: AtomicU64,
    connections: AtomicU64,
}

impl Upstream {
    /// Serves, naming itself `name` in `X-Upstream`.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, None)
    }

    /// Serves over TLS with `acceptor`'s certificate.
    pub fn start_tls(name: &str, acceptor: tokio_rustls::TlsAcceptor) -> Self {
        Self::start_with(name, Some(acceptor))
    }

    fn start_with(name: &str, tls: Option<tokio_rustls::TlsAcceptor>) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            name: name.to_owned(),
            hits: Mutex::default(),
            abandoned: AtomicU64::new(0),
            connections: AtomicU64::new(0),
        });
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(listener).unwrap()
        };
        let https = tls.is_some();
        runtime.spawn(serve(listener, Arc::clone(&state), tls));
        Self {
            addr,
            tls: https,
            state,
            runtime: Some(runtime),
        }
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Requests received for `path` (the path alone, without the query).
    pub fn hits(&self, path: &str) -> u64 {
        self.state.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Requests received in all.
    pub fn total(&self) -> u64 {
        self.state.hits.lock().unwrap().values().sum()
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Relaxed)
    }

    /// Bodies left half-way: uploads to `/sink` that broke off, downloads whose reader went.
    pub fn abandoned(&self) -> u64 {
        self.state.abandoned.load(Ordering::Relaxed)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, state: Arc<State>, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        state.connections.fetch_add(1, Ordering::Relaxed);
        let (state, tls) = (Arc::clone(&state), tls.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| answer(request, Arc::clone(&state)));
            let builder = hyper::server::conn::http1::Builder::new();
            let _ = match tls {
                None => {
                    builder
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await
                }
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => {
                        builder
                            .serve_connection(TokioIo::new(stream), service)
                            .with_upgrades()
                            .await
                    }
                    Err(_) => return,
                },
            };
        });
    }
}

async fn answer(mut request: Request<Incoming>, state: Arc<State>) -> Result<Answer, Infallible> {
    let path = request.uri().path().to_owned();
    *state.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let (route, argument) = path[1..].split_once('/').unwrap_or((&path[1..], ""));
    let number: u64 = argument.parse().unwrap_or(0);
    let mut response = match route {
        "echo" => Response::new(request.into_body().map_err(BoxError::from).boxed_unsync()),
        "sink" => {
            let mut digest = Digest::default();
            let mut body = request.into_body();
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(frame) => digest.update(frame.data_ref().map_or(&[][..], |data| &data[..])),
                    Err(e) => {
                        state.abandoned.fetch_add(1, Ordering::Relaxed);
                        return Ok(text(StatusCode::BAD_REQUEST, format!("body broke: {e}")));
                    }
                }
            }
            text(StatusCode::OK, digest.to_string())
        }
        "headers" => {
            let mut lines = format!("{} {} {:?}\n", request.method(), request.uri(), request.version());
            for (name, value) in request.headers() {
                lines.push_str(&format!(
                    "{name}: {}\n",
                    String::from_utf8_lossy(value.as_bytes())
                ));
            }
            text(StatusCode::OK, lines)
        }
        "bytes" | "bytes-len" => fed(&state, route == "bytes-len", number, move |tx| async move {
            let mut sent = 0;
            while sent < number {
                let n = (number - sent).min(CHUNK as u64) as usize;
                tx.send(pattern(sent, n)).await?;
                sent += n as u64;
            }
            Ok(())
        }),
        "slow-head" => {
            tokio::time::sleep(Duration::from_millis(number)).await;
            text(StatusCode::OK, "slow head".into())
        }
        "slow-body" => fed(&state, false, 0, move |tx| async move {
            tx.send(Bytes::from_static(b"first part\n")).await?;
            tokio::time::sleep(Duration::from_millis(number)).await;
            tx.send(Bytes::from_static(b"second part\n")).await
        }),
        "status" => {
            let status = StatusCode::from_u16(number as u16).unwrap();
            let mut response = text(status, "upstream says slow down".into());
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("7"));
            response
        }
        "hop" => {
            let mut response = text(StatusCode::OK, "hop".into());
            let headers = response.headers_mut();
            headers.insert("connection", HeaderValue::from_static("x-private"));
            headers.insert("x-private", HeaderValue::from_static("1"));
            headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
            headers.insert("x-kept", HeaderValue::from_static("1"));
            response
        }
        "ws" => {
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                let Ok(upgraded) = upgrade.await else { return };
                let mut io = TokioIo::new(upgraded);
                let mut buf = vec![0u8; 4096];
                while let Ok(n @ 1..) = io.read(&mut buf).await {
                    if io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
            let mut response = text(StatusCode::SWITCHING_PROTOCOLS, String::new());
            let headers = response.headers_mut();
            headers.insert("upgrade", HeaderValue::from_static("websocket"));
            headers.insert("connection", HeaderValue::from_static("upgrade"));
            response
        }
        _ => text(StatusCode::OK, "Hello World!".into()),
    };
    let name = HeaderValue::from_str(&state.name).unwrap();
    response.headers_mut().insert("x-upstream", name);
    Ok(response)
}

fn text(status: StatusCode, body: String) -> Answer {
    let body = Full::new(Bytes::from(body))
        .map_err(|never| match never {})
        .boxed_unsync();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
}

/// An answer whose body `feed` writes from a task of its own, waiting for the connection to
/// take each chunk (and counted abandoned if the connection lets go of it first); of `len`
/// bytes (Content-Length) when `known`, else chunked.
fn fed<F, Fut>(state: &Arc<State>, known: bool, len: u64, feed: F) -> Answer
where
    F: FnOnce(mpsc::Sender<Bytes>) -> Fut,
    Fut: Future<Output = Result<(), mpsc::error::SendError<Bytes>>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(2);
    let state = Arc::clone(state);
    let feeding = feed(tx);
    tokio::spawn(async move {
        if feeding.await.is_err() {
            state.abandoned.fetch_add(1, Ordering::Relaxed);
        }
    });
    let body = Fed {
        rx,
        len: known.then_some(len),
    };
    Response::new(body.boxed_unsync())
}

struct Fed {
    rx: mpsc::Receiver<Bytes>,
    len: Option<u64>,
}

impl Body for Fed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
    }

    fn size_hint(&self) -> SizeHint {
        self.len.map_or_else(SizeHint::default, SizeHint::with_exact)
    }
}

/// How a [`RawUpstream`] treats each connection once it has read a request head.
#[derive(Debug, Clone, Copy)]
pub enum Misbehaviour {
    /// Answers `200 late` after the delay, unless the connection closes first.
    AnswerAfter(Duration),
    /// Never answers; holds the connection until the other side closes it.
    Hang,
    /// Answers 200 with a head announcing a megabyte (Content-Length, or chunked) and the first
    /// kilobyte in the same write; once [`RawUpstream::release`] lets it, resets (RST).
    ResetMidBody { chunked: bool },
    /// Closes the connection without a word.
    CloseAfterRequest,
    /// Writes these bytes as the answer to every request of the connection, whatever they
    /// frame (an answer with more bytes than it announces, two framings, …).
    Answer(&'static [u8]),
}

/// A TCP listener on a free local port that misbehaves, until dropped.
pub struct RawUpstream {
    pub addr: SocketAddr,
    state: Arc<RawState>,
}

#[derive(Default)]
struct RawState {
    requests: AtomicU64,
    answered: AtomicU64,
    dropped: AtomicU64,
    released: AtomicBool,
    stopped: AtomicBool,
}

impl RawUpstream {
    pub fn start(how: Misbehaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(RawState::default());
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if shared.stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || misbehave(stream, how, &shared));
            }
        });
        Self { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Request heads read.
    pub fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::Relaxed)
    }

    /// Requests answered ([`Misbehaviour::AnswerAfter`]).
    pub fn answered(&self) -> u64 {
        self.state.answered.load(Ordering::Relaxed)
    }

    /// Requests whose connection the other side closed before they were answered.
    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::Relaxed)
    }

    /// Lets a connection of [`Misbehaviour::ResetMidBody`] reset (one per call).
    pub fn release(&self) {
        self.state.released.store(true, Ordering::Relaxed);
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::Relaxed);
        self.release();
        // Wakes the accepting thread so it sees the stop.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Reads a request head (the tests' requests have no body); false if the connection ended.
fn read_request_head(reader: &mut BufReader<TcpStream>) -> bool {
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return false,
            Ok(_) if line == "\r\n" => return true,
            Ok(_) => {}
        }
    }
}

fn misbehave(stream: TcpStream, how: Misbehaviour, state: &RawState) {
    let mut reader = BufReader::new(stream);
    if let Misbehaviour::Answer(bytes) = how {
        while read_request_head(&mut reader) {
            state.requests.fetch_add(1, Ordering::Relaxed);
            if reader.get_mut().write_all(bytes).is_err() {
                return;
            }
        }
        return;
    }
    if !read_request_head(&mut reader) {
        return;
    }
    state.requests.fetch_add(1, Ordering::Relaxed);
    let mut stream = reader.into_inner();
    match how {
        Misbehaviour::AnswerAfter(delay) => {
            if closed_within(&mut stream, Some(delay)) {
                state.dropped.fetch_add(1, Ordering::Relaxed);
            } else {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlate");
                state.answered.fetch_add(1, Ordering::Relaxed);
            }
        }
        Misbehaviour::Hang => {
            if closed_within(&mut stream, None) {
                state.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
        Misbehaviour::ResetMidBody { chunked } => {
            let mut bytes = if chunked {
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n".to_vec()
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n".to_vec()
            };
            bytes.extend_from_slice(&pattern(0, 1000));
            if chunked {
                bytes.extend_from_slice(b"\r\n");
            }
            let _ = stream.write_all(&bytes);
            // Each release lets one connection go.
            let deadline = Instant::now() + PATIENCE;
            while !state.released.swap(false, Ordering::Relaxed) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            // Linger 0: closing sends RST, not FIN.
            let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
        }
        Misbehaviour::CloseAfterRequest => {
            let _ = stream.shutdown(Shutdown::Both);
        }
        Misbehaviour::Answer(_) => {}
    }
}

/// Whether the other side closes `stream` within `wait` (forever if `None`); bytes it sends
/// meanwhile are read and ignored.
fn closed_within(stream: &mut TcpStream, wait: Option<Duration>) -> bool {
    let deadline = wait.map(|wait| Instant::now() + wait);
    let mut sink = [0u8; 1024];
    loop {
        let left = deadline.map(|at| at.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return false;
        }
        stream.set_read_timeout(left).unwrap();
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(_) => return true,
        }
    }
}

/// An address where nothing listens: bound, then let go.
pub fn refusing() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A listener whose accept queue is full and never accepted from: the kernel drops new
/// connection attempts, so connecting takes until the connecting side gives up.
pub struct Blackhole {
    pub addr: SocketAddr,
    _listener: socket2::Socket,
    _queued: Vec<TcpStream>,
}

impl Blackhole {
    pub fn start() -> Self {
        use socket2::{Domain, Socket, Type};
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        listener
            .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
            .unwrap();
        listener.listen(0).unwrap();
        let addr = listener.local_addr().unwrap().as_socket().unwrap();
        let mut queued = Vec::new();
        while let Ok(stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            queued.push(stream);
            assert!(queued.len() < 64, "the accept queue never fills");
        }
        Self {
            addr,
            _listener: listener,
            _queued: queued,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// How a streamed body ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// As its framing says: Content-Length reached, or the last chunk.
    Complete,
    /// Closed or reset before that.
    Cut(String),
    /// Nothing more came for [`PATIENCE`].
    Stalled,
}

/// A response read off a raw connection, its body digested as it arrived.
#[derive(Debug)]
pub struct Streamed {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Digest,
    /// The body's first bytes (up to [`KEPT`]), as text: small bodies are read from here.
    pub text: String,
    pub end: End,
}

/// How much of a streamed body [`Streamed::text`] keeps.
pub const KEPT: usize = 4096;

impl Streamed {
    pub fn header(&self, name: &str) -> Option<&str> {
        (self.headers.iter())
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A request body the client writes: none, or `N` bytes of [`pattern`] with Content-Length or
/// chunked.
#[derive(Debug, Clone, Copy)]
pub enum Upload {
    None,
    Length(u64),
    Chunked(u64),
}

/// Sends `METHOD PATH` as the account `tester` on a new connection, writing `upload` from a
/// thread of its own while the response is read (an echo answers before the upload ends).
pub fn exchange(addr: SocketAddr, method: &str, path: &str, upload: Upload) -> Streamed {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let framing = match upload {
        Upload::None => String::new(),
        Upload::Length(len) => format!("Content-Length: {len}\r\n"),
        Upload::Chunked(_) => "Transfer-Encoding: chunked\r\n".into(),
    };
    let head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nX-Account-ID: tester\r\n{framing}\r\n");
    let writing = std::thread::spawn(move || -> std::io::Result<()> {
        writer.write_all(head.as_bytes())?;
        let (len, chunked) = match upload {
            Upload::None => return Ok(()),
            Upload::Length(len) => (len, false),
            Upload::Chunked(len) => (len, true),
        };
        let mut sent = 0;
        while sent < len {
            let n = (len - sent).min(CHUNK as u64) as usize;
            if chunked {
                writer.write_all(format!("{n:x}\r\n").as_bytes())?;
            }
            writer.write_all(&pattern(sent, n))?;
            if chunked {
                writer.write_all(b"\r\n")?;
            }
            sent += n as u64;
        }
        if chunked {
            writer.write_all(b"0\r\n\r\n")?;
        }
        Ok(())
    });
    let response = read_response(&mut BufReader::new(stream));
    writing.join().unwrap().unwrap();
    response
}

/// Reads a response head and its body.
pub fn read_response(reader: &mut BufReader<TcpStream>) -> Streamed {
    let mut response = read_head(reader);
    read_body(reader, &mut response);
    response
}

/// Reads a response head; its body is left for [`read_body`].
pub fn read_head(reader: &mut BufReader<TcpStream>) -> Streamed {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = (status_line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').unwrap();
        headers.push((k.trim().to_owned(), v.trim().to_owned()));
    }
    Streamed {
        status,
        headers,
        body: Digest::default(),
        text: String::new(),
        end: End::Complete,
    }
}

/// Reads the body `response`'s head announces (Content-Length, chunked, or up to the close),
/// digesting it, and says how it ended.
pub fn read_body(reader: &mut BufReader<TcpStream>, response: &mut Streamed) {
    let chunked = (response.header("transfer-encoding")).is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
    let length = (response.header("content-length")).map(|len| len.parse::<u64>().unwrap());
    let mut kept = Vec::new();
    let digest = &mut response.body;
    let mut take = |bytes: &[u8]| {
        digest.update(bytes);
        kept.extend_from_slice(&bytes[..bytes.len().min(KEPT - kept.len())]);
    };
    let read = if matches!(response.status, 101 | 204 | 304) {
        Ok(())
    } else if chunked {
        read_chunked(reader, &mut take)
    } else if let Some(length) = length {
        read_exactly(reader, length, &mut take)
    } else {
        read_to_close(reader, &mut take)
    };
    response.text = String::from_utf8_lossy(&kept).into_owned();
    response.end = match read {
        Ok(()) => End::Complete,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => End::Stalled,
        Err(e) => End::Cut(e.to_string()),
    };
}

fn read_exactly(reader: &mut impl Read, mut left: u64, take: &mut impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    while left > 0 {
        let want = left.min(CHUNK as u64) as usize;
        match reader.read(&mut buf[..want])? {
            0 => return Err(ErrorKind::UnexpectedEof.into()),
            n => {
                take(&buf[..n]);
                left -= n as u64;
            }
        }
    }
    Ok(())
}

fn read_chunked(reader: &mut BufReader<TcpStream>, take: &mut impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let size = line.trim_end().split(';').next().unwrap_or_default();
        let size = u64::from_str_radix(size, 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            break;
        }
        read_exactly(reader, size, take)?;
        read_exactly(reader, 2, &mut |_| {})?;
    }
    // Trailers, then the empty line.
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        if line == "\r\n" {
            return Ok(());
        }
    }
}

fn read_to_close(reader: &mut impl Read, take: &mut impl FnMut(&[u8])) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf)? {
            0 => return Ok(()),
            n => take(&buf[..n]),
        }
    }
}

/// The value of `series` (its name and labels as `/metrics` writes them, e.g.
/// `sluice_upstream_failures_total{reason="connect"}`) on the server's admin listener; 0 when
/// its family is there without that series.
pub fn metric(server: &Server, series: &str) -> u64 {
    let text = (Client::connect(server.admin.expect("admin.listen is set")).get("/metrics", &[])).body;
    let value = text
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '));
    match value {
        Some(value) => value.parse().unwrap(),
        None => {
            let family = series.split('{').next().unwrap().trim_end_matches("_total");
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "no {family} in:\n{text}"
            );
            0
        }
    }
}

/// A line of a `/proc/PID/status` of the server's process, as a number (`VmHWM` in kB,
/// `Threads`).
pub fn process_status(server: &Server, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let line = (status.lines())
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in {status}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}
