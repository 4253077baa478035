//! HTTP/1.1 as the proxy writes it to an upstream and reads it back (RFC 9112): a request
//! head written from a header map, a response head parsed into one, and how the response
//! body is framed. No I/O here: `pool` moves the bytes.
//!
//! A proxy's framing is where request smuggling lives, so each rule is strict: the request's
//! framing is written from its body alone (a client's own `Content-Length` or
//! `Transfer-Encoding` is never copied), and a response whose framing could be read two ways
//! (`Content-Length` with `Transfer-Encoding`, differing lengths, a transfer coding besides
//! `chunked`, a bare LF in a chunk's lines) is refused rather than guessed at.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Version, request};
use httparse::ParserConfig;

use super::forward::hop_by_hop;

/// The most headers a response head may carry (as hyper's default).
const MAX_HEADERS: usize = 100;
/// The fields of a head read without a heap allocation for their places.
const FEW_FIELDS: usize = 16;

/// The longest response head, or a chunked body's trailer section.
pub const MAX_HEAD: usize = 64 * 1024;

/// The longest chunk-size line, extensions included.
const MAX_CHUNK_LINE: usize = 4096;

/// Why an upstream's answer could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The head is not HTTP/1.x as RFC 9112 writes it.
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    /// The head, or a trailer section, is longer than `MAX_HEAD`.
    #[error("response head longer than {MAX_HEAD} bytes")]
    HeadTooLarge,
    /// A header's name or value is not one HTTP allows.
    #[error("malformed response header")]
    Header,
    /// The framing could be read more than one way, or not at all.
    #[error("ambiguous or unsupported response framing: {0}")]
    Framing(&'static str),
    /// A chunked body broke its format.
    #[error("malformed chunked body: {0}")]
    Chunk(&'static str),
}

/// How a request's body is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestFraming {
    /// No body, and no header saying so.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`: the length is not known ahead.
    Chunked,
}

impl RequestFraming {
    /// The framing of a body whose exact length is `exact` (if known) and that is or is not
    /// over already; `declared` is whether the client wrote a `Content-Length`.
    pub fn of(exact: Option<u64>, ended: bool, declared: bool) -> Self {
        match exact {
            Some(0) if !declared => Self::Empty,
            Some(length) => Self::Length(length),
            None if ended && !declared => Self::Empty,
            None if ended => Self::Length(0),
            None => Self::Chunked,
        }
    }
}

