//! The rules service's HTTP API (JSON; errors as `application/problem+json`):
//!
//! | request | answer |
//! |---|---|
//! | `GET /v1/rules` | every domain and the store's revision, read at one instant; `ETag` is the revision, so `If-None-Match` with it answers 304 while nothing changed (the retriever's poll) |
//! | `GET /v1/domains?prefix=&after=&limit=` | a page of domains (name and revision), `next` to pass as `after` |
//! | `GET /v1/domains/{domain}` | its rules file and revision; `ETag` |
//! | `PUT /v1/domains/{domain}` | the body is the rules file: creates (201), or replaces with `If-Match: "N"` (200; 412 if the domain moved on, 428 without it); `If-None-Match: *` creates only |
//! | `PATCH /v1/domains/{domain}` | a JSON Patch (`application/json-patch+json`, RFC 6902) on the rules file's fields, with `If-Match` (200; 412, 428; 409 when a `test` fails or the stored rules do not read back as the same rules once read as a document, 422 when an operation does not apply or the result is not valid rules or too large) |
//! | `DELETE /v1/domains/{domain}` | with `If-Match` (204; 412, 428) |
//! | `GET /v1/domains/{domain}/history` | every change: revision, who, when, before, after |
//!
//! With tokens, every request needs `Authorization: Bearer TOKEN` of the scope it asks for
//! (401 without one, 403 with a read token for a write); the history records the token's
//! name. Without tokens everything is open: the caller binds to loopback only.

mod auth;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use sluice_rules_client::{DomainBody, SnapshotBody};
use tokio::net::TcpListener;

use auth::{Authorized, ToRead, ToWrite};

use crate::patch::PatchError;
use crate::tokens::Tokens;
use crate::{DomainRecord, RuleStore, StoreError};

/// The largest rules file a write takes.
pub const MAX_RULES_BYTES: usize = 4 * 1024 * 1024;

/// The page size when a list names none.
const DEFAULT_PAGE: usize = 100;

/// The rules service's API over a store.
///
/// # Example
/// ```no_run
/// use std::sync::Arc;
/// use sluice_rules::{RulesApi, SqliteStore, Tokens};
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(SqliteStore::open("rules.db".as_ref())?);
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8083").await?;
/// RulesApi::new(store, Tokens::default()).serve(listener, std::future::pending()).await?;
/// # Ok(())
/// # }
/// ```
pub struct RulesApi<S> {
    shared: Arc<Shared<S>>,
}

struct Shared<S> {
    store: Arc<S>,
    tokens: Tokens,
}

impl<S> Clone for RulesApi<S> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: RuleStore + Send + Sync + 'static> RulesApi<S> {
    /// The API over `store`, open to the holders of `tokens` (to everyone if there are none).
    pub fn new(store: Arc<S>, tokens: Tokens) -> Self {
        Self {
            shared: Arc::new(Shared { store, tokens }),
        }
    }

    /// Its routes.
    pub fn router(self) -> Router {
        Router::new()
            .route("/v1/rules", get(snapshot::<S>))
            .route("/v1/domains", get(list::<S>))
            .route(
                "/v1/domains/{domain}",
                get(read::<S>)
                    .put(write::<S>)
                    .patch(patch::<S>)
                    .delete(remove::<S>),
            )
            .route("/v1/domains/{domain}/history", get(history::<S>))
            .layer(DefaultBodyLimit::max(MAX_RULES_BYTES))
            .with_state(self.shared)
    }

    /// Serves the API on `listener` until `shutdown` completes.
    ///
    /// # Errors
    /// The listener failed.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

fn problem(status: StatusCode, title: &str, detail: impl AsRef<str>) -> Response {
    sluice_http::problem(status, title, detail.as_ref()).into_response()
}

