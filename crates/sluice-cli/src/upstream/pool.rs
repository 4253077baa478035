//! The proxy's keep-alive connections to its upstreams, and the start of one request's
//! exchange on one of them (in HTTP/1.1 as `wire` writes and reads it), up to the answer's
//! head; `exchange` carries on from there.
//!
//! A connection has no task of its own: the task of the request that holds it writes the
//! request and reads the response head, then, as the server asks for the response body's
//! frames, goes on sending the request's body (an upstream may answer before it has all of
//! it, as an echo does) and reads the answer's. A request thus costs no hand-off between
//! tasks and no channel to a connection task and back. When both bodies have ended and the
//! answer allows it, the connection returns to its upstream's idle list, tagged with the
//! serving thread that used it (each thread runs a runtime of its own, and a socket is best
//! driven by the runtime it was registered with); a request takes the most recently used
//! idle connection of its own thread, or connects.
//!
//! An idle connection is read by nobody: a reaper task looks at every idle connection once
//! a second and closes those the upstream closed (or sent anything on, unasked) and those
//! idle longer than `POOL_IDLE`. A request that gives up its connection before the exchange
//! ended (the client left, a timeout) drops it, and with it the exchange: HTTP/1.1 cannot
//! cancel one request and keep the connection.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Method, Response, request};
use hyper::body::{Body, Incoming};
use sluice_config::UpstreamUrl;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::time::{Instant, Sleep};

use super::body::{BoxError, IdleBody};
use super::client::{ConnectError, Connector, UpstreamStream};
use super::exchange::{ExchangeError, MAX_INTERIM, PooledBody, Upload};
use super::wire::{self, RequestFraming};

/// What a forwarded request's body is.
pub type OutgoingBody = IdleBody<Incoming>;

/// How often idle connections are looked at.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// How many times a request that a pooled connection could not take is offered to another
/// before a new connection is made for it.
const MAX_STALE_TRIES: usize = 4;

/// How much room a connection's read buffer makes before each read: a short answer arrives
/// in one read, a long body in reads of this size.
const READ_SIZE: usize = 16 * 1024;

/// Room made in an answer's header map for the headers added on its way to the client (the
/// rate-limit fields), so the map is not grown and rehashed for them.
const HEADER_ROOM: usize = 8;

/// Keep-alive connections to a set of upstreams.
pub struct Pool {
    /// One idle list per upstream, found by its URL (a handful: a linear search is fastest).
    upstreams: Vec<(UpstreamUrl, Mutex<Vec<Idle>>)>,
    connector: Connector,
    /// The most idle connections kept per upstream.
    max_idle: usize,
    /// How long an idle connection is kept.
    keep_idle: Duration,
    /// The longest from a request sent to its response head.
    head_timeout: Duration,
}

/// A connection in an idle list.
struct Idle {
    connection: Box<Connection>,
    since: Instant,
    thread: usize,
}

/// One upstream connection.
pub(super) struct Connection {
    pub(super) io: UpstreamStream,
    /// What the upstream sent that is not used yet.
    pub(super) read: BytesMut,
    /// Whether anything of an answer to the request in flight arrived (a 1xx included).
    heard: bool,
    /// The interim (1xx) answers to the request in flight.
    interim: u8,
    /// The head timeout of the request in flight. One timer a connection, moved forward for
    /// each request: a later deadline is set without touching the runtime's timer wheel,
    /// where a timer made and dropped per request would be inserted and removed each time.
    head_timer: Pin<Box<Sleep>>,
}

impl Connection {
    /// Whether an idle connection can take a request: the upstream has neither closed it
    /// nor sent anything unasked. Costs no system call unless the socket had an event.
    fn is_fit(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.read.is_empty() {
            return false;
        }
        let mut probe = [0; 1];
        let mut probe = ReadBuf::new(&mut probe);
        Pin::new(&mut self.io).poll_read(cx, &mut probe).is_pending()
    }

