//! The host's side of the rules service: a [`RulesSource`] asks `GET /v1/rules` with the
//! revision it holds (`If-None-Match`), so an unchanged store costs a 304 and no body; a
//! changed one comes whole, every domain checked by the same validator as the store's.
//! A [`Snapshot`] is what a host keeps on disk to start from when the service is down.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::{StatusCode, header};
use sluice_descriptors::{RuleSet, RulesError};
use tracing::Instrument;

use crate::wire::{DomainBody, SnapshotBody};

/// The largest answer (or snapshot file) taken, unless [`RulesSource::max_bytes`] says
/// otherwise: far above 10 000 rules, far below what could hurt the host.
///
/// ```
/// assert_eq!(sluice_rules_client::DEFAULT_MAX_BYTES, 64 << 20);
/// ```
pub const DEFAULT_MAX_BYTES: usize = 64 * 1024 * 1024;

/// How long one poll may take, unless [`RulesSource::timeout`] says otherwise.
///
/// ```
/// assert_eq!(sluice_rules_client::DEFAULT_TIMEOUT, std::time::Duration::from_secs(5));
/// ```
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a rules service's (or a quota service's) address was refused.
///
/// ```
/// use sluice_rules_client::{RulesSource, UrlError};
/// let e = RulesSource::new("ftp://rules.internal", None).unwrap_err();
/// assert!(matches!(e, UrlError::Scheme(_)), "{e}");
/// let e = RulesSource::new("http://rules.internal", Some("line\nbreak")).unwrap_err();
/// assert!(matches!(e, UrlError::Token), "{e}");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// Not a URL.
    #[error("invalid URL {url:?}: {reason}")]
    Invalid {
        /// As given.
        url: String,
        /// Why.
        reason: String,
    },
    /// Not `http://` or `https://`.
    #[error("{0:?}: only http:// and https:// are spoken")]
    Scheme(String),
    /// `https://`, and the built-in roots could not be loaded.
    #[error("{0}")]
    Tls(#[from] crate::ClientTlsError),
    /// A token that cannot be sent in a header.
    #[error("the token holds characters a header cannot carry")]
    Token,
}

/// Why a poll brought no rules. The rules held stay; nothing is half-applied.
///
/// ```
/// use sluice_rules_client::{PollError, Snapshot};
/// let e = Snapshot::from_json(b"<html>".to_vec().into()).unwrap_err();
/// assert!(matches!(e, PollError::Json(_)));
/// assert!(e.to_string().starts_with("not a rules snapshot"), "{e}");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The service could not be reached or the connection broke.
    #[error("cannot reach {address}: {source}")]
    Connect {
        /// host:port.
        address: String,
        /// Why.
        source: std::io::Error,
    },
    /// The exchange did not finish in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// HTTP failed on the connection.
    #[error("HTTP: {0}")]
    Http(String),
    /// The token was refused (401) or may not read (403).
    #[error("refused ({status}): check the token")]
    Refused {
        /// 401 or 403.
        status: u16,
    },
    /// Any other status.
    #[error("answered {status}: {detail}")]
    Status {
        /// The status.
        status: u16,
        /// The start of the body.
        detail: String,
    },
    /// The answer is larger than the bound.
    #[error("answer over {0} bytes")]
    TooLarge(usize),
    /// The answer is not the rules' JSON.
    #[error("not a rules snapshot: {0}")]
    Json(#[from] serde_json::Error),
    /// A domain's rules are invalid: the error names the field.
    #[error("domain '{domain}': {source}")]
    Rules {
        /// The domain.
        domain: String,
        /// What is wrong.
        source: RulesError,
    },
}

/// Why a snapshot file could not be used.
///
/// ```
/// use sluice_rules_client::{Snapshot, SnapshotError};
/// let e = Snapshot::load("/nonexistent/snapshot.json".as_ref(), 1 << 20).unwrap_err();
/// assert!(matches!(e, SnapshotError::Io { .. }), "{e}");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// It could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// What it holds is not a good rules snapshot.
    #[error("{path}: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        source: PollError,
    },
}

/// A checked set of rules at one store revision, with the JSON it came as (what is saved).
///
/// ```
/// use sluice_rules_client::Snapshot;
/// let snapshot = Snapshot::from_json(br#"{"revision": 0, "domains": []}"#.to_vec().into())?;
/// assert!(snapshot.revision == 0 && snapshot.rules.is_empty());
/// # Ok::<(), sluice_rules_client::PollError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The store's revision.
    pub revision: u64,
    /// Every domain's rules.
    pub rules: RuleSet,
    json: Bytes,
}