/// Appends the head of a request to `out`: its method, origin-form target, its headers but
/// `Content-Length` and `Transfer-Encoding` (hop-by-hop ones are removed before), the
/// `added` ones, and the framing header of `framing`. The `http` types guarantee that no
/// method, target, name or value holds a CR, LF or NUL.
pub fn write_request_head(
    out: &mut Vec<u8>,
    head: &request::Parts,
    added: &[(&HeaderName, HeaderValue)],
    framing: RequestFraming,
) {
    let target = head.uri.path_and_query().map_or("/", |target| target.as_str());
    out.extend_from_slice(head.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        put_field(out, name, value);
    }
    for (name, value) in added {
        put_field(out, name, value);
    }
    match framing {
        RequestFraming::Empty => {}
        RequestFraming::Length(length) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends a `name: value` line.
fn put_field(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends a chunk's size line (the chunk follows, then `CHUNK_END`).
pub fn write_chunk_size(out: &mut Vec<u8>, size: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut left = size;
    loop {
        at -= 1;
        digits[at] = HEX[left & 15];
        left >>= 4;
        if left == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}

/// What ends a chunk's data.
pub const CHUNK_END: &[u8] = b"\r\n";

/// The last chunk of a chunked body, with no trailers (a client's are not forwarded).
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// How a response's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseFraming {
    /// No body (a `HEAD` request's answer, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunks.
    Chunked,
    /// Everything until the upstream closes.
    UntilClose,
}

/// A parsed response head, its hop-by-hop fields left out (a proxy never passes them on).
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub version: Version,
    /// The end-to-end fields.
    pub headers: HeaderMap,
    pub framing: ResponseFraming,
    /// Whether the connection can carry another request after this answer.
    pub keep_alive: bool,
    /// The `Upgrade` value, when `Connection` names it.
    pub upgrade: Option<HeaderValue>,
}

/// Parses the response head at the start of `buffer`, and takes it off. `Ok(None)`: not
/// all of it has arrived. The framing follows RFC 9112 §6.3 for an answer to `method`;
/// `room` is how many more headers the map is made ready for (those the proxy adds).
///
/// # Errors
/// The head is malformed, too large, or frames its body ambiguously.
pub fn read_response_head(
    buffer: &mut BytesMut,
    method: &Method,
    room: usize,
) -> Result<Option<ResponseHead>, WireError> {
    if buffer.is_empty() {
        return Ok(None);
    }
    // Left uninitialized: only the parsed ones are read.
    let mut slots = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut []);
    let length =
        match ParserConfig::default().parse_response_with_uninit_headers(&mut parsed, buffer, &mut slots) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buffer.len() >= MAX_HEAD => return Err(WireError::HeadTooLarge),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(WireError::HeadTooLarge),
            Err(e) => return Err(WireError::Head(e)),
        };
    if length > MAX_HEAD {
        return Err(WireError::HeadTooLarge);
    }
    let status = parsed.code.and_then(|code| StatusCode::from_u16(code).ok());
    let status = status.ok_or(WireError::Head(httparse::Error::Status))?;
    let version = if parsed.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    // Names and values become slices of the head, shared rather than copied; the head's
    // buffer is split off once the parse that borrows it is done.
    let base = buffer.as_ptr() as usize;
    let at = |slice: &[u8]| {
        let start = slice.as_ptr() as usize - base;
        start..start + slice.len()
    };
    // A usual head's spans stay on the stack; a larger one's go to the heap.
    let mut few = [[0; 4]; FEW_FIELDS];
    let mut many = Vec::new();
    let spans = if parsed.headers.len() <= FEW_FIELDS {
        &mut few[..parsed.headers.len()]
    } else {
        many.resize(parsed.headers.len(), [0; 4]);
        &mut many[..]
    };
    for (span, header) in spans.iter_mut().zip(parsed.headers.iter()) {
        let (name, value) = (at(header.name.as_bytes()), at(header.value));
        *span = [name.start, name.end, value.start, value.end];
    }
    let head = buffer.split_to(length).freeze();
    let mut headers = HeaderMap::with_capacity(spans.len() + room);
    let mut framing = FramingFields::default();
    let mut hop = HopFields::default();
    for &mut [name_start, name_end, value_start, value_end] in spans {
        let name = HeaderName::from_bytes(&head[name_start..name_end]).map_err(|_| WireError::Header)?;
        let value = field_value(head.slice(value_start..value_end))?;
        framing.see(&name, value.as_bytes());
        if hop_by_hop().contains(&&name) {
            hop.see(&name, value);
        } else {
            headers.append(name, value);
        }
    }
    // Those `Connection` names are hop-by-hop too (RFC 9110 §7.6.1).
    for name in &hop.named {
        headers.remove(name);
    }
    let framing = framing.framing(status, method)?;
    let keep_alive = version == Version::HTTP_11 && framing != ResponseFraming::UntilClose && !hop.close;
    Ok(Some(ResponseHead {
        status,
        version,
        headers,
        framing,
        keep_alive,
        upgrade: hop.upgrade.filter(|_| hop.upgrade_named),
    }))
}

