//! The one HTTP request a host makes of a service it reads its limits from (the rules
//! service, a quota service): a GET on a new HTTP/1.1 connection, over TLS for `https://`,
//! its answer bounded.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use std::pin::Pin;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;

use crate::{ClientTls, PollError, UrlError};

/// Where a URL points: the `host:port` to connect to and name in `Host`, and for `https://`
/// the name the server's certificate must be valid for.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) authority: String,
    pub(crate) tls_name: Option<ServerName<'static>>,
}

/// Where an `http://` or `https://` URL points, and its path (without a trailing `/`).
pub(crate) fn parse_url(url: &str) -> Result<(Target, String), UrlError> {
    let invalid = |reason: &str| UrlError::Invalid {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        Some(_) => return Err(UrlError::Scheme(url.to_owned())),
        None => return Err(invalid("give the scheme: http://host:port or https://host")),
    };
    let Some(host) = uri.host() else {
        return Err(invalid("no host"));
    };
    if uri.query().is_some() {
        return Err(invalid("a query has no place here"));
    }
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tls_name = if https {
        // An IPv6 literal comes bracketed; the certificate names the address itself.
        let name = host.trim_start_matches('[').trim_end_matches(']');
        Some(ServerName::try_from(name.to_owned()).map_err(|e| invalid(&format!("host {host}: {e}")))?)
    } else {
        None
    };
    let target = Target {
        authority: format!("{host}:{port}"),
        tls_name,
    };
    Ok((target, uri.path().trim_end_matches('/').to_owned()))
}

/// A connection to a service: plain, or TLS.
pub(crate) enum Connection {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// A new connection to `target`, with its TLS handshake made (trusting `tls`) if it is https.
pub(crate) async fn connect_to(target: &Target, tls: Option<&ClientTls>) -> Result<Connection, PollError> {
    let stream = connect(&target.authority).await?;
    let Some(name) = &target.tls_name else {
        return Ok(Connection::Plain(stream));
    };
    let Some(tls) = tls else {
        return Err(PollError::Http(format!(
            "{}: https:// without a TLS client",
            target.authority
        )));
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::clone(&tls.0));
    let stream = connector
        .connect(name.clone(), stream)
        .await
        .map_err(|source| PollError::Connect {
            address: target.authority.clone(),
            source,
        })?;
    Ok(Connection::Tls(Box::new(stream)))
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_flush(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Connection::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            Connection::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// GETs `path` from `authority` with `headers`: the status and a body of at most
/// `max_bytes`. The caller bounds the time.
pub(crate) async fn get(
    target: &Target,
    tls: Option<&ClientTls>,
    path: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), PollError> {
    let (status, _, body) = send(Method::GET, target, tls, path, headers, Bytes::new(), max_bytes).await?;
    Ok((status, body))
}

/// Sends one request to `authority`: the status, the headers and a body of at most
/// `max_bytes`. The caller bounds the time.
pub(crate) async fn send(
    method: Method,
    target: &Target,
    tls: Option<&ClientTls>,
    path: &str,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Bytes,
    max_bytes: usize,
) -> Result<(StatusCode, HeaderMap, Bytes), PollError> {
    let connection = connect_to(target, tls).await?;
    send_on(
        connection,
        method,
        &target.authority,
        path,
        headers,
        body,
        max_bytes,
    )
    .await
}

/// A new TCP connection to `authority`.
async fn connect(authority: &str) -> Result<TcpStream, PollError> {
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
