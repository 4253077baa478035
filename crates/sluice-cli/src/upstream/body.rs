//! The bodies `sluice serve` answers with: its own (the demo's, the layer's refusals, the
//! proxy's errors), whole in memory, or an upstream's, streamed frame by frame; and the
//! bound on how long a streamed body may pause.

use std::error::Error as StdError;
use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::exchange::PooledBody;
use crate::connection::Held;

/// What a body's frames fail with.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A response body: made here, or streamed from the upstream. The upstream's is boxed, so a
/// body made here is moved about no larger than a `Full<Bytes>`.
pub enum ServeBody {
    /// Made here, whole.
    Own(Full<Bytes>),
    /// The upstream's, streamed.
    Upstream(Box<UpstreamBody>),
}

/// The upstream's body, and the mark of its request in flight.
pub struct UpstreamBody {
    /// The upstream's body, its pauses bounded.
    body: IdleBody<PooledBody>,
    /// Marks the request in flight on its connection until the body ends or is dropped, so
    /// the connection's idle check does not cut a long download.
    held: Option<Held>,
}

impl ServeBody {
    /// The upstream's `body`, its pauses bounded by `idle`.
    pub fn upstream(body: PooledBody, idle: Duration) -> Self {
        Self::Upstream(Box::new(UpstreamBody {
            body: IdleBody::new(body, idle),
            held: None,
        }))
    }

    /// Carries `held` until this body is done (dropped at once for a body made here: it is
    /// written in one go).
    #[inline]
    pub fn hold(&mut self, mark: Held) {
        if let Self::Upstream(upstream) = self {
            upstream.held = Some(mark);
        }
    }
}

impl From<&'static str> for ServeBody {
    #[inline]
    fn from(text: &'static str) -> Self {
        Self::Own(Full::new(Bytes::from_static(text.as_bytes())))
    }
}

impl From<Bytes> for ServeBody {
    fn from(bytes: Bytes) -> Self {
        Self::Own(Full::new(bytes))
    }
}

impl Body for ServeBody {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            Self::Own(full) => Pin::new(full).poll_frame(cx).map_err(|never| match never {}),
            Self::Upstream(upstream) => {
                let UpstreamBody { body, held } = upstream.as_mut();
                if let Some(mark) = held {
                    mark.asked_again();
                }
                let frame = ready!(Pin::new(body).poll_frame(cx));
                match (&frame, held.as_mut()) {
                    (Some(Ok(_)), Some(mark)) => mark.frame_sent(),
                    // The end, or the error that ends it: the request is answered.
                    _ => drop(held.take()),
                }
                Poll::Ready(frame)
            }
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            Self::Own(full) => full.is_end_stream(),
            Self::Upstream(upstream) => upstream.body.is_end_stream(),
        }
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Own(full) => full.size_hint(),
            Self::Upstream(upstream) => upstream.body.size_hint(),
        }
    }
}

/// A body that fails when no frame comes for `idle`: a peer that stops sending mid-body
/// (an upstream that hangs, a client that stalls an upload) is cut rather than held open.
/// The timer is made only when the body first has to wait, and moved only when it waits
/// again after progress.
pub struct IdleBody<B> {
    inner: B,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    progressed: bool,
}

/// The error of a body that paused too long.
#[derive(Debug, thiserror::Error)]
#[error("no data for {0:?} in the middle of a body")]
pub struct IdleTimeout(pub Duration);

impl<B> IdleBody<B> {
    /// `inner`, failing after `idle` without a frame.
    pub fn new(inner: B, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            timer: None,
            progressed: false,
        }
    }
}

impl<B> Body for IdleBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.progressed = true;
            return Poll::Ready(frame.map(|frame| frame.map_err(Into::into)));
        }
        let idle = this.idle;
        let timer = match &mut this.timer {
            Some(timer) => {
                if std::mem::take(&mut this.progressed) {
                    timer.as_mut().reset(Instant::now() + idle);
                }
                timer
            }
            None => {
                this.progressed = false;
                this.timer.insert(Box::pin(tokio::time::sleep(idle)))
            }
        };
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(IdleTimeout(this.idle))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