/// A field value httparse accepted, as a header value.
fn field_value(value: Bytes) -> Result<HeaderValue, WireError> {
    if value.is_ascii() {
        // SAFETY: httparse accepts only HTAB, SP, VCHAR and obs-text (0x80-0xFF) in a value;
        // without obs-text that is ASCII without control characters other than HTAB, which is
        // valid UTF-8 (the function's contract) and what `HeaderValue` holds. Debug builds
        // check it (the property tests feed the reader arbitrary bytes).
        return Ok(unsafe { HeaderValue::from_maybe_shared_unchecked(value) });
    }
    HeaderValue::from_maybe_shared(value).map_err(|_| WireError::Header)
}

/// What a response head's hop-by-hop fields say, gathered as they are read.
#[derive(Default)]
struct HopFields {
    /// `Connection: close`.
    close: bool,
    /// `Connection: upgrade`.
    upgrade_named: bool,
    /// The `Upgrade` value.
    upgrade: Option<HeaderValue>,
    /// The other fields `Connection` names (seldom any).
    named: Vec<HeaderName>,
}

impl HopFields {
    fn see(&mut self, name: &HeaderName, value: HeaderValue) {
        if name == UPGRADE {
            self.upgrade = Some(value);
            return;
        }
        if name != CONNECTION {
            return;
        }
        for token in value
            .as_bytes()
            .split(|&byte| byte == b',')
            .map(<[u8]>::trim_ascii)
        {
            if token.eq_ignore_ascii_case(b"close") {
                self.close = true;
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                self.upgrade_named = true;
            } else if !token.eq_ignore_ascii_case(b"keep-alive") {
                self.named.extend(HeaderName::from_bytes(token).ok());
            }
        }
    }
}

/// What a response head says about its framing, gathered as its fields are read.
#[derive(Default)]
struct FramingFields {
    /// The `Content-Length` values (all must agree), `Err` if one is not a number.
    length: Option<Result<u64, ()>>,
    /// The transfer codings listed, in order: only `chunked` alone is accepted.
    codings: usize,
    chunked: bool,
}

impl FramingFields {
    fn see(&mut self, name: &HeaderName, value: &[u8]) {
        if name == CONTENT_LENGTH {
            for length in value.split(|&byte| byte == b',') {
                let length = decimal(length.trim_ascii()).ok_or(());
                self.length = match self.length {
                    None => Some(length),
                    Some(Ok(known)) if length == Ok(known) => Some(Ok(known)),
                    Some(_) => Some(Err(())),
                };
            }
        } else if name == TRANSFER_ENCODING {
            for coding in value.split(|&byte| byte == b',') {
                self.codings += 1;
                self.chunked = coding.trim_ascii().eq_ignore_ascii_case(b"chunked");
            }
        }
    }

    /// The framing of a response (RFC 9112 §6.3), refusing what could be read two ways.
    fn framing(&self, status: StatusCode, method: &Method) -> Result<ResponseFraming, WireError> {
        if *method == Method::HEAD
            || status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            return Ok(ResponseFraming::Empty);
        }
        match (self.codings, self.length) {
            (0, None) => Ok(ResponseFraming::UntilClose),
            (0, Some(Ok(length))) => Ok(ResponseFraming::Length(length)),
            (0, Some(Err(()))) => Err(WireError::Framing("Content-Length not one number")),
            (_, Some(_)) => Err(WireError::Framing("both Content-Length and Transfer-Encoding")),
            (1, None) if self.chunked => Ok(ResponseFraming::Chunked),
            (_, None) => Err(WireError::Framing("a transfer coding other than chunked alone")),
        }
    }
}

/// `digits` as a decimal number: 1 to 19 ASCII digits, nothing else.
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0, |value, digit| value * 10 + u64::from(digit - b'0')),
    )
}

/// What a chunked body's decoder found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Some of a chunk's data.
    Data(Bytes),
    /// The trailer section (only when it has fields), then the end.
    Trailers(HeaderMap),
    /// The body has ended.
    End,
    /// More bytes are needed.
    More,
}

/// Where a chunked body's decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunked {
    /// At a chunk-size line.
    Size,
    /// In a chunk's data, this much of it left.
    Data(u64),
    /// After a chunk's data, at its CRLF.
    DataEnd,
    /// After the last chunk, at the trailer section.
    Trailers,
    /// Done.
    Ended,
}