impl Snapshot {
    /// Checks a `GET /v1/rules` answer: the JSON, then every domain's rules, each under the
    /// domain it is filed as.
    ///
    /// # Errors
    /// Not the JSON of a snapshot, or a domain's rules invalid.
    ///
    /// # Example
    /// ```
    /// let json = r#"{"revision": 3, "domains": [{"domain": "edge", "revision": 3,
    ///     "rules": "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n"}]}"#;
    /// let snapshot = sluice_rules_client::Snapshot::from_json(json.as_bytes().to_vec().into())?;
    /// assert_eq!((snapshot.revision, snapshot.rules.len()), (3, 1));
    /// # Ok::<(), sluice_rules_client::PollError>(())
    /// ```
    pub fn from_json(json: Bytes) -> Result<Self, PollError> {
        let body: SnapshotBody = serde_json::from_slice(&json)?;
        let mut domains = Vec::with_capacity(body.domains.len());
        for DomainBody { domain, rules, .. } in body.domains {
            let invalid = |source| PollError::Rules {
                domain: domain.clone(),
                source,
            };
            let parsed = sluice_descriptors::parse_domain(&rules).map_err(invalid)?;
            if parsed.name() != domain {
                let named = format!("the rules are for domain '{}'", parsed.name());
                return Err(invalid(RulesError {
                    field: "domain".into(),
                    message: named,
                }));
            }
            domains.push(parsed);
        }
        let rules = RuleSet::from_domains(domains).map_err(|source| PollError::Rules {
            domain: "(snapshot)".into(),
            source,
        })?;
        Ok(Self {
            revision: body.revision,
            rules,
            json,
        })
    }

    /// Reads and checks a snapshot file written by [`Snapshot::save`].
    ///
    /// # Errors
    /// The file cannot be read, is over `max_bytes`, or holds no good snapshot.
    ///
    /// # Example
    /// ```
    /// use sluice_rules_client::{DEFAULT_MAX_BYTES, Snapshot, SnapshotError};
    /// let path = std::env::temp_dir().join(format!("sluice-snapshot-load-{}.json", std::process::id()));
    /// std::fs::write(&path, br#"{"revision": 4, "domains": []}"#).unwrap();
    /// let kept = Snapshot::load(&path, DEFAULT_MAX_BYTES);
    /// let too_large = Snapshot::load(&path, 8);
    /// std::fs::remove_file(&path).unwrap();
    /// assert_eq!(kept?.revision, 4);
    /// assert!(matches!(too_large, Err(SnapshotError::Invalid { .. })));
    /// # Ok::<(), SnapshotError>(())
    /// ```
    pub fn load(path: &Path, max_bytes: usize) -> Result<Self, SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        };
        let invalid = |source| SnapshotError::Invalid {
            path: path.to_path_buf(),
            source,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        if size > max_bytes as u64 {
            return Err(invalid(PollError::TooLarge(max_bytes)));
        }
        let json = std::fs::read(path).map_err(io)?;
        Self::from_json(json.into()).map_err(invalid)
    }

    /// Writes the snapshot to `path` whole or not at all: a temporary file beside it, synced,
    /// then renamed over it, so a crash leaves the old file or the new one.
    ///
    /// # Errors
    /// The file or its directory cannot be written.
    ///
    /// # Example
    /// ```
    /// use sluice_rules_client::{DEFAULT_MAX_BYTES, Snapshot};
    /// let snapshot = Snapshot::from_json(br#"{"revision": 9, "domains": []}"#.to_vec().into())?;
    /// let path = std::env::temp_dir().join(format!("sluice-snapshot-save-{}.json", std::process::id()));
    /// snapshot.save(&path)?;
    /// let read = Snapshot::load(&path, DEFAULT_MAX_BYTES);
    /// std::fs::remove_file(&path).unwrap();
    /// assert_eq!(read?.revision, 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn save(&self, path: &Path) -> Result<(), SnapshotError> {
        let io = |source| SnapshotError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        let mut file = std::fs::File::create(&temporary).map_err(io)?;
        file.write_all(&self.json).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&temporary, path).map_err(io)
    }
}

