//! The proxy's keep-alive connections to its upstreams, and the exchange of one request on
//! one of them.
//!
//! Each connection is hyper's bare HTTP/1.1 client connection, and it has no task of its own:
//! the task of the request that holds it drives it, while it waits for the response head and
//! then while the server asks for the response body's frames. A request thus costs no
//! hand-off between tasks, no wake-up of a second task, and no channel to a connection task
//! and back. When the body has ended, the connection returns to its upstream's idle list,
//! tagged with the serving thread that used it (each thread runs a runtime of its own, and a
//! socket is best driven by the runtime it was registered with); a request takes the most
//! recently used idle connection of its own thread, or connects.
//!
//! An idle connection is driven by nobody: a reaper task looks at every idle connection once
//! a second, closes those the upstream closed and those idle longer than `POOL_IDLE`, so
//! neither a dead socket nor an unused one outlives a few seconds. A request that gives up
//! its connection before the response body ended (the client left, a timeout) drops it, and
//! with it the exchange: HTTP/1.1 cannot cancel one request and keep the connection.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::{self, SendRequest};
use sluice_config::UpstreamUrl;
use tokio::time::{Instant, Sleep};

use super::body::IdleBody;
use super::client::{ConnectError, Connector};

/// What a forwarded request's body is.
pub type OutgoingBody = IdleBody<Incoming>;

/// A connection's state machine, boxed: hyper's upgrade-capable connection cannot be named.
type Driver = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// How often idle connections are looked at.
const REAP_EVERY: Duration = Duration::from_secs(1);

/// How many times a request that a pooled connection could not take is offered to another
/// before a new connection is made for it.
const MAX_STALE_TRIES: usize = 4;

/// Keep-alive connections to a set of upstreams.
pub struct Pool<B = OutgoingBody> {
    /// One idle list per upstream, found by its URL (a handful: a linear search is fastest).
    upstreams: Vec<(UpstreamUrl, Mutex<Vec<Idle<B>>>)>,
    connector: Connector,
    /// The most idle connections kept per upstream.
    max_idle: usize,
    /// How long an idle connection is kept.
    keep_idle: Duration,
    /// The longest from a request sent to its response head.
    head_timeout: Duration,
}

/// A connection in an idle list.
struct Idle<B> {
    connection: Connection<B>,
    since: Instant,
    thread: usize,
}

/// One upstream connection: the handle requests are sent through, and what drives it.
struct Connection<B> {
    sender: SendRequest<B>,
    /// `None` once the connection has ended.
    driver: Option<Driver>,
    /// The head timeout of the request in flight. One timer a connection, moved forward for
    /// each request: a later deadline is set without touching the runtime's timer wheel,
    /// where a timer made and dropped per request would be inserted and removed each time.
    head_timer: Pin<Box<Sleep>>,
}

