//! [`RateLimit`]: the service the layer puts around an inner one.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::ResponseFuture;
use super::future::Waiting;
use super::gatekeeper::{Gate, Gatekeeper};

/// The service made by [`RateLimitLayer`](super::RateLimitLayer) around an inner service.
///
/// # Example
/// ```
/// use sluice::{KeyedLimiter, TokenBucket};
/// use sluice_http::{RateLimit, RateLimitLayer};
/// use tower_layer::Layer;
/// # #[derive(Clone)] struct Inner;
/// let limiter = KeyedLimiter::<String, _>::builder(TokenBucket, "1/s".parse()?).build()?;
/// let service: RateLimit<Inner> = RateLimitLayer::builder(limiter).build()?.layer(Inner);
/// let _copy = service.clone(); // clones share the limiter
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    gatekeeper: Arc<Gatekeeper>,
}

impl<S> RateLimit<S> {
    pub(super) fn new(inner: S, gatekeeper: Arc<Gatekeeper>) -> Self {
        Self { inner, gatekeeper }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the layer.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// What the charges after responses came to, as
    /// [`RateLimitLayer::charge_counts`](super::RateLimitLayer::charge_counts) says.
    pub fn charge_counts(&self) -> Option<crate::ChargeCounts> {
        self.gatekeeper.charge.as_ref().map(|charger| charger.counts())
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: From<&'static str>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.gatekeeper.decide(&request) {
            Gate::Decided(admission, charge) => ResponseFuture::admitted_or_denied(
                admission,
                charge,
                &self.gatekeeper,
                &mut self.inner,
                request,
            ),
            Gate::BadKey(rejection) => ResponseFuture::ready(Gatekeeper::bad_key(rejection)),
            Gate::Wait(check, key) => ResponseFuture::checking(check, self.hold(request, key)),
            Gate::Queue(wait, key) => ResponseFuture::queued(wait, self.hold(request, key)),
        }
    }
}

impl<S: Clone> RateLimit<S> {
    /// A request held back until its check completes, with the service to call then.
    fn hold<ReqBody>(&mut self, request: Request<ReqBody>, key: Box<str>) -> Waiting<S, ReqBody> {
        // The service made ready by `poll_ready` goes with the request; a fresh clone stays
        // here for the next `poll_ready` (tower's clone-and-replace).
        let fresh = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, fresh);
        Waiting {
            inner: ready,
            request,
            key,
            gatekeeper: Arc::clone(&self.gatekeeper),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::time::Duration;

    use http::StatusCode;
    use sluice::{KeyedLimiter, ManualClock, StaticQuotas, TokenBucket};
    use tower_layer::Layer;

    use super::*;
    use crate::{KeyPart, RateLimitLayer};

    #[derive(Clone)]
    struct Hello;

    impl Service<Request<()>> for Hello {
        type Response = Response<&'static str>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Ok(Response::new("Hello World!")))
        }
    }

    fn service(policy_name: &str, clock: &ManualClock) -> RateLimit<Hello> {
        let quotas = StaticQuotas::from_iter([("alice".to_string(), "6/min burst 2".parse().unwrap())]);
        let limiter = KeyedLimiter::builder(TokenBucket, "1/s".parse().unwrap())
            .source(quotas)
            .clock(clock.clone())
            .build()
            .unwrap();
        RateLimitLayer::builder(limiter)
            .key([KeyPart::Header(http::HeaderName::from_static("x-account-id"))])
            .policy_name(policy_name)
            .build()
            .unwrap()
            .layer(Hello)
    }

    fn respond(service: &mut RateLimit<Hello>) -> Response<&'static str> {
        let request = Request::builder()
            .header("x-account-id", "alice")
            .body(())
            .unwrap();
        let future = std::pin::pin!(service.call(request));
        match future.poll(&mut Context::from_waker(std::task::Waker::noop())) {
            Poll::Ready(Ok(response)) => response,
            _ => unreachable!("answered at once"),
        }
    }

    fn field<'r>(response: &'r Response<&'static str>, name: &str) -> &'r str {
        response.headers()[name].to_str().unwrap()
    }

    #[test]
    fn repeated_denials_carry_their_own_policy_and_current_numbers() {
        let clock = ManualClock::new(0);
        let mut first = service("first", &clock);
        let mut second = service("second", &clock);
        for service in [&mut first, &mut second] {
            for _ in 0..2 {
                assert_eq!(respond(service).status(), StatusCode::OK);
            }
        }
        // Equal numbers under two policies, alternating on one thread: each keeps its name.
        for _ in 0..3 {
            for (service, name) in [(&mut first, "first"), (&mut second, "second")] {
                let denied = respond(service);
                assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(field(&denied, "ratelimit-policy"), format!("\"{name}\";q=2;w=20"));
                assert_eq!(field(&denied, "ratelimit"), format!("\"{name}\";r=0;t=20"));
                assert_eq!(field(&denied, "retry-after"), "10");
                assert_eq!(field(&denied, "content-type"), "text/plain");
                assert_eq!(denied.headers().len(), 7);
            }
        }
        // Time passes: the next denial's numbers move with it.
        clock.advance(Duration::from_secs(4));
        let denied = respond(&mut first);
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(field(&denied, "ratelimit"), "\"first\";r=0;t=16");
        assert_eq!(field(&denied, "retry-after"), "6");
        assert_eq!(field(&denied, "x-ratelimit-reset"), "16");
    }
}
