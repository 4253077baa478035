//! One request's exchange on an upstream connection, after `pool` has lent the connection
//! and read the answer's head: the rest of the request sent (`Upload`) while the answer's
//! body is read as the server asks for it (`PooledBody`), and the connection handed back to
//! the pool when both have ended, or to a tunnel after `101` (`Upgraded`).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::{HeaderValue, StatusCode};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::body::BoxError;
use super::client::UpstreamStream;
use super::pool::{Connection, OutgoingBody, Pool};
use super::wire::{self, Chunked, Decoded, RequestFraming, ResponseFraming, ResponseHead, WireError};

/// The most interim (1xx) answers read before a request's final answer: more is an upstream
/// sending without end.
pub(super) const MAX_INTERIM: usize = 16;

/// Why an exchange on a connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// The request could not be written.
    #[error("writing the request: {0}")]
    Write(io::Error),
    /// The answer could not be read.
    #[error("reading the answer: {0}")]
    Read(io::Error),
    /// The upstream closed the connection before its answer ended.
    #[error("the upstream closed the connection before its answer ended")]
    Closed,
    /// The answer is not HTTP/1.1 as RFC 9112 writes it.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The request's own body failed (its client went away, or paused too long).
    #[error("the request body failed")]
    RequestBody(#[source] BoxError),
    /// The upstream sent more interim (1xx) answers than any request needs.
    #[error("more than {MAX_INTERIM} interim (1xx) answers")]
    Interim,
    /// The request's body was longer or shorter than its `Content-Length`.
    #[error("the request body's length differs from its Content-Length")]
    RequestLength,
}

impl ExchangeError {
    /// Whether the upstream may have closed an idle connection just as the request went out:
    /// it went without an answer, not a byte of one.
    pub(super) fn unanswered(&self) -> bool {
        use io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        match self {
            Self::Closed => true,
            Self::Read(e) | Self::Write(e) => {
                matches!(e.kind(), BrokenPipe | ConnectionAborted | ConnectionReset)
            }
            _ => false,
        }
    }
}

/// A request's sending: its head, then its body in its framing. Pieces wait in `parts`
/// (at most three: a chunk's size line, its data and its end) until written; the body is
/// asked for its next frame only once they are, so an upload holds one frame at a time.
pub(super) struct Upload<B> {
    head: Vec<u8>,
    head_sent: usize,
    parts: VecDeque<Bytes>,
    body: B,
    framing: RequestFraming,
    sent: u64,
    /// The body has given its last frame (or has none to give).
    body_done: bool,
    /// Why the upstream stopped taking the request, if it did: the rest is not sent, and its
    /// answer (a 413, say) is still read.
    pub(super) cut: Option<io::Error>,
}

