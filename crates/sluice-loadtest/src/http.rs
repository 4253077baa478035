//! A minimal HTTP/1.1 client for one keep-alive connection: write a request, read the status
//! and a `Content-Length` body. Enough for a load generator, and cheap per request.

use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response head that does not fit in this is an error.
const MAX_HEAD: usize = 64 * 1024;

/// Why a request on a connection failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("connection closed by the server before a full response")]
    Closed,
    #[error("malformed response: {0}")]
    Malformed(&'static str),
}

/// What the load generator needs of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    pub status: u16,
    /// The server said `Connection: close`.
    pub close: bool,
}

/// One connection with a read buffer holding bytes not yet consumed.
pub(crate) struct Connection {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Connection {
    pub async fn connect(addr: SocketAddr) -> io::Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Connection {
            stream,
            buf: vec![0; 8192],
            start: 0,
            end: 0,
        })
    }

    /// Sends `request` (a whole HTTP/1.1 request) and reads one response.
    pub async fn send(&mut self, request: &[u8]) -> Result<Response, HttpError> {
        self.stream.write_all(request).await?;
        let head_len = loop {
            if let Some(i) = find_head_end(&self.buf[self.start..self.end]) {
                break i;
            }
            if self.end - self.start >= MAX_HEAD {
                return Err(HttpError::Malformed("response head over 64 KiB"));
            }
            self.fill().await?;
        };
        let head = &self.buf[self.start..self.start + head_len];
        let parsed = parse_head(head)?;
        self.start += head_len;
        let mut body_left = parsed.content_length;
        loop {
            let available = (self.end - self.start).min(body_left);
            self.start += available;
            body_left -= available;
            if body_left == 0 {
                break;
            }
            self.fill().await?;
        }
        Ok(Response {
            status: parsed.status,
            close: parsed.close,
        })
    }

    /// Reads more bytes, compacting or growing the buffer first.
    async fn fill(&mut self) -> Result<(), HttpError> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.end == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        let n = self.stream.read(&mut self.buf[self.end..]).await?;
        if n == 0 {
            return Err(HttpError::Closed);
        }
        self.end += n;
        Ok(())
    }
}

/// The length of the head including its blank line, once it is complete.
fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

struct Head {
    status: u16,
    content_length: usize,
    close: bool,
}

fn parse_head(head: &[u8]) -> Result<Head, HttpError> {
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let status_line = lines.next().ok_or(HttpError::Malformed("no status line"))?;
    if !status_line.starts_with(b"HTTP/1.") || status_line.len() < 12 {
        return Err(HttpError::Malformed("status line is not HTTP/1.x"));
    }
    let status = std::str::from_utf8(&status_line[9..12])
        .ok()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or(HttpError::Malformed("status code is not a number"))?;
    let mut content_length = None;
    let mut close = status_line.starts_with(b"HTTP/1.0");
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .ok_or(HttpError::Malformed("Content-Length is not a number"))?;
            content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return Err(HttpError::Malformed("chunked bodies are not supported"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            close = value.eq_ignore_ascii_case(b"close");
        }
    }
    // 1xx, 204 and 304 have no body; anything else must say how long it is.
    let bodiless = status < 200 || status == 204 || status == 304;
    let content_length = match content_length {
        Some(n) => n,
        None if bodiless => 0,
        None => return Err(HttpError::Malformed("no Content-Length")),
    };
    Ok(Head {
        status,
        content_length,
        close,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_length_and_close() {
        let head = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 14\r\nConnection: close\r\n\r\n";
        let parsed = parse_head(head).unwrap();
        assert_eq!(
            (parsed.status, parsed.content_length, parsed.close),
            (429, 14, true)
        );
        assert_eq!(find_head_end(b"HTTP/1.1 200 OK\r\n\r\nbody"), Some(19));
    }

    #[test]
    fn rejects_what_it_cannot_frame() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert_eq!(
            parse_head(b"HTTP/1.1 204 No Content\r\n\r\n")
                .unwrap()
                .content_length,
            0
        );
    }
}
