//! Upgraded connections (WebSocket and the like): once the upstream switches protocols, the
//! client's connection and the upstream's are joined and bytes copied both ways until either
//! side closes, or nothing crosses for the idle timeout. The limit applied to the upgrade
//! request; the tunnel holds its client connection's place under `max_connections`, so
//! upgraded connections stay bounded.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::exchange::Upgraded;

/// A client connection's place under `max_connections`, put in an upgrade request's
/// extensions by the server so the tunnel can keep it after the HTTP connection ends.
#[derive(Clone)]
pub struct ConnectionPlace(
    #[expect(
        dead_code,
        reason = "held, not read: the place frees when the last holder ends"
    )]
    pub Arc<OwnedSemaphorePermit>,
);

/// Joins the two sides of an upgrade once the client's is ready, on a task of its own. The
/// tunnel is closed when no byte has crossed it either way for `idle`.
pub fn spawn(client: OnUpgrade, upstream: Upgraded, place: Option<ConnectionPlace>, idle: Duration) {
    tokio::spawn(async move {
        let _place = place;
        let client = match client.await {
            Ok(client) => client,
            Err(e) => {
                tracing::debug!("upgrade not completed: {e}");
                return;
            }
        };
        let started = Instant::now();
        let last = AtomicU64::new(0);
        let mut client = Watched::new(TokioIo::new(client), started, &last);
        let mut upstream = Watched::new(upstream, started, &last);
        let watch = async {
            loop {
                let since = Duration::from_millis(last.load(Ordering::Relaxed));
                let deadline = started + since + idle;
                if Instant::now() >= deadline {
                    return;
                }
                tokio::time::sleep_until(deadline).await;
            }
        };
        tokio::select! {
            copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match copied {
                Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
                Err(e) => tracing::debug!("upgraded connection broke: {e}"),
            },
            () = watch => tracing::debug!("upgraded connection idle for {idle:?}: closed"),
        }
    });
}

/// One side of a tunnel, noting when it last read a byte (in milliseconds since `started`).
struct Watched<'a, T> {
    io: T,
    started: Instant,
    last: &'a AtomicU64,
}

impl<'a, T> Watched<'a, T> {
    fn new(io: T, started: Instant, last: &'a AtomicU64) -> Self {
        Self { io, started, last }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<'_, T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            let since = u64::try_from(this.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            this.last.store(since, Ordering::Relaxed);
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<'_, T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