/// What a poll found.
///
/// ```no_run
/// use sluice_rules_client::{Fetched, RulesSource};
/// # async fn run(source: RulesSource, held: Option<u64>) -> Result<(), sluice_rules_client::PollError> {
/// match source.fetch(held).await? {
///     Fetched::Unchanged => {}
///     Fetched::Changed(snapshot) => println!("revision {}: {} rules", snapshot.revision, snapshot.rules.len()),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum Fetched {
    /// The store is still at the revision asked with.
    Unchanged,
    /// The store's rules, checked.
    Changed(Snapshot),
}

/// A rules service to poll: its address, the token to send, and the bounds of one poll.
///
/// # Example
/// ```no_run
/// use sluice_rules_client::{Fetched, RulesSource};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let source = RulesSource::new("http://127.0.0.1:8083", Some("s3cret"))?;
/// let Fetched::Changed(first) = source.fetch(None).await? else { unreachable!() };
/// // Later: a 304 while the store stays at that revision.
/// let next = source.fetch(Some(first.revision)).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RulesSource {
    /// host:port, as sent in `Host` and connected to, and whether over TLS.
    target: crate::client::Target,
    /// How TLS is spoken to it (`https://`).
    tls: Option<crate::ClientTls>,
    /// The URL's path, before the API's own.
    base: String,
    path: String,
    authorization: Option<header::HeaderValue>,
    timeout: Duration,
    max_bytes: usize,
}

impl RulesSource {
    /// The service at `url` (`http://host:port`, optionally with a path prefix), sending
    /// `token` as a bearer token if given.
    ///
    /// # Errors
    /// Not an `http://` URL with a host, or a token a header cannot carry.
    ///
    /// # Example
    /// ```
    /// use sluice_rules_client::RulesSource;
    /// assert_eq!(RulesSource::new("http://rules.internal/sluice/", None)?.authority(), "rules.internal:80");
    /// assert!(RulesSource::new("rules.internal:8083", None).is_err());
    /// # Ok::<(), sluice_rules_client::UrlError>(())
    /// ```
    pub fn new(url: &str, token: Option<&str>) -> Result<Self, UrlError> {
        let (target, base) = crate::client::parse_url(url)?;
        // Mozilla's roots until told otherwise ([`RulesSource::tls`]).
        let tls = target
            .tls_name
            .is_some()
            .then(|| crate::ClientTls::new(None, None))
            .transpose()?;
        let path = format!("{base}/v1/rules");
        let authorization = token
            .map(|token| header::HeaderValue::from_str(&format!("Bearer {token}")))
            .transpose()
            .map_err(|_| UrlError::Token)?
            .map(|mut value| {
                value.set_sensitive(true);
                value
            });
        Ok(Self {
            target,
            tls,
            base,
            path,
            authorization,
            timeout: DEFAULT_TIMEOUT,
            max_bytes: DEFAULT_MAX_BYTES,
        })
    }

    /// How long one poll may take, connection included.
    ///
    /// ```
    /// let source = sluice_rules_client::RulesSource::new("http://127.0.0.1:8083", None)?
    ///     .timeout(std::time::Duration::from_millis(500));
    /// # Ok::<(), sluice_rules_client::UrlError>(())
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest answer taken.
    ///
    /// ```
    /// let source = sluice_rules_client::RulesSource::new("http://127.0.0.1:8083", None)?.max_bytes(1 << 20);
    /// # Ok::<(), sluice_rules_client::UrlError>(())
    /// ```
    #[must_use]
    pub fn max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// How TLS is spoken to an `https://` service (the CA trusted, the client certificate).
    ///
    /// ```
    /// let tls = sluice_rules_client::ClientTls::new(None, None)?;
    /// let source = sluice_rules_client::RulesSource::new("https://rules.internal:8443", None)?.tls(tls);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn tls(mut self, tls: crate::ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// host:port polled.
    ///
    /// ```
    /// let source = sluice_rules_client::RulesSource::new("http://127.0.0.1:8083", None)?;
    /// assert_eq!(source.authority(), "127.0.0.1:8083");
    /// # Ok::<(), sluice_rules_client::UrlError>(())
    /// ```
    pub fn authority(&self) -> &str {
        &self.target.authority
    }

