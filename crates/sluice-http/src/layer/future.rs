//! [`ResponseFuture`]: the request on its way to the inner service, or the layer's own answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::gatekeeper::{Admission, Gatekeeper, server_error};
use crate::CheckFuture;
use crate::headers::Rendered;

/// A request held back while the backend decides, with what it needs afterwards.
pub(super) struct Waiting<S, ReqBody> {
    pub(super) inner: S,
    pub(super) request: Request<ReqBody>,
    pub(super) key: Box<str>,
    pub(super) gatekeeper: Arc<Gatekeeper>,
}

pin_project! {
    /// The response of [`RateLimit`](super::RateLimit): the inner service's (with the
    /// rate-limit fields added) or the layer's own 429 or 400. Returned by `RateLimit::call`;
    /// see [`RateLimitLayer`](super::RateLimitLayer) for an example that polls it.
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        #[pin]
        kind: Kind<S, ReqBody, ResBody>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>>,
    {
        // Boxed: only remote backends wait, and the in-memory future stays small.
        Checking { check: CheckFuture, waiting: Option<Box<Waiting<S, ReqBody>>> },
        Inner { #[pin] future: S::Future, fields: Option<Rendered> },
        Ready { response: Option<Response<ResBody>> },
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<&'static str>,
{
    /// The request passed on to `inner`, or denied.
    pub(super) fn admitted_or_denied(
        admission: Admission,
        gatekeeper: &Gatekeeper,
        inner: &mut S,
        request: Request<ReqBody>,
    ) -> Self {
        let kind = Kind::admitted_or_denied(admission, gatekeeper, inner, request);
        Self { kind }
    }

    /// The layer's own answer, known now.
    pub(super) fn ready(response: Response<ResBody>) -> Self {
        let kind = Kind::Ready {
            response: Some(response),
        };
        Self { kind }
    }

    /// The request held back until `check` completes.
    pub(super) fn checking(check: CheckFuture, waiting: Waiting<S, ReqBody>) -> Self {
        let kind = Kind::Checking {
            check,
            waiting: Some(Box::new(waiting)),
        };
        Self { kind }
    }
}

impl<S, ReqBody, ResBody> Kind<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<&'static str>,
{
    fn admitted_or_denied(
        admission: Admission,
        gatekeeper: &Gatekeeper,
        inner: &mut S,
        request: Request<ReqBody>,
    ) -> Self {
        match admission {
            Admission::Pass(fields) => Kind::Inner {
                future: inner.call(request),
                fields: fields.map(|f| gatekeeper.render(f)),
            },
            Admission::Deny(fields) => Kind::Ready {
                response: Some(gatekeeper.denied(fields)),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: From<&'static str>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut kind = self.project().kind;
        loop {
            let next = match kind.as_mut().project() {
                KindProj::Checking { check, waiting } => {
                    let answer = std::task::ready!(Pin::new(check).poll(cx));
                    let Some(waiting) = waiting.take() else {
                        return Poll::Ready(Ok(server_error()));
                    };
                    let Waiting {
                        mut inner,
                        request,
                        key,
                        gatekeeper,
                    } = *waiting;
                    let admission = gatekeeper.admission(answer, || gatekeeper.backend.quota(&key));
                    Kind::admitted_or_denied(admission, &gatekeeper, &mut inner, request)
                }
                KindProj::Inner { future, fields } => {
                    let mut response = std::task::ready!(future.poll(cx))?;
                    if let Some(fields) = fields.take() {
                        fields.write(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response));
                }
                // Polled again after completion: a contract breach by the caller. Answer 500
                // rather than panic.
                KindProj::Ready { response } => {
                    return Poll::Ready(Ok(response.take().unwrap_or_else(server_error)));
                }
            };
            kind.set(next);
        }
    }
}
