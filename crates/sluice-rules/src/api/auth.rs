//! Who may call the rules API: one extractor, [`Authorized`], that every handler takes with
//! the scope it needs, so no handler reads a token itself.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;

use super::{Shared, problem};
use crate::tokens::Scope;

/// The scope a handler needs, as a type, so [`Authorized`] can name it.
pub(super) trait Needs: Send + Sync + 'static {
    const SCOPE: Scope;
}

/// Reading rules.
pub(super) enum ToRead {}

impl Needs for ToRead {
    const SCOPE: Scope = Scope::Read;
}

/// Writing rules.
pub(super) enum ToWrite {}

impl Needs for ToWrite {
    const SCOPE: Scope = Scope::Write;
}

/// The caller whose bearer token allows `N`'s scope; the request is refused (401, 403)
/// before the handler runs otherwise.
pub(super) struct Authorized<N> {
    /// The token's name, which the history records.
    pub(super) name: String,
    needs: PhantomData<N>,
}

impl<S, N> FromRequestParts<Arc<Shared<S>>> for Authorized<N>
where
    S: Send + Sync,
    N: Needs,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared<S>>) -> Result<Self, Response> {
        // Without tokens the API is open: its caller binds it to loopback only.
        if shared.tokens.is_empty() {
            return Ok(Self {
                name: "local".into(),
                needs: PhantomData,
            });
        }
        let secret = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        let Some(caller) = secret.and_then(|secret| shared.tokens.caller(secret.trim())) else {
            let mut answer = problem(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "send Authorization: Bearer TOKEN",
            );
            answer
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return Err(answer);
        };
        if caller.scope < N::SCOPE {
            return Err(problem(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("token '{}' may read, not write", caller.name),
            ));
        }
        Ok(Self {
            name: caller.name,
            needs: PhantomData,
        })
    }
}
