//! The one HTTP request a host makes of a service it reads its limits from (the rules
//! service, a quota service): a GET on a new HTTP/1.1 connection, its answer bounded.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::{PollError, UrlError};

/// Where an `http://` URL points: the `host:port` to connect to and name in `Host`, and the
/// path (without a trailing `/`).
pub(crate) fn parse_http_url(url: &str) -> Result<(String, String), UrlError> {
    let invalid = |reason: &str| UrlError::Invalid {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(_) => return Err(UrlError::Scheme(url.to_owned())),
        None => return Err(invalid("give the scheme: http://host:port")),
    }
    let Some(host) = uri.host() else {
        return Err(invalid("no host"));
    };
    if uri.query().is_some() {
        return Err(invalid("a query has no place here"));
    }
    let authority = format!("{host}:{}", uri.port_u16().unwrap_or(80));
    Ok((authority, uri.path().trim_end_matches('/').to_owned()))
}

/// GETs `path` from `authority` with `headers`: the status and a body of at most
/// `max_bytes`. The caller bounds the time.
pub(crate) async fn get(
    authority: &str,
    path: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), PollError> {
    let (status, _, body) = send(Method::GET, authority, path, headers, Bytes::new(), max_bytes).await?;
    Ok((status, body))
}

/// Sends one request to `authority`: the status, the headers and a body of at most
/// `max_bytes`. The caller bounds the time.
pub(crate) async fn send(
    method: Method,
    authority: &str,
    path: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    max_bytes: usize,
) -> Result<(StatusCode, HeaderMap, Bytes), PollError> {
    let stream = connect(authority).await?;
    send_on(stream, method, authority, path, headers, body, max_bytes).await
}

/// A new connection to `authority`.
pub(crate) async fn connect(authority: &str) -> Result<TcpStream, PollError> {
    let connect = |source| PollError::Connect {
        address: authority.to_owned(),
        source,
    };
    let stream = TcpStream::connect(authority).await.map_err(connect)?;
    stream.set_nodelay(true).map_err(connect)?;
    Ok(stream)
}

/// [`send`] on a connection already made (`io`), naming `authority` in `Host`.
pub(crate) async fn send_on<T>(
    io: T,
    method: Method,
    authority: &str,
    path: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    max_bytes: usize,
) -> Result<(StatusCode, HeaderMap, Bytes), PollError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let http = |e: &dyn std::fmt::Display| PollError::Http(e.to_string());
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| http(&e))?;
    // The connection is driven beside the request and ends with it.
    let driver = tokio::spawn(connection);
    let answer = async {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, authority)
            .body(Full::new(body))
            .map_err(|e| http(&e))?;
        request.headers_mut().extend(headers);
        let response = sender.send_request(request).await.map_err(|e| http(&e))?;
        let (head, answer) = response.into_parts();
        let body = Limited::new(answer, max_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    PollError::TooLarge(max_bytes)
                } else {
                    http(&e)
                }
            })?
            .to_bytes();
        Ok((head.status, head.headers, body))
    }
    .await;
    driver.abort();
    answer
}