impl Chunked {
    /// Decodes what `buffer` holds as far as it goes, taking the bytes it used off it.
    ///
    /// # Errors
    /// The body breaks the chunked format (RFC 9112 §7.1), or a line or the trailer section
    /// is too long.
    pub fn decode(&mut self, buffer: &mut BytesMut) -> Result<Decoded, WireError> {
        loop {
            match *self {
                Chunked::Ended => return Ok(Decoded::End),
                Chunked::Size => {
                    let Some(line) = line_end(buffer, MAX_CHUNK_LINE)? else {
                        return Ok(Decoded::More);
                    };
                    let size = chunk_size(&buffer[..line])?;
                    buffer.advance(line + 2);
                    *self = if size == 0 {
                        Chunked::Trailers
                    } else {
                        Chunked::Data(size)
                    };
                }
                Chunked::Data(left) => {
                    if buffer.is_empty() {
                        return Ok(Decoded::More);
                    }
                    let take = usize::try_from(left).map_or(buffer.len(), |left| left.min(buffer.len()));
                    let data = buffer.split_to(take).freeze();
                    let left = left - take as u64;
                    *self = if left == 0 {
                        Chunked::DataEnd
                    } else {
                        Chunked::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                Chunked::DataEnd => {
                    if buffer.len() < 2 {
                        return Ok(Decoded::More);
                    }
                    if &buffer[..2] != b"\r\n" {
                        return Err(WireError::Chunk("no CRLF after a chunk's data"));
                    }
                    buffer.advance(2);
                    *self = Chunked::Size;
                }
                Chunked::Trailers => return self.trailers(buffer),
            }
        }
    }

    /// The trailer section: an empty line, or fields up to one.
    fn trailers(&mut self, buffer: &mut BytesMut) -> Result<Decoded, WireError> {
        if buffer.len() < 2 {
            return Ok(Decoded::More);
        }
        if buffer.starts_with(b"\r\n") {
            buffer.advance(2);
            *self = Chunked::Ended;
            return Ok(Decoded::End);
        }
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let (length, fields) = match httparse::parse_headers(buffer, &mut slots) {
            Ok(httparse::Status::Complete((length, fields))) => (length, fields),
            Ok(httparse::Status::Partial) if buffer.len() >= MAX_HEAD => return Err(WireError::HeadTooLarge),
            Ok(httparse::Status::Partial) => return Ok(Decoded::More),
            Err(_) => return Err(WireError::Chunk("malformed trailer section")),
        };
        if length > MAX_HEAD {
            return Err(WireError::HeadTooLarge);
        }
        let mut trailers = HeaderMap::with_capacity(fields.len());
        for field in fields.iter() {
            let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| WireError::Header)?;
            let value = HeaderValue::from_bytes(field.value).map_err(|_| WireError::Header)?;
            trailers.append(name, value);
        }
        buffer.advance(length);
        *self = Chunked::Ended;
        Ok(if trailers.is_empty() {
            Decoded::End
        } else {
            Decoded::Trailers(trailers)
        })
    }
}

/// Where the CRLF ending the line at the start of `buffer` is, if it has arrived. A bare LF
/// or CR, or a line longer than `limit`, is an error.
fn line_end(buffer: &[u8], limit: usize) -> Result<Option<usize>, WireError> {
    let seen = &buffer[..buffer.len().min(limit + 1)];
    match seen.iter().position(|&byte| byte == b'\n' || byte == b'\r') {
        Some(at) if seen[at] == b'\r' => match buffer.get(at + 1) {
            Some(b'\n') => Ok(Some(at)),
            Some(_) => Err(WireError::Chunk("a bare CR in a chunk line")),
            None => Ok(None),
        },
        Some(_) => Err(WireError::Chunk("a bare LF in a chunk line")),
        None if buffer.len() > limit => Err(WireError::Chunk("chunk line too long")),
        None => Ok(None),
    }
}

/// A chunk-size line's size: 1 to 16 hex digits, then nothing or extensions (`;`, after
/// optional spaces or tabs), which are ignored.
fn chunk_size(line: &[u8]) -> Result<u64, WireError> {
    let digits = line.iter().take_while(|byte| byte.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(WireError::Chunk("chunk size"));
    }
    let rest = line[digits..].trim_ascii_start();
    if !rest.is_empty() && rest[0] != b';' {
        return Err(WireError::Chunk("chunk size"));
    }
    if rest
        .iter()
        .any(|&byte| byte < 0x20 && byte != b'\t' || byte == 0x7f)
    {
        return Err(WireError::Chunk("control character in a chunk extension"));
    }
    let size = line[..digits].iter().fold(0u64, |size, &digit| {
        let value = (digit as char).to_digit(16).unwrap_or(0);
        (size << 4) | u64::from(value)
    });
    Ok(size)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn head(text: &str, method: &Method) -> Result<Option<ResponseHead>, WireError> {
        read_response_head(&mut BytesMut::from(text), method, 0)
    }

    fn framing(text: &str) -> Result<ResponseFraming, WireError> {
        head(text, &Method::GET).map(|head| head.map_or(ResponseFraming::Empty, |head| head.framing))
    }

    #[test]
    fn a_response_head_is_read_with_its_headers_and_the_rest_left() {
        let mut buffer =
            BytesMut::from("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello");
        let head = read_response_head(&mut buffer, &Method::GET, 0).unwrap().unwrap();
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.framing, ResponseFraming::Length(5));
        assert!(head.keep_alive);
        let values: Vec<_> = head.headers.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        assert_eq!(&buffer[..], b"hello");
    }