fn store_problem(error: StoreError) -> Response {
    let (status, title) = match &error {
        StoreError::NotFound(_) => (StatusCode::NOT_FOUND, "No such domain"),
        StoreError::Exists(_) => (StatusCode::CONFLICT, "Domain exists"),
        StoreError::Stale { .. } => (StatusCode::PRECONDITION_FAILED, "Stale write"),
        StoreError::Invalid(_) | StoreError::WrongDomain { .. } => {
            (StatusCode::UNPROCESSABLE_ENTITY, "Invalid rules")
        }
        StoreError::PageSize(_) => (StatusCode::BAD_REQUEST, "Bad page size"),
        // The server gave no answer: another try may find it back.
        StoreError::Postgres(e) if e.is_unreachable() => {
            tracing::error!("rules store: {error}");
            (StatusCode::SERVICE_UNAVAILABLE, "Store unavailable")
        }
        StoreError::NewerSchema { .. } | StoreError::Database(_) | StoreError::Postgres(_) => {
            tracing::error!("rules store: {error}");
            (StatusCode::INTERNAL_SERVER_ERROR, "Store failed")
        }
    };
    problem(status, title, error.to_string())
}

/// An answer refusing a request (boxed: a `Response` is large to carry in a `Result`).
type Refused = Box<Response>;

/// Runs a store call off the async threads (SQLite blocks).
async fn blocking<S, T>(
    shared: &Arc<Shared<S>>,
    call: impl FnOnce(&S) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Refused>
where
    S: RuleStore + Send + Sync + 'static,
    T: Send + 'static,
{
    let store = Arc::clone(&shared.store);
    match tokio::task::spawn_blocking(move || call(&store)).await {
        Ok(answer) => answer.map_err(|e| Box::new(store_problem(e))),
        Err(_) => Err(Box::new(problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Store failed",
            "the store call did not finish",
        ))),
    }
}

fn etag(revision: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{revision}\"")).unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

/// A precondition header's revision: `"N"` (or a weak `W/"N"`); `*` is `Some(None)`.
fn precondition(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<Option<u64>>, Refused> {
    let Some(value) = headers.get(&name) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(Some(None));
    }
    let bare = text.strip_prefix("W/").unwrap_or(text);
    bare.strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .and_then(|digits| digits.parse().ok())
        .map(|revision| Some(Some(revision)))
        .ok_or_else(|| {
            Box::new(problem(
                StatusCode::BAD_REQUEST,
                "Bad precondition",
                format!("{name}: expected an ETag of this API (\"N\") or *"),
            ))
        })
}

/// The `If-Match` a change of an existing domain must send: its revision, or `None` for `*`.
fn required_if_match(headers: &HeaderMap) -> Result<Option<u64>, Refused> {
    match precondition(headers, header::IF_MATCH)? {
        Some(if_match) => Ok(if_match),
        None => Err(Box::new(problem(
            StatusCode::PRECONDITION_REQUIRED,
            "If-Match required",
            "send If-Match with the ETag you read (or *)",
        ))),
    }
}

/// A stored domain as the API sends it (and a host's retriever reads it).
impl From<DomainRecord> for DomainBody {
    fn from(record: DomainRecord) -> Self {
        Self {
            domain: record.domain,
            revision: record.revision,
            rules: record.text,
        }
    }
}

fn with_etag(status: StatusCode, revision: u64, body: impl Serialize) -> Response {
    let mut answer = (status, axum::Json(body)).into_response();
    answer.headers_mut().insert(header::ETAG, etag(revision));
    answer
}