impl<B> Connection<B> {
    /// Drives the connection as far as it goes; false once it has ended (closed by the
    /// upstream, broken, or done after `Connection: close`).
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(driver) = &mut self.driver else {
            return false;
        };
        match driver.as_mut().poll(cx) {
            Poll::Pending => true,
            Poll::Ready(ended) => {
                if let Err(e) = ended {
                    tracing::debug!("upstream connection ended: {e}");
                }
                self.driver = None;
                false
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
    Exchange(#[from] hyper::Error),
    /// No response head within the head timeout (the exchange is dropped, and its
    /// connection).
    #[error("no response within {0:?}")]
    HeadTimeout(Duration),
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

impl<B> Pool<B>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
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
        let mut lists: Vec<(UpstreamUrl, Mutex<Vec<Idle<B>>>)> = Vec::new();
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

    /// Sends `request` (its URI in origin form, its `Host` set) to `target` and waits for the
    /// response head, at most the head timeout once the request is sent. The response's body drives the connection on; the connection returns
    /// to the idle list when that body has ended.
    pub async fn send(
        self: &Arc<Self>,
        target: &UpstreamUrl,
        mut request: Request<B>,
    ) -> Result<Response<PooledBody<B>>, SendError> {
        let slot = (self.upstreams.iter())
            .position(|(url, _)| same_upstream(url, target))
            .ok_or_else(|| ConnectError::Unknown(target.to_string()))?;
        let mut stale = 0;
        loop {
            let (mut connection, pooled) = match self.take_idle(slot) {
                Some(connection) if stale < MAX_STALE_TRIES => (connection, true),
                _ => (self.connect(target).await?, false),
            };
            // A pooled connection is driven first: it settles what happened while it was
            // idle (the upstream's close, the end of the previous exchange).
            if pooled && !poll_fn(|cx| Poll::Ready(connection.drive(cx))).await {
                stale += 1;
                continue;
            }
            let deadline = Instant::now() + self.head_timeout;
            connection.head_timer.as_mut().reset(deadline);
            let mut answer = std::pin::pin!(connection.sender.try_send_request(request));
            let answer = poll_fn(|cx| {
                connection.drive(cx);
                if let Poll::Ready(answer) = answer.as_mut().poll(cx) {
                    return Poll::Ready(Some(answer));
                }
                connection.head_timer.as_mut().poll(cx).map(|()| None)
            })
            .await;
            let Some(answer) = answer else {
                return Err(SendError::HeadTimeout(self.head_timeout));
            };
            match answer {
                Ok(response) => {
                    let lease = Lease {
                        connection: Some(connection),
                        pool: Arc::clone(self),
                        slot,
                    };
                    return Ok(response.map(|body| PooledBody {
                        body,
                        lease,
                        ended: false,
                        early: None,
                    }));
                }
                Err(mut refused) => match refused.take_message() {
                    // Not sent: the connection was not ready for it. Another is tried.
                    Some(unsent) if pooled => {
                        request = unsent;
                        stale += 1;
                    }
                    _ => return Err(refused.into_error().into()),
                },
            }
        }
    }

    /// A new connection to `target`.
    async fn connect(&self, target: &UpstreamUrl) -> Result<Connection<B>, SendError> {
        let stream = self.connector.connect(target).await?;
        let (sender, connection) = http1::Builder::new().handshake(stream).await?;
        Ok(Connection {
            sender,
            driver: Some(Box::pin(connection.with_upgrades())),
            head_timer: Box::pin(tokio::time::sleep(self.head_timeout)),
        })
    }
}

impl<B> Pool<B> {
    /// The most recently used idle connection of this thread to upstream `slot`.
    fn take_idle(&self, slot: usize) -> Option<Connection<B>> {
        let thread = this_thread();
        let mut idle = self.upstreams[slot]
            .1
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let at = idle.iter().rposition(|idle| idle.thread == thread)?;
        Some(idle.swap_remove(at).connection)
    }

    /// Puts `connection` back in `slot`'s idle list, unless the list is full.
    fn keep(&self, slot: usize, connection: Connection<B>) {
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
            idle.retain_mut(|idle| idle.since.elapsed() < self.keep_idle && idle.connection.drive(&mut cx));
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
async fn reap<B>(pool: Weak<Pool<B>>)
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
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

/// A connection lent to one exchange, back in its idle list when the response body ended.
struct Lease<B> {
    connection: Option<Connection<B>>,
    pool: Arc<Pool<B>>,
    slot: usize,
}

/// A response body from a pooled connection: each poll drives the connection first.
pub struct PooledBody<B = OutgoingBody> {
    body: Incoming,
    lease: Lease<B>,
    /// The body has ended (a chunked one does not say so itself afterwards).
    ended: bool,
    /// What a look for a whole body (`poll_arrived`) took and did not use, for `poll_frame`.
    early: Option<Option<Result<Frame<Bytes>, hyper::Error>>>,
}

impl<B> PooledBody<B> {
    /// The whole body, when it is 1 to `limit` bytes long by its `Content-Length` and has
    /// already arrived (with the head, as a short answer does): it can then be answered at
    /// once, whole, and the connection is free for the next request. Whatever the look
    /// yields otherwise is kept for `poll_frame`; nothing is lost or reordered.
    pub fn poll_arrived(&mut self, cx: &mut Context<'_>, limit: u64) -> Option<Bytes> {
        let length = (self.body.size_hint().exact()).filter(|length| (1..=limit).contains(length))?;
        match Pin::new(&mut *self).poll_frame(cx) {
            Poll::Pending => None,
            Poll::Ready(Some(Ok(frame)))
                if self.ended && frame.data_ref().is_some_and(|data| data.len() as u64 == length) =>
            {
                frame.into_data().ok()
            }
            Poll::Ready(other) => {
                self.early = Some(other);
                None
            }
        }
    }
}

impl<B: Send + 'static> PooledBody<B> {
    /// Hands the connection over to a task of its own, for an upgrade (the connection is
    /// not reused: after `101` it carries the other protocol).
    pub fn upgrade(mut self) {
        if let Some(driver) = self
            .lease
            .connection
            .take()
            .and_then(|connection| connection.driver)
        {
            tokio::spawn(driver);
        }
    }
}

impl<B> Body for PooledBody<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(early) = this.early.take() {
            return Poll::Ready(early);
        }
        if let Some(connection) = &mut this.lease.connection {
            connection.drive(cx);
        }
        let frame = ready!(Pin::new(&mut this.body).poll_frame(cx));
        match &frame {
            // A broken body: the connection is not reused.
            Some(Err(_)) => this.lease.connection = None,
            Some(Ok(_)) => this.ended = this.body.is_end_stream(),
            None => this.ended = true,
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> Drop for PooledBody<B> {
    fn drop(&mut self) {
        let Some(connection) = self.lease.connection.take() else {
            return;
        };
        // Only a connection whose exchange ended can take another; one dropped mid-body
        // closes, which ends the exchange on the upstream's side too.
        if (self.ended || self.body.is_end_stream())
            && connection.driver.is_some()
            && !connection.sender.is_closed()
        {
            self.lease.pool.keep(self.lease.slot, connection);
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

    /// An upstream answering every request `200` with `body`, closing each connection after
    /// `answers` answers; counts the connections it accepted.
    async fn upstream(body: &'static str, answers: usize) -> (UpstreamUrl, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: UpstreamUrl = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
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

    fn pool(url: &UpstreamUrl, max_idle: usize, keep_idle: Duration) -> Arc<Pool<Empty>> {
        pool_waiting(url, max_idle, keep_idle, Duration::from_secs(5))
    }

    fn pool_waiting(
        url: &UpstreamUrl,
        max_idle: usize,
        keep_idle: Duration,
        head: Duration,
    ) -> Arc<Pool<Empty>> {
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

    async fn answer(pool: &Arc<Pool<Empty>>, url: &UpstreamUrl) -> Result<String, SendError> {
        let response = pool.send(url, get(url)).await?;
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
        let response = pool.send(&url, get(&url)).await.unwrap();
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
            pool.send(&url, get(&url)),
            pool.send(&url, get(&url)),
            pool.send(&url, get(&url))
        );
        for response in [a, b, c] {
            response.unwrap().into_body().collect().await.unwrap();
        }
        assert_eq!(pool.idle_count(), 2);
        tokio::time::sleep(Duration::from_millis(60)).await;
        pool.reap();
        assert_eq!(pool.idle_count(), 0, "idle longer than keep_idle");
    }

    /// Polls `body` once for a whole body of at most `limit` bytes.
    async fn arrived(body: &mut PooledBody<Empty>, limit: u64) -> Option<Bytes> {
        poll_fn(|cx| Poll::Ready(body.poll_arrived(cx, limit))).await
    }

    #[tokio::test]
    async fn a_short_body_that_came_with_its_head_is_taken_whole_and_frees_its_connection() {
        let (url, accepted) = upstream("hello", usize::MAX).await;
        let pool = pool(&url, 8, Duration::from_secs(60));
        let mut body = pool.send(&url, get(&url)).await.unwrap().into_body();
        assert_eq!(arrived(&mut body, 16).await.as_deref(), Some(&b"hello"[..]));
        drop(body);
        assert_eq!(pool.idle_count(), 1);

        // Longer than the limit: left to stream, whole.
        let mut body = pool.send(&url, get(&url)).await.unwrap().into_body();
        assert_eq!(arrived(&mut body, 4).await, None);
        assert_eq!(body.collect().await.unwrap().to_bytes(), "hello");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_still_arriving_is_streamed_with_nothing_lost_or_reordered() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: UpstreamUrl = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
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
        let mut body = pool.send(&url, get(&url)).await.unwrap().into_body();
        // The head may come before its first part: look until the first part is taken.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(arrived(&mut body, 16).await, None);
        assert!(body.early.is_some(), "the first part was taken by the look");
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
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent: UpstreamUrl = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buffer = [0; 4096];
            while socket.read(&mut buffer).await.is_ok_and(|n| n > 0) {}
        });
        let pool = pool_waiting(&silent, 8, Duration::from_secs(60), Duration::from_millis(100));
        let started = Instant::now();
        let Err(late) = pool.send(&silent, get(&silent)).await else {
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
        let Err(refused) = pool.send(&other, get(&other)).await else {
            panic!("sent to an upstream outside the pool");
        };
        assert!(
            matches!(refused, SendError::Connect(ConnectError::Unknown(_))),
            "{refused}"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
    }
}