    #[test]
    fn a_partial_head_waits_and_an_endless_one_is_refused() {
        assert!(
            head("HTTP/1.1 200 OK\r\nContent-Le", &Method::GET)
                .unwrap()
                .is_none()
        );
        let endless = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
        assert_eq!(head(&endless, &Method::GET).unwrap_err(), WireError::HeadTooLarge);
    }

    #[test]
    fn framing_follows_rfc_9112_and_refuses_what_reads_two_ways() {
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Ok(ResponseFraming::Chunked)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\n\r\n"),
            Ok(ResponseFraming::UntilClose)
        );
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n"),
            Ok(ResponseFraming::Empty)
        );
        assert_eq!(
            framing("HTTP/1.1 304 Not Modified\r\n\r\n"),
            Ok(ResponseFraming::Empty)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n"),
            Ok(ResponseFraming::Length(3))
        );
        let refused = [
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: +3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
        ];
        for text in refused {
            assert!(matches!(framing(text), Err(WireError::Framing(_))), "{text:?}");
        }
        let head = head("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", &Method::HEAD)
            .unwrap()
            .unwrap();
        assert_eq!(head.framing, ResponseFraming::Empty);
    }

    #[test]
    fn only_an_http_1_1_answer_without_close_keeps_its_connection() {
        let keeps = |text: &str| head(text, &Method::GET).unwrap().unwrap().keep_alive;
        assert!(!keeps(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n"
        ));
        assert!(!keeps("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n"));
        assert!(!keeps("HTTP/1.1 200 OK\r\n\r\n"));
        assert!(keeps("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"));
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_are_left_out() {
        let text = "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Private\r\nKeep-Alive: timeout=5\r\n\
                    X-Private: 1\r\nUpgrade: h2c\r\nProxy-Connection: x\r\nX-Kept: 1\r\nContent-Length: 0\r\n\r\n";
        let kept = head(text, &Method::GET).unwrap().unwrap();
        let mut names: Vec<_> = kept.headers.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["content-length", "x-kept"]);
        assert_eq!(kept.upgrade, None, "Connection does not name it");
        assert!(kept.keep_alive);
        let text = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n";
        let switching = head(text, &Method::GET).unwrap().unwrap();
        assert_eq!(switching.upgrade.unwrap(), "websocket");
        assert!(switching.headers.is_empty());
    }

    #[test]
    fn malformed_heads_are_errors() {
        for text in [
            "HTTP/1.1 999x OK\r\n\r\n",
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx: a\rb\r\n\r\n",
        ] {
            assert!(head(text, &Method::GET).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_request_head_is_framed_by_its_body_alone() {
        let request = http::Request::post("/a?b=1")
            .header("host", "up")
            .header("content-length", "999")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let (parts, ()) = request.into_parts();
        let mut out = Vec::new();
        write_request_head(&mut out, &parts, &[], RequestFraming::Length(3));
        assert_eq!(
            out,
            b"POST /a?b=1 HTTP/1.1\r\nhost: up\r\ncontent-length: 3\r\n\r\n"
        );
        out.clear();
        let added = [(
            &http::header::FORWARDED,
            HeaderValue::from_static("for=192.0.2.1"),
        )];
        write_request_head(&mut out, &parts, &added, RequestFraming::Chunked);
        assert_eq!(
            out,
            b"POST /a?b=1 HTTP/1.1\r\nhost: up\r\nforwarded: for=192.0.2.1\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        assert_eq!(RequestFraming::of(Some(0), true, false), RequestFraming::Empty);
        assert_eq!(RequestFraming::of(Some(0), true, true), RequestFraming::Length(0));
        assert_eq!(RequestFraming::of(None, false, false), RequestFraming::Chunked);
    }

    /// Decodes `wire` fed in pieces of the given sizes (cycled); the data, the trailers, and
    /// whether the end was reached.
    fn decode_in_pieces(
        wire: &[u8],
        pieces: &[usize],
    ) -> Result<(Vec<u8>, Option<HeaderMap>, bool), WireError> {
        let mut decoder = Chunked::Size;
        let mut buffer = BytesMut::new();
        let (mut data, mut trailers) = (Vec::new(), None);
        let mut fed = 0;
        let mut sizes = pieces.iter().copied().cycle();
        loop {
            match decoder.decode(&mut buffer)? {
                Decoded::Data(bytes) => data.extend_from_slice(&bytes),
                Decoded::Trailers(map) => trailers = Some(map),
                Decoded::End => return Ok((data, trailers, true)),
                Decoded::More if fed == wire.len() => return Ok((data, trailers, false)),
                Decoded::More => {
                    let take = sizes.next().unwrap_or(1).max(1).min(wire.len() - fed);
                    buffer.extend_from_slice(&wire[fed..fed + take]);
                    fed += take;
                }
            }
        }
    }

    /// The reference: `chunks` written as RFC 9112 writes them.
    fn encode(chunks: &[Vec<u8>], extension: bool, trailer: Option<&str>) -> Vec<u8> {
        let mut wire = Vec::new();
        for chunk in chunks.iter().filter(|chunk| !chunk.is_empty()) {
            write_chunk_size(&mut wire, chunk.len());
            if extension {
                wire.truncate(wire.len() - 2);
                wire.extend_from_slice(b" ;name=\"v\"\r\n");
            }
            wire.extend_from_slice(chunk);
            wire.extend_from_slice(CHUNK_END);
        }
        wire.extend_from_slice(b"0\r\n");
        if let Some(value) = trailer {
            wire.extend_from_slice(format!("x-trailer: {value}\r\n").as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        wire
    }

    proptest! {
        #[test]
        fn chunked_bodies_decode_to_what_was_encoded_however_they_arrive(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
            pieces in prop::collection::vec(1usize..64, 1..6),
            extension in any::<bool>(),
            trailer in prop::option::of("[a-z]{1,10}"),
        ) {
            let wire = encode(&chunks, extension, trailer.as_deref());
            let (data, trailers, ended) = decode_in_pieces(&wire, &pieces).unwrap();
            prop_assert!(ended);
            prop_assert_eq!(data, chunks.concat());
            let got = trailers.and_then(|map| map.get("x-trailer").map(|v| v.to_str().unwrap().to_owned()));
            prop_assert_eq!(got, trailer);
        }

        #[test]
        fn a_chunked_body_cut_short_never_ends(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 1..100), 1..5),
            cut in any::<prop::sample::Index>(),
        ) {
            let wire = encode(&chunks, false, None);
            let cut = cut.index(wire.len());
            let (_, _, ended) = decode_in_pieces(&wire[..cut], &[7]).unwrap();
            prop_assert!(!ended);
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_head_reader(
            wire in prop::collection::vec(any::<u8>(), 0..300),
            prefix in any::<bool>(),
        ) {
            // With a valid status line first, the fuzzing reaches the fields.
            let mut bytes = if prefix { b"HTTP/1.1 200 OK\r\n".to_vec() } else { Vec::new() };
            bytes.extend_from_slice(&wire);
            let mut buffer = BytesMut::from(&bytes[..]);
            if let Ok(Some(_)) = read_response_head(&mut buffer, &Method::GET, 8) {
                prop_assert!(buffer.len() < bytes.len(), "a head read takes its bytes off");
            }
        }

        #[test]
        fn a_head_reads_back_the_fields_it_was_written_with(
            fields in prop::collection::vec(("x-[a-z]{1,12}", "[ -~]{0,40}"), 0..20),
            length in 0u64..100_000,
            rest in prop::collection::vec(any::<u8>(), 0..50),
        ) {
            let mut text = format!("HTTP/1.1 200 OK\r\ncontent-length: {length}\r\n");
            for (name, value) in &fields {
                text.push_str(&format!("{name}: {value}\r\n"));
            }
            text.push_str("\r\n");
            let mut buffer = BytesMut::from(text.as_bytes());
            buffer.extend_from_slice(&rest);
            let head = read_response_head(&mut buffer, &Method::GET, 0).unwrap().unwrap();
            prop_assert_eq!(head.framing, ResponseFraming::Length(length));
            prop_assert_eq!(&buffer[..], &rest[..], "the body's bytes are left, untouched");
            for (name, value) in &fields {
                let values: Vec<&[u8]> = head.headers.get_all(name.as_str()).iter().map(HeaderValue::as_bytes).collect();
                // Field values lose their surrounding whitespace (RFC 9112 §5.1).
                prop_assert!(values.contains(&value.trim_matches(' ').as_bytes()), "{} missing in {:?}", name, values);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic_the_decoder(wire in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_in_pieces(&wire, &[3]);
        }
    }

    #[test]
    fn chunk_lines_that_could_be_read_two_ways_are_refused() {
        for wire in [
            &b"5\nhello\r\n0\r\n\r\n"[..],
            b"5\r\nhello\n0\r\n\r\n",
            b"5\rx\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"11111111111111111\r\n",
            b"5 x\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXY0\r\n\r\n",
        ] {
            assert!(
                decode_in_pieces(wire, &[64]).is_err(),
                "{:?}",
                String::from_utf8_lossy(wire)
            );
        }
        let long = format!("5;{}\r\nhello\r\n0\r\n\r\n", "x".repeat(MAX_CHUNK_LINE));
        assert!(decode_in_pieces(long.as_bytes(), &[64]).is_err());
        // A line whose CR is the last byte looked at still ends where its LF says.
        for extension in [MAX_CHUNK_LINE - 2, MAX_CHUNK_LINE - 1] {
            let edge = format!("1;{}\r\nx\r\n0\r\n\r\n", "x".repeat(extension));
            let decoded = decode_in_pieces(edge.as_bytes(), &[5000]);
            if edge.find('\r').unwrap() <= MAX_CHUNK_LINE {
                assert_eq!(decoded.unwrap().0, b"x");
            } else {
                assert!(decoded.is_err());
            }
        }
    }
}