async fn snapshot<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    _: Authorized<ToRead>,
    headers: HeaderMap,
) -> Response {
    let seen = match precondition(&headers, header::IF_NONE_MATCH) {
        Ok(seen) => seen.flatten(),
        Err(bad) => return *bad,
    };
    // The revision alone first: an unchanged store costs one small read.
    let revision = match blocking(&shared, |store| store.revision()).await {
        Ok(revision) => revision,
        Err(failed) => return *failed,
    };
    if seen == Some(revision) {
        let mut answer = StatusCode::NOT_MODIFIED.into_response();
        answer.headers_mut().insert(header::ETAG, etag(revision));
        return answer;
    }
    match blocking(&shared, |store| store.snapshot()).await {
        Ok((revision, domains)) => with_etag(
            StatusCode::OK,
            revision,
            SnapshotBody {
                revision,
                domains: domains.into_iter().map(DomainBody::from).collect(),
            },
        ),
        Err(failed) => *failed,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct ListedBody {
    domain: String,
    revision: u64,
}

#[derive(Serialize)]
struct ListBody {
    domains: Vec<ListedBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<String>,
}

async fn list<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    _: Authorized<ToRead>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "Bad query", e.body_text()),
    };
    let limit = query.limit.unwrap_or(DEFAULT_PAGE);
    match blocking(&shared, move |store| {
        store.list(&query.prefix, query.after.as_deref(), limit)
    })
    .await
    {
        Ok(listing) => axum::Json(ListBody {
            domains: listing
                .domains
                .into_iter()
                .map(|d| ListedBody {
                    domain: d.domain,
                    revision: d.revision,
                })
                .collect(),
            next: listing.next,
        })
        .into_response(),
        Err(failed) => *failed,
    }
}

async fn read<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    Path(domain): Path<String>,
    _: Authorized<ToRead>,
) -> Response {
    match blocking(&shared, move |store| store.get(&domain)).await {
        Ok(record) => with_etag(StatusCode::OK, record.revision, DomainBody::from(record)),
        Err(failed) => *failed,
    }
}

async fn write<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    Path(domain): Path<String>,
    caller: Authorized<ToWrite>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match readable(body) {
        Ok(body) => body,
        Err(refused) => return *refused,
    };
    let Ok(text) = String::from_utf8(body.to_vec()) else {
        return problem(
            StatusCode::BAD_REQUEST,
            "Unreadable body",
            "the rules file is not UTF-8",
        );
    };
    let (if_match, if_none_match) = match (
        precondition(&headers, header::IF_MATCH),
        precondition(&headers, header::IF_NONE_MATCH),
    ) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(bad), _) | (_, Err(bad)) => return *bad,
    };
    let answer = blocking(&shared, move |store| {
        crate::checked_for(&domain, &text)?;
        let held = match store.get(&domain) {
            Ok(held) => Some(held),
            Err(StoreError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(match (held, if_match, if_none_match) {
            (None, None, _) => Written::Created(store.create(&text, &caller.name)?),
            (Some(held), Some(expected), None) => {
                // `*`: whatever revision it is at now.
                let expected = expected.unwrap_or(held.revision);
                Written::Replaced(store.replace(&domain, &text, Some(expected), &caller.name)?)
            }
            (Some(held), _, Some(_)) => {
                Written::Failed(format!("domain '{domain}' exists (revision {})", held.revision))
            }
            (None, Some(_), _) => Written::Failed(format!("domain '{domain}' does not exist")),
            (Some(_), None, None) => Written::Required,
        })
    })
    .await;
    match answer {
        Ok(Written::Created(record)) => {
            with_etag(StatusCode::CREATED, record.revision, DomainBody::from(record))
        }
        Ok(Written::Replaced(record)) => with_etag(StatusCode::OK, record.revision, DomainBody::from(record)),
        Ok(Written::Failed(detail)) => {
            problem(StatusCode::PRECONDITION_FAILED, "Precondition failed", detail)
        }
        Ok(Written::Required) => problem(
            StatusCode::PRECONDITION_REQUIRED,
            "If-Match required",
            "the domain exists: send If-Match with the ETag you read (or *)",
        ),
        Err(failed) => *failed,
    }
}

/// A request body within the bound, or the answer saying why not.
fn readable(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Refused> {
    match body {
        Ok(body) => Ok(body),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(Box::new(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Body too large",
            format!("a body is at most {MAX_RULES_BYTES} bytes"),
        ))),
        Err(rejection) => Err(Box::new(problem(
            rejection.status(),
            "Unreadable body",
            rejection.body_text(),
        ))),
    }
}

/// `PATCH /v1/domains/{domain}`: a JSON Patch applied to the domain at the revision named by
/// `If-Match`, stored as a replace (checked; one revision, one history entry).
async fn patch<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    Path(domain): Path<String>,
    caller: Authorized<ToWrite>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let kind = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if !kind.is_some_and(|kind| kind.trim().starts_with("application/json-patch+json")) {
        return problem(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "JSON Patch expected",
            "send Content-Type: application/json-patch+json",
        );
    }
    let body = match readable(body) {
        Ok(body) => body,
        Err(refused) => return *refused,
    };
    let if_match = match required_if_match(&headers) {
        Ok(if_match) => if_match,
        Err(refused) => return *refused,
    };
    let answer = blocking(&shared, move |store| {
        let held = store.get(&domain)?;
        let expected = if_match.unwrap_or(held.revision);
        if expected != held.revision {
            return Err(StoreError::Stale {
                domain,
                expected,
                current: held.revision,
            });
        }
        match crate::patch::apply(&held.text, &body) {
            Ok(text) => Ok(Ok(store.replace(&domain, &text, Some(expected), &caller.name)?)),
            Err(e) => Ok(Err(e)),
        }
    })
    .await;
    match answer {
        Ok(Ok(record)) => with_etag(StatusCode::OK, record.revision, DomainBody::from(record)),
        Ok(Err(e)) => {
            let (status, title) = match &e {
                PatchError::Syntax(_) | PatchError::TooLong(_) => (StatusCode::BAD_REQUEST, "Bad patch"),
                PatchError::TestFailed { .. } => (StatusCode::CONFLICT, "Patch test failed"),
                PatchError::NotADocument(_) => (StatusCode::CONFLICT, "Stored rules not patchable"),
                PatchError::Operation { .. } | PatchError::TooLarge(_) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "Patch does not apply")
                }
                PatchError::Stored(_) => (StatusCode::INTERNAL_SERVER_ERROR, "Store failed"),
            };
            problem(status, title, e.to_string())
        }
        Err(failed) => *failed,
    }
}