    /// Reads what the upstream sent next into `read`. `Ok(0)`: the upstream closed.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.read.capacity() - self.read.len() < READ_SIZE / 4 {
            self.read.reserve(READ_SIZE);
        }
        let read = ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.io),
            cx,
            &mut self.read
        ));
        self.heard |= matches!(read, Ok(1..));
        Poll::Ready(read)
    }

    /// Reads up to the answer's head, skipping interim (1xx) answers but `101`.
    fn poll_head(
        &mut self,
        cx: &mut Context<'_>,
        method: &Method,
    ) -> Poll<Result<wire::ResponseHead, ExchangeError>> {
        loop {
            if let Some(head) = wire::read_response_head(&mut self.read, method, HEADER_ROOM)? {
                if head.status.is_informational() && head.status != http::StatusCode::SWITCHING_PROTOCOLS {
                    self.interim += 1;
                    if usize::from(self.interim) > MAX_INTERIM {
                        return Poll::Ready(Err(ExchangeError::Interim));
                    }
                    continue;
                }
                return Poll::Ready(Ok(head));
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => return Poll::Ready(Err(ExchangeError::Closed)),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(ExchangeError::Read(e))),
            }
        }
    }
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be made.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The exchange failed: the connection broke, the upstream answered nonsense, or the
    /// request's own body failed.
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    /// No response head within the head timeout (the exchange is dropped, and its
    /// connection).
    #[error("no response within {0:?}")]
    HeadTimeout(Duration),
}

/// Whether a request may be sent again after its first connection closed under it:
/// RFC 9110 §9.2.2's idempotent methods, and nothing of its body consumed.
fn resendable(method: &Method, framing: RequestFraming) -> bool {
    framing == RequestFraming::Empty
        && matches!(
            *method,
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
        )
}

/// Whether `a` and `b` are one upstream. Byte equality: both are normalized (lower-case
/// host, explicit port), and the authority's own comparison ignores case letter by letter.
fn same_upstream(a: &UpstreamUrl, b: &UpstreamUrl) -> bool {
    a.tls == b.tls && a.authority.as_str() == b.authority.as_str()
}

/// The serving thread a connection belongs to.
fn this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static THIS: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    THIS.with(|this| *this)
}

