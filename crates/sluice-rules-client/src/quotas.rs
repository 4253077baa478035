//! Seed 000's per-key quotas fetched from where they live: a quota service asked
//! `GET /quota/{key}` for one key's quota.

use std::sync::Arc;
use std::time::Duration;

use http::{StatusCode, header};
use sluice::{FetchResult, Quota};
use tracing::Instrument;

use crate::UrlError;

/// The largest answer a quota service may give.
const MAX_ANSWER: usize = 4096;

/// Where `{key}` stands in the parsed path (braces are not URL characters).
const KEY_MARK: &str = "%7Bkey%7D";

/// A quota service over HTTP: `url` holds `{key}`, replaced by the key (percent-encoded);
/// the answer is a quota text (`100/min burst 20`) or JSON `{"quota": "100/min"}`; 404 means
/// the service does not know the key. Anything else, a timeout or a bad answer is an error:
/// the keyed limiter then keeps the key's last known quota (the failsafe one until a first
/// answer), as with every source.
///
/// # Example
/// ```no_run
/// use sluice_rules_client::HttpQuotas;
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let quotas = HttpQuotas::new("http://127.0.0.1:9000/quota/{key}", std::time::Duration::from_secs(1))?;
/// let alice = quotas.fetch("alice@example.com").await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct HttpQuotas {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    target: crate::client::Target,
    tls: Option<crate::ClientTls>,
    /// The path before and after `{key}`.
    before: String,
    after: String,
    timeout: Duration,
}

impl HttpQuotas {
    /// A quota service at `url` (`http://host:port/.../{key}...`), each answer awaited at most
    /// `timeout`.
    ///
    /// # Errors
    /// Not an `http://` URL, or no `{key}` in its path.
    ///
    /// # Example
    /// ```
    /// use std::time::Duration;
    /// use sluice_rules_client::HttpQuotas;
    /// assert!(HttpQuotas::new("http://quotas.internal/v1/{key}.json", Duration::from_secs(1)).is_ok());
    /// let e = HttpQuotas::new("http://quotas.internal/v1/quota", Duration::from_secs(1)).unwrap_err();
    /// assert!(e.to_string().contains("no {key} in the path"), "{e}");
    /// ```
    pub fn new(url: &str, timeout: Duration) -> Result<Self, UrlError> {
        Self::with_tls(url, timeout, None)
    }

