//! One connection's life: served until the client leaves, until it starts no request for too
//! long, or until the server shuts down (an in-flight request finishes first).
//!
//! hyper's own header-read timeout arms a timer for every request (an allocation, a wheel
//! insert and a removal, measured in docs/BENCHMARKS.md); the idle check here looks at a
//! request counter once per period instead.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// A connection being served, which can be asked to close once its request in flight is
/// answered (hyper's HTTP/1.1 connection with upgrades, its HTTP/2 connection).
pub trait Closable: Future {
    /// Finishes the request in flight, then closes.
    fn close_gracefully(self: Pin<&mut Self>);
}

/// The requests started and answered on one connection, counted by its handler, and the
/// frames of the upstream bodies it streams.
#[derive(Debug, Default)]
pub struct Activity {
    started: AtomicU64,
    answered: AtomicU64,
    /// Frames of upstream bodies handed to the connection.
    frames: AtomicU64,
    /// Upstream bodies whose last frame the connection has not come back for: a client that
    /// does not read.
    unread: AtomicU64,
}

impl Activity {
    /// Counts a request. One connection is served on one thread (each serving thread runs its
    /// own single-threaded runtime, its HTTP/2 streams included), so a load and a store do (no
    /// locked instruction on the request path).
    pub fn started(&self) {
        bump(&self.started);
    }

    /// Counts a request answered (its response made, to be written).
    pub fn answered(&self) {
        bump(&self.answered);
    }

    fn count(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// What changes while the connection makes progress: requests started, frames written.
    fn progress(&self) -> u64 {
        self.count().wrapping_add(self.frames.load(Ordering::Relaxed))
    }

    /// Whether a request is being answered without the client holding it up: one waiting for
    /// capacity (`on_excess: wait`) or for an upstream (each bounded by its own timeout) may
    /// take longer than the idle timeout, and must not be cut by it; a body the client has
    /// stopped reading is the client's stall.
    fn in_flight(&self) -> bool {
        self.answered.load(Ordering::Relaxed) != self.count() && self.unread.load(Ordering::Relaxed) == 0
    }
}

/// A request whose answer is not made at once (held by the limiter, or forwarded to the
/// upstream, its body streamed), counted answered on its connection's [`Activity`] when
/// dropped: made and handed over, or given up by a client that left.
/// A streamed body tells it each frame it hands over and each time it waits for the
/// upstream, so the idle check can tell a client that stopped reading.
pub struct Held {
    activity: Arc<Activity>,
    /// A frame was handed over and the connection has not asked for the next one yet.
    unread: bool,
}

impl Held {
    /// Marks a request of `activity` in flight.
    pub fn new(activity: &Arc<Activity>) -> Self {
        Self {
            activity: Arc::clone(activity),
            unread: false,
        }
    }

    /// A frame of the answer was handed to the connection, to write.
    pub fn frame_sent(&mut self) {
        bump(&self.activity.frames);
        if !self.unread {
            self.unread = true;
            bump(&self.activity.unread);
        }
    }

    /// The connection asked for more: the frames before were written.
    pub fn asked_again(&mut self) {
        if std::mem::take(&mut self.unread) {
            drop_one(&self.activity.unread);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.asked_again();
        self.activity.answered();
    }
}

fn drop_one(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Relaxed);
}

fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
}

/// The live connections: how many, and the signal that closes them.
#[derive(Clone)]
pub struct Connections {
    stop: watch::Sender<bool>,
    live: Arc<Live>,
}

#[derive(Default)]
struct Live {
    count: AtomicUsize,
    all_closed: Notify,
}

/// How many connections are open, read from elsewhere.
#[derive(Clone)]
pub struct OpenConnections(Arc<Live>);

impl OpenConnections {
    /// Connections open now.
    pub fn get(&self) -> usize {
        self.0.count.load(Ordering::Acquire)
    }
}

/// Counts a connection as live until dropped.
pub struct Admitted(Arc<Live>);

impl Drop for Admitted {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.all_closed.notify_waiters();
        }
    }
}

impl Connections {
    pub fn new() -> Self {
        Self {
            stop: watch::Sender::new(false),
            live: Arc::default(),
        }
    }

    /// How many connections are open.
    pub fn count(&self) -> usize {
        self.live.count.load(Ordering::Acquire)
    }

    /// A handle that reads [`Connections::count`] from elsewhere (the metrics).
    pub fn open(&self) -> OpenConnections {
        OpenConnections(Arc::clone(&self.live))
    }

    /// Counts a connection just accepted as open until the returned mark is dropped: from
    /// before its first bytes or its TLS handshake, so a drain waits for it too.
    pub fn admit(&self) -> Admitted {
        self.live.count.fetch_add(1, Ordering::AcqRel);
        Admitted(Arc::clone(&self.live))
    }

    /// Completes when the server stops: a connection not yet served (its first bytes, its
    /// handshake) is dropped then rather than waited for.
    pub async fn stopping(&self) {
        let mut stop = self.stop.subscribe();
        // An error means the sender is gone: the server is going away too.
        let _ = stop.wait_for(|stop| *stop).await;
    }

    /// Drives `connection` (counted by `admitted`) to its end, closing it gracefully when it has started no request
    /// (`activity`) for an idle period and none is being answered, or when
    /// [`Connections::shutdown`] is called; one that has still not closed a period after that
    /// is dropped. So a client that opens a connection and sends nothing is closed after one
    /// to two periods, and one that sends a request head too slowly (slowloris) after two to
    /// three; one whose request waits for capacity or for an upstream stays open until it is
    /// answered, and one that stops reading a streamed answer is closed after two to three
    /// periods without a frame written.
    pub fn serve<C>(
        &self,
        admitted: Admitted,
        connection: C,
        activity: Arc<Activity>,
        idle_timeout: Duration,
    ) -> impl Future<Output = C::Output> + Send + 'static
    where
        C: Closable<Output = Result<(), hyper::Error>> + Send + 'static,
    {
        let guard = admitted;
        let mut stop = self.stop.subscribe();
        async move {
            let _guard = guard;
            let mut connection = pin!(connection);
            let mut stopped = pin!(async move {
                // An error means the sender is gone: the server is going away too.
                let _ = stop.wait_for(|stop| *stop).await;
            });
            let mut idle = pin!(tokio::time::sleep(idle_timeout));
            let mut seen = activity.progress();
            let mut closing = false;
            loop {
                tokio::select! {
                    biased;
                    done = connection.as_mut() => return done,
                    () = stopped.as_mut(), if !closing => {
                        connection.as_mut().close_gracefully();
                        closing = true;
                    }
                    () = idle.as_mut() => {
                        let now = activity.progress();
                        if now != seen || (activity.in_flight() && !closing) {
                            seen = now;
                        } else if !closing {
                            tracing::debug!("closing a connection idle for {idle_timeout:?}");
                            connection.as_mut().close_gracefully();
                            closing = true;
                        } else {
                            // Still not closed a period later: stuck in a request head that
                            // never ends (a graceful close waits for it), or in its answer.
                            tracing::debug!("dropping a connection that did not close");
                            return Ok(());
                        }
                        idle.as_mut().reset(tokio::time::Instant::now() + idle_timeout);
                    }
                }
            }
        }
    }

    /// Asks every connection to close once its in-flight request is answered, and waits
    /// until all are closed.
    pub async fn shutdown(&self) {
        self.stop.send_replace(true);
        loop {
            let closed = self.live.all_closed.notified();
            if self.count() == 0 {
                return;
            }
            closed.await;
        }
    }
}