/// What a PUT did.
enum Written {
    Created(DomainRecord),
    Replaced(DomainRecord),
    /// A precondition did not hold.
    Failed(String),
    /// A replace without `If-Match`.
    Required,
}

async fn remove<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    Path(domain): Path<String>,
    caller: Authorized<ToWrite>,
    headers: HeaderMap,
) -> Response {
    let if_match = match required_if_match(&headers) {
        Ok(if_match) => if_match,
        Err(refused) => return *refused,
    };
    match blocking(&shared, move |store| {
        store.delete(&domain, if_match, &caller.name)
    })
    .await
    {
        Ok(revision) => {
            let mut answer = StatusCode::NO_CONTENT.into_response();
            answer.headers_mut().insert(header::ETAG, etag(revision));
            answer
        }
        Err(failed) => *failed,
    }
}

#[derive(Serialize)]
struct ChangeBody {
    revision: u64,
    who: String,
    at_unix_ms: i64,
    before: Option<String>,
    after: Option<String>,
}

async fn history<S: RuleStore + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<S>>>,
    Path(domain): Path<String>,
    _: Authorized<ToRead>,
) -> Response {
    match blocking(&shared, move |store| store.history(&domain)).await {
        Ok(changes) => axum::Json(
            changes
                .into_iter()
                .map(|c| ChangeBody {
                    revision: c.revision,
                    who: c.who,
                    at_unix_ms: c.at_unix_ms,
                    before: c.before,
                    after: c.after,
                })
                .collect::<Vec<_>>(),
        )
        .into_response(),
        Err(failed) => *failed,
    }
}