impl<B> Upload<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    pub(super) fn new(head: Vec<u8>, body: B, framing: RequestFraming) -> Self {
        let body_done = matches!(framing, RequestFraming::Empty | RequestFraming::Length(0));
        Self {
            head,
            head_sent: 0,
            parts: VecDeque::new(),
            body,
            framing,
            sent: 0,
            body_done,
            cut: None,
        }
    }

    /// Makes the request ready to be sent again from its start (it has no body).
    pub(super) fn restart(&mut self) {
        self.head_sent = 0;
        self.cut = None;
    }

    /// Writes as much of the request as `io` and the body allow; ready once all is written.
    pub(super) fn poll_send(
        &mut self,
        io: &mut UpstreamStream,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), ExchangeError>> {
        loop {
            if self.cut.is_some() {
                return Poll::Ready(Ok(()));
            }
            let written = match ready!(self.poll_write_parts(io, cx)) {
                Ok(()) if self.body_done => ready!(Pin::new(&mut *io).poll_flush(cx)),
                written => written,
            };
            if let Err(e) = written {
                self.parts.clear();
                self.cut = Some(e);
                return Poll::Ready(Ok(()));
            }
            if self.body_done {
                return Poll::Ready(Ok(()));
            }
            let frame = match ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Err(ExchangeError::RequestBody(e.into()))),
                None => {
                    self.body_done = true;
                    match self.framing {
                        RequestFraming::Chunked => self.parts.push_back(Bytes::from_static(wire::LAST_CHUNK)),
                        RequestFraming::Length(length) if self.sent != length => {
                            return Poll::Ready(Err(ExchangeError::RequestLength));
                        }
                        _ => {}
                    }
                    continue;
                }
            };
            match frame.into_data() {
                Ok(data) if data.is_empty() => {}
                Ok(data) => {
                    self.sent += data.len() as u64;
                    match self.framing {
                        RequestFraming::Length(length) if self.sent <= length => self.parts.push_back(data),
                        RequestFraming::Chunked => {
                            let mut size = Vec::with_capacity(18);
                            wire::write_chunk_size(&mut size, data.len());
                            self.parts.push_back(Bytes::from(size));
                            self.parts.push_back(data);
                            self.parts.push_back(Bytes::from_static(wire::CHUNK_END));
                        }
                        _ => return Poll::Ready(Err(ExchangeError::RequestLength)),
                    }
                }
                // A client's trailers are not forwarded: they would pass by the hop-by-hop
                // strip and the forwarding headers, and an upstream may merge them into
                // its headers.
                Err(_trailers) => {}
            }
        }
    }

    /// Writes the head's rest and the waiting parts, in as few calls as the socket allows.
    fn poll_write_parts(&mut self, io: &mut UpstreamStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.head_sent < self.head.len() || !self.parts.is_empty() {
            let mut slices = [IoSlice::new(&[]); 4];
            let mut count = 0;
            if self.head_sent < self.head.len() {
                slices[0] = IoSlice::new(&self.head[self.head_sent..]);
                count = 1;
            }
            for part in self.parts.iter().take(slices.len() - count) {
                slices[count] = IoSlice::new(part);
                count += 1;
            }
            let mut written = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count]))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            let from_head = written.min(self.head.len() - self.head_sent);
            self.head_sent += from_head;
            written -= from_head;
            while written > 0 {
                let Some(part) = self.parts.front_mut() else { break };
                let taken = written.min(part.len());
                part.advance(taken);
                written -= taken;
                if part.is_empty() {
                    self.parts.pop_front();
                }
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<B> Upload<B> {
    /// Whether all of the request is written.
    pub(super) fn is_done(&self) -> bool {
        self.cut.is_none() && self.body_done && self.parts.is_empty() && self.head_sent == self.head.len()
    }

    /// How far the request has gone: its head's bytes written and its body's taken (each
    /// body frame is taken once the one before is written).
    pub(super) fn progress(&self) -> u64 {
        self.head_sent as u64 + self.sent
    }

    /// Whether all that was taken is written and the body's next frame is awaited.
    pub(super) fn waits_for_body(&self) -> bool {
        self.cut.is_none() && !self.body_done && self.parts.is_empty() && self.head_sent == self.head.len()
    }
}

/// Where the reading of a response body is.
enum Reading {
    /// This many bytes are left.
    Length(u64),
    /// Chunks.
    Chunked(Chunked),
    /// Everything until the upstream closes.
    UntilClose,
    /// Read to its end.
    Ended,
    /// Broken: nothing more comes.
    Failed,
}

/// A response body from a pooled connection, which also sends what is left of the request.
pub struct PooledBody<B = OutgoingBody> {
    upload: Upload<B>,
    reading: Reading,
    /// Whether the answer lets the connection carry another request.
    keep_alive: bool,
    /// The protocol a `101` switches to.
    upgrade: Option<HeaderValue>,
    /// `None` once given up (broken, or handed to an upgrade).
    connection: Option<Box<Connection>>,
    pool: Arc<Pool>,
    slot: usize,
}

impl<B> PooledBody<B> {
    /// The body of an answer framed by `framing` on `connection` (lent from `pool`'s list
    /// `slot`), which also sends what is left of `upload`.
    pub(super) fn new(
        upload: Upload<B>,
        head: &mut ResponseHead,
        connection: Box<Connection>,
        pool: Arc<Pool>,
        slot: usize,
    ) -> Self {
        let reading = match head.framing {
            ResponseFraming::Empty | ResponseFraming::Length(0) => Reading::Ended,
            ResponseFraming::Length(length) => Reading::Length(length),
            ResponseFraming::Chunked => Reading::Chunked(Chunked::Size),
            ResponseFraming::UntilClose => Reading::UntilClose,
        };
        Self {
            upload,
            reading,
            keep_alive: head.keep_alive && head.status != StatusCode::SWITCHING_PROTOCOLS,
            upgrade: head.upgrade.take(),
            connection: Some(connection),
            pool,
            slot,
        }
    }

    /// The whole body, when it is 1 to `limit` bytes long by its `Content-Length` and has
    /// already arrived (with the head, as a short answer does): it can then be answered at
    /// once, whole, and the connection is free for the next request.
    pub fn take_whole(&mut self, limit: u64) -> Option<Bytes> {
        let Reading::Length(length) = self.reading else {
            return None;
        };
        let connection = self.connection.as_mut()?;
        let length = usize::try_from(length)
            .ok()
            .filter(|&length| length as u64 <= limit)?;
        if connection.read.len() < length {
            return None;
        }
        self.reading = Reading::Ended;
        Some(connection.read.split_to(length).freeze())
    }

    /// The `Upgrade` value of the answer, when its `Connection` named it.
    pub fn offered_upgrade(&mut self) -> Option<HeaderValue> {
        self.upgrade.take()
    }

    /// The connection, for an upgrade: after `101` it carries the other protocol, with
    /// whatever of it already arrived read first.
    pub fn upgrade(mut self) -> Option<Upgraded> {
        // The request must have been sent whole: its body's rest would otherwise be taken
        // for the new protocol.
        if !self.upload.is_done() {
            return None;
        }
        let connection = self.connection.take()?;
        Some(Upgraded {
            early: connection.read.freeze(),
            io: connection.io,
        })
    }
}

impl<B> Body for PooledBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = self.get_mut();
        let Some(connection) = this.connection.as_mut() else {
            return Poll::Ready(None);
        };
        if matches!(this.reading, Reading::Ended | Reading::Failed) {
            return Poll::Ready(None);
        }
        if let Poll::Ready(Err(e)) = this.upload.poll_send(&mut connection.io, cx) {
            return this.fail(e);
        }
        loop {
            let data = match &mut this.reading {
                Reading::Ended | Reading::Failed => return Poll::Ready(None),
                Reading::Length(left) if !connection.read.is_empty() => {
                    let take = usize::try_from(*left)
                        .map_or(connection.read.len(), |left| left.min(connection.read.len()));
                    *left -= take as u64;
                    if *left == 0 {
                        this.reading = Reading::Ended;
                    }
                    connection.read.split_to(take).freeze()
                }
                Reading::UntilClose if !connection.read.is_empty() => connection.read.split().freeze(),
                Reading::Chunked(decoder) => match decoder.decode(&mut connection.read) {
                    Ok(Decoded::Data(data)) => data,
                    Ok(Decoded::Trailers(trailers)) => {
                        // The last frame: servers do not ask again after trailers.
                        this.reading = Reading::Ended;
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    Ok(Decoded::End) => {
                        this.reading = Reading::Ended;
                        return Poll::Ready(None);
                    }
                    Err(e) => return this.fail(e.into()),
                    Ok(Decoded::More) => match ready!(connection.poll_fill(cx)) {
                        Ok(0) => return this.fail(ExchangeError::Closed),
                        Ok(_) => continue,
                        Err(e) => return this.fail(ExchangeError::Read(e)),
                    },
                },
                Reading::Length(_) | Reading::UntilClose => match ready!(connection.poll_fill(cx)) {
                    Ok(0) if matches!(this.reading, Reading::UntilClose) => {
                        this.reading = Reading::Ended;
                        return Poll::Ready(None);
                    }
                    Ok(0) => return this.fail(ExchangeError::Closed),
                    Ok(_) => continue,
                    Err(e) => return this.fail(ExchangeError::Read(e)),
                },
            };
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.reading, Reading::Ended | Reading::Failed)
    }

    fn size_hint(&self) -> SizeHint {
        match self.reading {
            Reading::Length(left) => SizeHint::with_exact(left),
            Reading::Ended | Reading::Failed => SizeHint::with_exact(0),
            Reading::Chunked(_) | Reading::UntilClose => SizeHint::default(),
        }
    }
}

impl<B> PooledBody<B> {
    /// Ends the body with `error`, and its connection.
    fn fail(&mut self, error: ExchangeError) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        self.reading = Reading::Failed;
        self.connection = None;
        Poll::Ready(Some(Err(error)))
    }
}

impl<B> Drop for PooledBody<B> {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        // Only a connection whose exchange ended both ways, with nothing more arrived, can
        // take another; any other closes, which ends the exchange on the upstream's side too.
        if self.keep_alive
            && matches!(self.reading, Reading::Ended)
            && self.upload.is_done()
            && connection.read.is_empty()
        {
            self.pool.keep(self.slot, connection);
        }
    }
}

/// An upstream connection after `101 Switching Protocols`.
pub struct Upgraded {
    /// What of the new protocol arrived with the answer.
    early: Bytes,
    io: UpstreamStream,
}

impl AsyncRead for Upgraded {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.early.is_empty() {
            let take = this.early.len().min(buf.remaining());
            buf.put_slice(&this.early.split_to(take));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
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
