//! [`ResponseFuture`]: the request on its way to the inner service, or the layer's own answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::gatekeeper::{Admission, ChargeTo, Gatekeeper, server_error};
use crate::CheckFuture;
use crate::headers::{Rendered, Waited};
use crate::wait::WaitFuture;

/// Where an admitted request's response cost is charged (the layer charges after responses).
pub(super) struct Charging {
    to: ChargeTo,
    gatekeeper: Arc<Gatekeeper>,
}

impl Charging {
    fn settle(&self, headers: &mut http::HeaderMap) {
        let Some(charger) = &self.gatekeeper.charge else {
            return;
        };
        match &self.to {
            ChargeTo::Key(key) => charger.settle(&*self.gatekeeper.backend, key, headers),
            ChargeTo::Nobody => charger.strip(headers),
        }
    }
}

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
        Queued { wait: WaitFuture, waiting: Option<Box<Waiting<S, ReqBody>>> },
        Inner {
            #[pin] future: S::Future,
            fields: Option<Rendered>,
            waited: Option<Waited>,
            charge: Option<Box<Charging>>,
        },
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
        charge: Option<ChargeTo>,
        gatekeeper: &Arc<Gatekeeper>,
        inner: &mut S,
        request: Request<ReqBody>,
    ) -> Self {
        let kind = Kind::admitted_or_denied(admission, charge, gatekeeper, inner, request, None);
        Self { kind }
    }

    /// Whether the layer holds the request back: it waits for a backend's later answer or
    /// for capacity in its key's queue (`on_excess`). A server's idle timeout should not
    /// cut a connection whose request is held.
    ///
    /// # Example
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use sluice::{KeyedLimiter, TokenBucket};
    /// use sluice_http::RateLimitLayer;
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    /// # #[derive(Clone)] struct Hello;
    /// # impl Service<Request<()>> for Hello {
    /// #     type Response = Response<String>;
    /// #     type Error = Infallible;
    /// #     type Future = std::future::Ready<Result<Response<String>, Infallible>>;
    /// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
    /// #         std::task::Poll::Ready(Ok(()))
    /// #     }
    /// #     fn call(&mut self, _: Request<()>) -> Self::Future { std::future::ready(Ok(Response::new(String::new()))) }
    /// # }
    /// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse()?).build()?;
    /// let mut service = RateLimitLayer::builder(limiter).build()?.layer(Hello);
    /// let answer = service.call(Request::new(()));
    /// assert!(!answer.is_held()); // decided at once by an in-memory limiter
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_held(&self) -> bool {
        matches!(self.kind, Kind::Checking { .. } | Kind::Queued { .. })
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

    /// The request waiting in its key's queue.
    pub(super) fn queued(wait: WaitFuture, waiting: Waiting<S, ReqBody>) -> Self {
        let kind = Kind::Queued {
            wait,
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
    /// `waited`: how long the request waited in its key's queue, if it did; `charge`: the key
    /// its response's cost is charged to, if the layer charges after responses.
    fn admitted_or_denied(
        admission: Admission,
        charge: Option<ChargeTo>,
        gatekeeper: &Arc<Gatekeeper>,
        inner: &mut S,
        request: Request<ReqBody>,
        waited: Option<Waited>,
    ) -> Self {
        match admission {
            Admission::Pass(fields, listed) => Kind::Inner {
                future: inner.call(request),
                fields: fields.map(|f| gatekeeper.render(f, listed.as_deref())),
                waited,
                charge: charge.map(|to| {
                    Box::new(Charging {
                        to,
                        gatekeeper: Arc::clone(gatekeeper),
                    })
                }),
            },
            Admission::Deny(fields, listed) => {
                let mut response = gatekeeper.denied(fields, listed);
                if let Some(waited) = waited {
                    waited.write(response.headers_mut());
                }
                Kind::Ready {
                    response: Some(response),
                }
            }
        }
    }

    /// The request once its check completed, with what it needs kept in `waiting`.
    fn settled(
        waiting: Option<Box<Waiting<S, ReqBody>>>,
        answer: Result<sluice::Decision, sluice::CheckError>,
        listed: Option<Box<crate::SeveralLimits>>,
        waited: Option<Waited>,
    ) -> Self {
        let Some(waiting) = waiting else {
            return Kind::Ready {
                response: Some(server_error()),
            };
        };
        let Waiting {
            mut inner,
            request,
            key,
            gatekeeper,
        } = *waiting;
        let admission = gatekeeper.admission(answer, || gatekeeper.backend.quota(&key), listed);
        let charge = gatekeeper.charge_key(&admission, &key);
        Kind::admitted_or_denied(admission, charge, &gatekeeper, &mut inner, request, waited)
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
                    let answer = std::task::ready!(Pin::new(&mut *check).poll(cx));
                    Kind::settled(waiting.take(), answer, check.take_listed(), None)
                }
                KindProj::Queued { wait, waiting } => {
                    let (answer, waited, listed) = std::task::ready!(Pin::new(wait).poll(cx));
                    Kind::settled(waiting.take(), answer, listed, Waited::of(waited))
                }
                KindProj::Inner {
                    future,
                    fields,
                    waited,
                    charge,
                } => {
                    let mut response = std::task::ready!(future.poll(cx))?;
                    if let Some(charge) = charge.take() {
                        charge.settle(response.headers_mut());
                    }
                    if let Some(fields) = fields.take() {
                        fields.write(response.headers_mut());
                    }
                    if let Some(waited) = waited.take() {
                        waited.write(response.headers_mut());
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