impl Pool {
    /// Connections to `upstreams` (duplicates kept once), made by `connector`, at most
    /// `max_idle` idle ones per upstream, each kept `keep_idle`, a response head awaited at
    /// most `head_timeout`. Starts the reaper on the current runtime, if there is one; it
    /// ends with the pool.
    pub fn new<'a>(
        upstreams: impl IntoIterator<Item = &'a UpstreamUrl>,
        connector: Connector,
        max_idle: usize,
        keep_idle: Duration,
        head_timeout: Duration,
    ) -> Arc<Self> {
        let mut lists: Vec<(UpstreamUrl, Mutex<Vec<Idle>>)> = Vec::new();
        for url in upstreams {
            if !lists.iter().any(|(known, _)| same_upstream(known, url)) {
                lists.push((url.clone(), Mutex::new(Vec::new())));
            }
        }
        let pool = Arc::new(Self {
            upstreams: lists,
            connector,
            max_idle,
            keep_idle,
            head_timeout,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(reap(Arc::downgrade(&pool)));
        }
        pool
    }

    /// Sends `request` (its URI in origin form, its `Host` set, its hop-by-hop headers
    /// removed), with the `added` fields after its own, to `target` and waits for the response head, at most the head timeout once
    /// the request is under way. The response's body sends the rest of the request's and
    /// reads the answer's; the connection returns to the idle list when both have ended.
    pub async fn send<B>(
        self: &Arc<Self>,
        target: &UpstreamUrl,
        parts: &request::Parts,
        body: B,
        added: &[(&HeaderName, HeaderValue)],
    ) -> Result<Response<PooledBody<B>>, SendError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        let slot = (self.upstreams.iter())
            .position(|(url, _)| same_upstream(url, target))
            .ok_or_else(|| ConnectError::Unknown(target.to_string()))?;
        let declared = parts.headers.contains_key(http::header::CONTENT_LENGTH);
        let framing = RequestFraming::of(body.size_hint().exact(), body.is_end_stream(), declared);
        let mut head = Vec::with_capacity(512);
        wire::write_request_head(&mut head, parts, added, framing);
        let mut upload = Upload::new(head, body, framing);
        let method = &parts.method;
        let mut stale = 0;
        let mut resent = false;
        // One deadline for the request, however many connections it takes.
        let mut deadline = None;
        loop {
            let idle = if stale < MAX_STALE_TRIES {
                self.take_idle(slot)
            } else {
                None
            };
            let (mut connection, pooled) = match idle {
                Some(connection) => (connection, true),
                // Boxed: a connection (and its TLS handshake) is made seldom, and its future
                // would otherwise make every request's future larger.
                None => (Box::pin(self.connect(target)).await?, false),
            };
            // A pooled connection is looked at first: the upstream may have closed it while
            // it was idle.
            if pooled && !poll_fn(|cx| Poll::Ready(connection.is_fit(cx))).await {
                stale += 1;
                continue;
            }
            let deadline = *deadline.get_or_insert_with(|| Instant::now() + self.head_timeout);
            connection.head_timer.as_mut().reset(deadline);
            connection.heard = false;
            connection.interim = 0;
            let head = poll_fn(|cx| {
                if !upload.is_done() {
                    let before = upload.progress();
                    if let Poll::Ready(Err(e)) = upload.poll_send(&mut connection.io, cx) {
                        return Poll::Ready(Some(Err(e)));
                    }
                    if !upload.is_done() && upload.progress() != before {
                        connection
                            .head_timer
                            .as_mut()
                            .reset(Instant::now() + self.head_timeout);
                    }
                }
                // Whatever the upstream sends, this ends: a head is bounded, and so are the
                // interim answers before it.
                if let Poll::Ready(head) = connection.poll_head(cx, method) {
                    return Poll::Ready(Some(head));
                }
                // The head timeout counts from the request's last progress: an upload the
                // upstream goes on taking, or one waiting for its client's body (which
                // `idle_timeout` bounds), does not run it out.
                while connection.head_timer.as_mut().poll(cx).is_ready() {
                    if !upload.waits_for_body() {
                        return Poll::Ready(None);
                    }
                    connection
                        .head_timer
                        .as_mut()
                        .reset(Instant::now() + self.head_timeout);
                }
                Poll::Pending
            })
            .await;
            let mut head = match head {
                None => return Err(SendError::HeadTimeout(self.head_timeout)),
                Some(Ok(head)) => head,
                // A pooled connection the upstream closed just as the request went out, not
                // a byte of an answer heard: a request that can go again goes once more, on
                // a new connection.
                Some(Err(e))
                    if pooled
                        && !resent
                        && !connection.heard
                        && e.unanswered()
                        && resendable(method, framing) =>
                {
                    upload.restart();
                    resent = true;
                    stale = MAX_STALE_TRIES;
                    continue;
                }
                // The upstream stopped taking the request and gave no answer: the write's
                // failure says why.
                Some(Err(ExchangeError::Closed)) if upload.cut.is_some() => {
                    let cut = upload
                        .cut
                        .take()
                        .unwrap_or_else(|| io::ErrorKind::BrokenPipe.into());
                    return Err(ExchangeError::Write(cut).into());
                }
                Some(Err(e)) => return Err(e.into()),
            };
            let mut response = Response::new(PooledBody::new(
                upload,
                &mut head,
                connection,
                Arc::clone(self),
                slot,
            ));
            *response.status_mut() = head.status;
            *response.version_mut() = head.version;
            *response.headers_mut() = head.headers;
            return Ok(response);
        }
    }

    /// A new connection to `target`.
    async fn connect(&self, target: &UpstreamUrl) -> Result<Box<Connection>, SendError> {
        let io = self.connector.connect(target).await?;
        Ok(Box::new(Connection {
            io,
            read: BytesMut::new(),
            heard: false,
            interim: 0,
            head_timer: Box::pin(tokio::time::sleep(self.head_timeout)),
        }))
    }

    /// The most recently used idle connection of this thread to upstream `slot`.
    fn take_idle(&self, slot: usize) -> Option<Box<Connection>> {
        let thread = this_thread();
        let mut idle = self.upstreams[slot]
            .1
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let at = idle.iter().rposition(|idle| idle.thread == thread)?;
        Some(idle.swap_remove(at).connection)
    }

    /// Puts `connection` back in `slot`'s idle list, unless the list is full.
    pub(super) fn keep(&self, slot: usize, connection: Box<Connection>) {
        let mut idle = self.upstreams[slot]
            .1
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(Idle {
                connection,
                since: Instant::now(),
                thread: this_thread(),
            });
        }
    }

    /// Closes the idle connections that ended or stayed idle too long.
    fn reap(&self) {
        let mut cx = Context::from_waker(Waker::noop());
        for (_, idle) in &self.upstreams {
            let mut idle = idle.lock().unwrap_or_else(PoisonError::into_inner);
            idle.retain_mut(|idle| idle.since.elapsed() < self.keep_idle && idle.connection.is_fit(&mut cx));
        }
    }

    /// How many idle connections the pool keeps now.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        (self.upstreams.iter())
            .map(|(_, idle)| idle.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// The reaper: every `REAP_EVERY`, until the pool is gone.
async fn reap(pool: Weak<Pool>) {
    let mut every = tokio::time::interval(REAP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        match pool.upgrade() {
            Some(pool) => pool.reap(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use http::Request;

    /// A listener on a free local port, and its URL.
    async fn listen() -> (TcpListener, UpstreamUrl) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        (listener, url.parse().unwrap())
    }

    /// An upstream answering every request `200` with `body`, closing each connection after
    /// `answers` answers; counts the connections it accepted.
    async fn upstream(body: &'static str, answers: usize) -> (UpstreamUrl, Arc<AtomicUsize>) {
        let (listener, url) = listen().await;
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&accepted);
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buffer = [0; 4096];
                    for _ in 0..answers {
                        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buffer).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => seen.extend_from_slice(&buffer[..n]),
                            }
                        }
                        let end = seen.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        seen.drain(..end);
                        let answer =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    impl Pool {
        async fn send_request<B>(
            self: &Arc<Self>,
            target: &UpstreamUrl,
            request: Request<B>,
            added: &[(&HeaderName, HeaderValue)],
        ) -> Result<Response<PooledBody<B>>, SendError>
        where
            B: Body<Data = Bytes> + Unpin,
            B::Error: Into<BoxError>,
        {
            let (parts, body) = request.into_parts();
            self.send(target, &parts, body, added).await
        }
    }

    fn pool(url: &UpstreamUrl, max_idle: usize, keep_idle: Duration) -> Arc<Pool> {
        pool_waiting(url, max_idle, keep_idle, Duration::from_secs(5))
    }

    fn pool_waiting(url: &UpstreamUrl, max_idle: usize, keep_idle: Duration, head: Duration) -> Arc<Pool> {
        let tls = Arc::clone(
            sluice_rules_client::ClientTls::new(None, None)
                .unwrap()
                .rustls_config(),
        );
        let connector = Connector {
            tls,
            timeout: Duration::from_secs(2),
        };
        Pool::new([url], connector, max_idle, keep_idle, head)
    }

    type Empty = http_body_util::Empty<Bytes>;

    /// A GET for `/`.
    fn get(url: &UpstreamUrl) -> Request<Empty> {
        Request::builder()
            .uri("/")
            .header(http::header::HOST, url.authority.as_str())
            .body(Empty::new())
            .unwrap()
    }

    async fn answer(pool: &Arc<Pool>, url: &UpstreamUrl) -> Result<String, SendError> {
        let response = pool.send_request(url, get(url), &[]).await?;
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn one_connection_serves_one_request_after_another() {
        let (url, accepted) = upstream("hello", usize::MAX).await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        for _ in 0..20 {
            assert_eq!(answer(&pool, &url).await.unwrap(), "hello");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_not_used_again() {
        // Every connection answers once, then closes.
        let (url, accepted) = upstream("once", 1).await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        for round in 1..=5 {
            assert_eq!(answer(&pool, &url).await.unwrap(), "once");
            // Let the close arrive before the next request takes the idle connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(accepted.load(Ordering::SeqCst), round);
        }
        pool.reap();
        assert_eq!(
            pool.idle_count(),
            0,
            "the reaper closes connections the upstream closed"
        );
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_closes_its_connection() {
        let (url, accepted) = upstream("a body nobody reads", usize::MAX).await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        let response = pool.send_request(&url, get(&url), &[]).await.unwrap();
        drop(response);
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(answer(&pool, &url).await.unwrap(), "a body nobody reads");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn idle_connections_are_bounded_and_closed_after_their_time() {
        let (url, accepted) = upstream("x", usize::MAX).await;
        let none = pool(&url, 0, Duration::from_secs(60));
        for _ in 0..3 {
            answer(&none, &url).await.unwrap();
        }
        assert_eq!((none.idle_count(), accepted.load(Ordering::SeqCst)), (0, 3));

        let (url, _) = upstream("x", usize::MAX).await;
        let pool = pool(&url, 2, Duration::from_millis(50));
        // Three requests at once need three connections; two are kept.
        let (a, b, c) = tokio::join!(
            pool.send_request(&url, get(&url), &[]),
            pool.send_request(&url, get(&url), &[]),
            pool.send_request(&url, get(&url), &[])
        );
        for response in [a, b, c] {
            response.unwrap().into_body().collect().await.unwrap();
        }
        assert_eq!(pool.idle_count(), 2);
        tokio::time::sleep(Duration::from_millis(60)).await;
        pool.reap();
        assert_eq!(pool.idle_count(), 0, "idle longer than keep_idle");
    }

    #[tokio::test]
    async fn a_short_body_that_came_with_its_head_is_taken_whole_and_frees_its_connection() {
        let (url, accepted) = upstream("hello", usize::MAX).await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        let mut body = pool.send_request(&url, get(&url), &[]).await.unwrap().into_body();
        assert_eq!(body.take_whole(16).as_deref(), Some(&b"hello"[..]));
        drop(body);
        assert_eq!(pool.idle_count(), 1);

        // Longer than the limit: left to stream, whole.
        let mut body = pool.send_request(&url, get(&url), &[]).await.unwrap().into_body();
        assert_eq!(body.take_whole(4), None);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_still_arriving_is_streamed_with_nothing_lost_or_reordered() {
        let (listener, url) = listen().await;
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 4096];
            let _ = socket.read(&mut buffer).await.unwrap();
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            socket.write_all(b"world").await.unwrap();
            let _ = socket.read(&mut buffer).await;
        });
        let pool = pool(&url, 8, Duration::from_secs(60));
        let mut body = pool.send_request(&url, get(&url), &[]).await.unwrap().into_body();
        assert_eq!(body.take_whole(16), None, "half of it has arrived");
        assert_eq!(body.collect().await.unwrap().to_bytes(), "helloworld");
    }

    #[tokio::test]
    async fn a_head_late_past_its_timeout_fails_the_exchange_and_a_kept_timer_rearms() {
        let (url, accepted) = upstream("quick", usize::MAX).await;
        let pool = pool_waiting(&url, 8, Duration::from_secs(60), Duration::from_millis(100));
        assert_eq!(answer(&pool, &url).await.unwrap(), "quick");
        // The connection's timer fires while it is idle; the next request moves it on.
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(answer(&pool, &url).await.unwrap(), "quick");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);

        // An upstream that reads the request and never answers.
        let (listener, silent) = listen().await;
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 4096];
            while socket.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
        });
        let pool = pool_waiting(&silent, 8, Duration::from_secs(60), Duration::from_millis(100));
        let started = Instant::now();
        let Err(late) = pool.send_request(&silent, get(&silent), &[]).await else {
            panic!("a silent upstream answered");
        };
        assert!(matches!(late, SendError::HeadTimeout(_)), "{late}");
        assert!(started.elapsed() >= Duration::from_millis(100));
        assert_eq!(
            pool.idle_count(),
            0,
            "the timed-out exchange's connection is not kept"
        );
    }

    #[tokio::test]
    async fn an_upstream_outside_the_pool_is_refused_not_connected() {
        let (url, _) = upstream("x", usize::MAX).await;
        let (other, accepted) = upstream("x", usize::MAX).await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        let Err(refused) = pool.send_request(&other, get(&other), &[]).await else {
            panic!("sent to an upstream outside the pool");
        };
        assert!(
            matches!(refused, SendError::Connect(ConnectError::Unknown(_))),
            "{refused}"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
    }

    /// An upstream that answers its first request with `answer` once it has read the head,
    /// then does what `then` does with the socket.
    async fn answering(answer: &'static [u8], linger: Duration) -> UpstreamUrl {
        let (listener, url) = listen().await;
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buffer = [0; 4096];
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buffer[..n]),
                        }
                    }
                    socket.write_all(answer).await.unwrap();
                    tokio::time::sleep(linger).await;
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn a_chunked_answer_with_trailers_frees_its_connection_after_them() {
        let url = answering(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nx-sum: 5\r\n\r\n",
            Duration::from_secs(5),
        )
        .await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        let mut body = pool.send_request(&url, get(&url), &[]).await.unwrap().into_body();
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(data, "hello");
        let trailers = body.frame().await.unwrap().unwrap().into_trailers().unwrap();
        assert_eq!(trailers["x-sum"], "5");
        // Servers drop a body after its trailers without asking again.
        drop(body);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn an_answer_before_the_upload_ends_is_read_though_the_upload_is_cut() {
        let url = answering(
            b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 4\r\nconnection: close\r\n\r\nbig!",
            Duration::from_millis(100),
        )
        .await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        let upload = http_body_util::Full::new(Bytes::from(vec![7u8; 32 << 20]));
        let request = Request::post("/").header("host", "up").body(upload).unwrap();
        let response = pool.send_request(&url, request, &[]).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "big!");
        assert_eq!(
            pool.idle_count(),
            0,
            "a connection whose request was cut is not kept"
        );
    }

    #[tokio::test]
    async fn interim_answers_without_end_fail_the_exchange() {
        let (listener, url) = listen().await;
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 4096];
            let _ = socket.read(&mut buffer).await;
            let burst = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(256);
            while socket.write_all(&burst).await.is_ok() {}
        });
        let pool = pool(&url, 8, Duration::from_secs(60));
        let Err(endless) = pool.send_request(&url, get(&url), &[]).await else {
            panic!("an answer came out of interim answers alone");
        };
        assert!(
            matches!(endless, SendError::Exchange(ExchangeError::Interim)),
            "{endless}"
        );
        assert_eq!(pool.idle_count(), 0);
    }

    /// An upstream that reads a chunked request to its end before answering `200`.
    async fn reading_whole_uploads() -> UpstreamUrl {
        let (listener, url) = listen().await;
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut buffer = [0; 4096];
            while !seen.ends_with(b"0\r\n\r\n") {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                }
            }
            let _ = socket
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nread")
                .await;
            let _ = socket.read(&mut buffer).await;
        });
        url
    }

    #[tokio::test]
    async fn the_head_timeout_counts_from_the_uploads_last_progress() {
        let url = reading_whole_uploads().await;
        let pool = pool_waiting(&url, 8, Duration::from_secs(60), Duration::from_millis(150));
        // Sent in pieces over 600 ms, one pause as long as two head timeouts: the upstream
        // answers when it has all of it.
        let pieces = futures_util::stream::unfold(0, |piece| async move {
            match piece {
                0..4 => {
                    tokio::time::sleep(Duration::from_millis(if piece == 2 { 300 } else { 100 })).await;
                    let frame = hyper::body::Frame::data(Bytes::from_static(b"piece"));
                    Some((Ok::<_, std::convert::Infallible>(frame), piece + 1))
                }
                _ => None,
            }
        });
        let request = Request::post("/")
            .header("host", "up")
            .body(http_body_util::StreamBody::new(Box::pin(pieces)))
            .unwrap();
        let started = Instant::now();
        let response = pool.send_request(&url, request, &[]).await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(600));
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.into_body().collect().await.unwrap().to_bytes(), "read");
    }

    #[tokio::test]
    async fn an_upstream_that_stops_taking_the_upload_runs_out_the_head_timeout() {
        let (listener, url) = listen().await;
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 4096];
            let _ = socket.read(&mut buffer).await;
            // Reads no more and answers nothing: the upload fills the socket's buffers.
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let pool = pool_waiting(&url, 8, Duration::from_secs(60), Duration::from_millis(150));
        let upload = http_body_util::Full::new(Bytes::from(vec![7u8; 64 << 20]));
        let request = Request::post("/").header("host", "up").body(upload).unwrap();
        let Err(stalled) = pool.send_request(&url, request, &[]).await else {
            panic!("an upstream reading nothing answered");
        };
        assert!(matches!(stalled, SendError::HeadTimeout(_)), "{stalled}");
    }
}