    /// [`new`](Self::new), speaking TLS to an `https://` service with `tls` (Mozilla's roots
    /// if `None`).
    ///
    /// # Errors
    /// As [`new`](Self::new)'s.
    ///
    /// ```
    /// use std::time::Duration;
    /// let tls = sluice_rules_client::ClientTls::new(None, None)?;
    /// let quotas = sluice_rules_client::HttpQuotas::with_tls("https://quotas.internal/v1/{key}", Duration::from_secs(1), Some(tls))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_tls(url: &str, timeout: Duration, tls: Option<crate::ClientTls>) -> Result<Self, UrlError> {
        let (target, path) = crate::client::parse_url(&url.replace("{key}", KEY_MARK))?;
        let tls = match (tls, target.tls_name.is_some()) {
            (Some(tls), _) => Some(tls),
            (None, true) => Some(crate::ClientTls::new(None, None)?),
            (None, false) => None,
        };
        let Some((before, after)) = path.split_once(KEY_MARK) else {
            return Err(UrlError::Invalid {
                url: url.to_owned(),
                reason: "no {key} in the path: write where the key goes, as /quota/{key}".into(),
            });
        };
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                tls,
                before: before.to_owned(),
                after: after.to_owned(),
                timeout,
            }),
        })
    }

    /// Asks for `key`'s quota: `Ok(None)` for a key the service does not know.
    ///
    /// # Errors
    /// The service unreachable, slow, answering another status, or not a quota.
    ///
    /// # Example
    /// ```no_run
    /// # async fn run(quotas: sluice_rules_client::HttpQuotas) -> sluice::FetchResult {
    /// match quotas.fetch("alice@example.com").await? {
    ///     Some(quota) => println!("alice: {quota}"),
    ///     None => println!("alice is not known"),
    /// }
    /// # Ok(None)
    /// # }
    /// ```
    pub fn fetch(&self, key: &str) -> impl Future<Output = FetchResult> + Send + 'static {
        let inner = Arc::clone(&self.inner);
        let mut path = String::with_capacity(inner.before.len() + key.len() * 3 + inner.after.len());
        path.push_str(&inner.before);
        percent_encode(key, &mut path);
        path.push_str(&inner.after);
        let span = tracing::trace_span!(
            target: sluice::TRACE_TARGET,
            "sluice.quota_fetch",
            otel.kind = "client",
            http.response.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let traced = span.clone();
        let fetched = async move {
            let accept = [(
                header::ACCEPT,
                header::HeaderValue::from_static("text/plain, application/json"),
            )];
            let asked = crate::client::get(
                &inner.target,
                inner.tls.as_ref(),
                &path,
                accept.into(),
                MAX_ANSWER,
            );
            let (status, body) = match tokio::time::timeout(inner.timeout, asked).await {
                Ok(answer) => answer.map_err(sluice::FetchError::new)?,
                Err(_) => {
                    return Err(sluice::FetchError::new(format!(
                        "no answer within {:?}",
                        inner.timeout
                    )));
                }
            };
            span.record("http.response.status_code", status.as_u16());
            match status {
                StatusCode::OK => parse_answer(&body).map(Some),
                StatusCode::NOT_FOUND => Ok(None),
                other => Err(sluice::FetchError::new(format!("quota service answered {other}"))),
            }
        };
        async move {
            let fetched = fetched.instrument(traced.clone()).await;
            if let Err(e) = &fetched
                && !traced.is_disabled()
            {
                traced.record("otel.status_code", "ERROR");
                traced.record("otel.status_description", e.to_string());
            }
            fetched
        }
    }
}

/// A quota text, or `{"quota": TEXT}`.
fn parse_answer(body: &[u8]) -> Result<Quota, sluice::FetchError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| sluice::FetchError::new("the answer is not UTF-8"))?
        .trim();
    let quota = if text.starts_with('{') {
        #[derive(serde::Deserialize)]
        struct Answer {
            quota: String,
        }
        let answer: Answer = serde_json::from_str(text).map_err(sluice::FetchError::new)?;
        answer.quota
    } else {
        text.to_owned()
    };
    quota
        .parse()
        .map_err(|e| sluice::FetchError::new(format!("quota {quota:?}: {e}")))
}

/// Appends `text` with every byte but the unreserved ones (RFC 3986) as `%XX`.
fn percent_encode(text: &str, out: &mut String) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &byte in text.as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 15)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_encoded_and_answers_read_as_text_or_json() {
        let mut path = String::new();
        percent_encode("alice@example.com/../x y", &mut path);
        assert_eq!(path, "alice%40example.com%2F..%2Fx%20y");
        assert_eq!(parse_answer(b" 100/min\n").unwrap(), "100/min".parse().unwrap());
        assert_eq!(
            parse_answer(br#"{"quota": "5/s burst 10"}"#).unwrap(),
            "5/s burst 10".parse().unwrap()
        );
        assert!(parse_answer(b"lots").unwrap_err().to_string().contains("lots"));
        assert!(parse_answer(br#"{"limit": 5}"#).is_err());
    }

    #[test]
    fn the_url_must_say_where_the_key_goes() {
        assert!(HttpQuotas::new("http://q:9000/quota/{key}", Duration::from_secs(1)).is_ok());
        assert!(HttpQuotas::new("http://q:9000/quota/{key}.json", Duration::from_secs(1)).is_ok());
        let e = HttpQuotas::new("http://q:9000/quota", Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("{key}"), "{e}");
        assert!(HttpQuotas::new("https://q/quota/{key}", Duration::from_secs(1)).is_ok());
        assert!(HttpQuotas::new("ftp://q/quota/{key}", Duration::from_secs(1)).is_err());
    }
}