    /// Sends a request of someone else's to the rules API (`path` is after `/v1`, with its
    /// query), with their `headers` and `body` and none of this source's own credentials: what
    /// a console editing the rules through the host does. Answers the status, the headers
    /// and the body, bounded like a poll's.
    ///
    /// # Errors
    /// The service unreachable or slow, or an answer over the bound.
    ///
    /// # Example
    /// ```no_run
    /// use sluice_rules_client::RulesSource;
    /// # async fn run(source: RulesSource) -> Result<(), sluice_rules_client::PollError> {
    /// let (status, _headers, body) = source
    ///     .forward(http::Method::GET, "domains?limit=10", Vec::new(), bytes::Bytes::new())
    ///     .await?;
    /// println!("{status}: {} bytes", body.len());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn forward(
        &self,
        method: http::Method,
        path: &str,
        headers: Vec<(header::HeaderName, header::HeaderValue)>,
        body: Bytes,
    ) -> Result<(StatusCode, header::HeaderMap, Bytes), PollError> {
        let path = format!("{}/v1/{}", self.base, path.trim_start_matches('/'));
        let sent = crate::client::send(
            method,
            &self.target,
            self.tls.as_ref(),
            &path,
            headers,
            body,
            self.max_bytes,
        );
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(answer) => answer,
            Err(_) => Err(PollError::Timeout(self.timeout)),
        }
    }

    /// Asks for the rules; with `known`, a store still at that revision answers
    /// [`Fetched::Unchanged`] without a body.
    ///
    /// # Errors
    /// The service unreachable or slow, a refused token, an unexpected status, or an answer
    /// that is not a good snapshot.
    ///
    /// # Example
    /// ```
    /// use sluice_rules_client::{PollError, RulesSource};
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// // Nothing listens on port 9 of this host: the poll fails, and says where it went.
    /// let source = RulesSource::new("http://127.0.0.1:9", None).unwrap();
    /// let failed = source.fetch(None).await.unwrap_err();
    /// assert!(matches!(failed, PollError::Connect { .. } | PollError::Timeout(_)), "{failed}");
    /// # }
    /// ```
    pub async fn fetch(&self, known: Option<u64>) -> Result<Fetched, PollError> {
        let span = tracing::trace_span!(
            target: sluice::TRACE_TARGET,
            "sluice.rules_poll",
            otel.kind = "client",
            changed = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        let exchange = tokio::time::timeout(self.timeout, self.exchange(known));
        let answer = match exchange.instrument(span.clone()).await {
            Ok(answer) => answer,
            Err(_) => Err(PollError::Timeout(self.timeout)),
        };
        if !span.is_disabled() {
            match &answer {
                Ok(fetched) => span.record("changed", matches!(fetched, Fetched::Changed(_))),
                Err(e) => {
                    span.record("otel.status_code", "ERROR");
                    span.record("otel.status_description", e.to_string())
                }
            };
        }
        answer
    }

    /// [`fetch`](Self::fetch) over a connection already made (`io`) instead of a new one to
    /// the service: how the answer is read, whatever its bytes. Not part of the API: the
    /// hostile-input checks (`sluice-invariants`) answer through it.
    ///
    /// # Errors
    /// As [`fetch`](Self::fetch)'s, but for reaching the service.
    #[doc(hidden)]
    pub async fn fetch_on<T>(&self, io: T, known: Option<u64>) -> Result<Fetched, PollError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        match tokio::time::timeout(self.timeout, self.exchange_on(io, known)).await {
            Ok(answer) => answer,
            Err(_) => Err(PollError::Timeout(self.timeout)),
        }
    }

    async fn exchange(&self, known: Option<u64>) -> Result<Fetched, PollError> {
        let connection = crate::client::connect_to(&self.target, self.tls.as_ref()).await?;
        self.exchange_on(connection, known).await
    }

    async fn exchange_on<T>(&self, io: T, known: Option<u64>) -> Result<Fetched, PollError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let mut headers = Vec::with_capacity(2);
        if let Some(authorization) = &self.authorization {
            headers.push((header::AUTHORIZATION, authorization.clone()));
        }
        if let Some(revision) = known {
            let etag = header::HeaderValue::from_str(&format!("\"{revision}\""))
                .map_err(|e| PollError::Http(e.to_string()))?;
            headers.push((header::IF_NONE_MATCH, etag));
        }
        let (status, _, body) = crate::client::send_on(
            io,
            http::Method::GET,
            &self.target.authority,
            &self.path,
            headers,
            Bytes::new(),
            self.max_bytes,
        )
        .await?;
        if status == StatusCode::NOT_MODIFIED && known.is_some() {
            return Ok(Fetched::Unchanged);
        }
        match status {
            StatusCode::OK => Snapshot::from_json(body).map(Fetched::Changed),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(PollError::Refused {
                status: status.as_u16(),
            }),
            _ => Err(PollError::Status {
                status: status.as_u16(),
                detail: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
            }),
        }
    }
}
