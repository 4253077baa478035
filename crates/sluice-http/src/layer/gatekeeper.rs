//! What the layer decides with, and its own answers: 429, 400 and 500.

use std::collections::HashSet;
use std::sync::Arc;

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use sluice::{CheckError, Decision, QueueOrder, Quota, WaitPolicy};

use super::PeerAddrReader;
use crate::charge::Charger;
use crate::headers::{ListedFields, RateFields, Rendered, denial_headers};
use crate::key::{KeyBuf, KeyRejection, KeySource};
use crate::wait::{ExcessPolicies, WaitFuture, after_check, queue};
use crate::{CheckFuture, ClientIpHeader, LimitBackend, RouteCosts, SeveralLimits, TrustedProxies};

/// The body of a 429 response.
///
/// # Example
/// ```
/// assert_eq!(sluice_http::EXCEEDED_BODY, "Exceeded quota");
/// ```
pub const EXCEEDED_BODY: &str = "Exceeded quota";

/// A built layer's settings and backend, shared by every clone of its service: it decides
/// whether a request goes on to the inner service.
pub(super) struct Gatekeeper {
    /// Unique per built layer, so a cached header block is never another layer's.
    pub(super) policy_id: u64,
    pub(super) backend: Arc<dyn LimitBackend>,
    pub(super) keys: KeySource,
    pub(super) proxies: TrustedProxies,
    pub(super) client_ip_header: ClientIpHeader,
    pub(super) bypass: HashSet<Box<str>, foldhash::fast::FixedState>,
    pub(super) costs: RouteCosts,
    pub(super) headers_on_allow: bool,
    pub(super) policy_name: Box<str>,
    pub(super) peer_addr: PeerAddrReader,
    /// Whether requests over their quota wait; `None` when none may.
    pub(super) excess: Option<ExcessPolicies>,
    /// The cost responses report, charged after them; `None` when none is.
    pub(super) charge: Option<Charger>,
}

/// What becomes of a request.
pub(super) enum Gate {
    /// With the key to charge the response's cost to, for an admission when the layer
    /// charges after responses.
    Decided(Admission, Option<ChargeTo>),
    BadKey(KeyRejection),
    /// The backend answers later; the key is kept to read its quota then.
    Wait(CheckFuture, Box<str>),
    /// Over its quota, the request waits in its key's queue (or for a remote backend's first
    /// answer, then there).
    Queue(WaitFuture, Box<str>),
}

/// Whom an admitted request's response cost is charged to, when the layer charges after
/// responses.
pub(super) enum ChargeTo {
    Key(Box<str>),
    /// A bypassed key: charged nothing, its response's cost header still stripped if asked.
    Nobody,
}

/// What becomes of a request once the backend has answered: with the fields of the key's
/// other limits when it is held to several.
pub(super) enum Admission {
    /// On to the inner service, with the fields to add to its response unless turned off.
    Pass(Option<RateFields>, Listed),
    Deny(RateFields, Listed),
}

/// The fields of a key's other limits, when it is held to several.
pub(super) type Listed = Option<Box<ListedFields>>;

impl Gatekeeper {
    pub(super) fn decide<B>(&self, request: &Request<B>) -> Gate {
        let headers = request.headers();
        match self.keys.borrowed_key(headers) {
            Some(Ok(key)) => self.decide_for(request, key),
            Some(Err(rejection)) => Gate::BadKey(rejection),
            None => {
                let peer = (self.peer_addr)(request.extensions()).filter(|_| self.keys.needs_ip());
                let ip = match peer
                    .map(|peer| self.proxies.client_ip(peer.ip(), self.client_ip_header, headers))
                {
                    Some(Ok(ip)) => Some(ip),
                    Some(Err(e)) => return Gate::BadKey(KeyRejection::ClientIp(e)),
                    None => None,
                };
                let mut buf = KeyBuf::new(self.keys.max_len);
                match self.keys.key(headers, ip, &mut buf) {
                    Ok(key) => self.decide_for(request, key),
                    Err(rejection) => Gate::BadKey(rejection),
                }
            }
        }
    }

    fn decide_for<B>(&self, request: &Request<B>, key: &str) -> Gate {
        if !self.bypass.is_empty() && self.bypass.contains(key) {
            return Gate::Decided(
                Admission::Pass(None, None),
                self.charge.as_ref().map(|_| ChargeTo::Nobody),
            );
        }
        let cost = self.costs.cost(request.method(), request.uri().path());
        if let Some(excess) = &self.excess
            && let Some(policy) = excess.of(key)
        {
            return self.decide_waiting(excess, *policy, key, cost);
        }
        let (check, quota) = self.backend.check_quoted(key, cost);
        match check.into_ready_listed() {
            Ok((answer, listed)) => self.decided(
                self.admission(answer, || quota.or_else(|| self.backend.quota(key)), listed),
                key,
            ),
            Err(pending) => Gate::Wait(pending, key.into()),
        }
    }

    /// An admission decided now, with the key its response's cost is charged to if the layer
    /// charges after responses and the request goes on.
    #[inline]
    fn decided(&self, admission: Admission, key: &str) -> Gate {
        let charge = self.charge_key(&admission, key);
        Gate::Decided(admission, charge)
    }

    /// The key an admitted request's response is charged to, when the layer charges after
    /// responses (owned only then).
    #[inline]
    pub(super) fn charge_key(&self, admission: &Admission, key: &str) -> Option<ChargeTo> {
        (self.charge.is_some() && matches!(admission, Admission::Pass(..))).then(|| ChargeTo::Key(key.into()))
    }

    /// The decision for a request that may wait: oldest-first, it joins its key's waiters
    /// without asking the limit (it must not take capacity from them); otherwise it asks,
    /// and joins the queue if denied.
    #[inline(never)]
    fn decide_waiting(&self, excess: &ExcessPolicies, policy: WaitPolicy, key: &str, cost: u64) -> Gate {
        let room = &excess.room;
        if policy.queue_order() == QueueOrder::OldestFirst && room.has_queue(key) {
            let quota = self.backend.quota(key);
            return self.join(excess, policy, key, cost, (None, quota), None);
        }
        let (check, quota) = self.backend.check_quoted(key, cost);
        match check.into_ready_listed() {
            Ok((Ok(decision), listed)) if !decision.is_allowed() => {
                let quota = match &listed {
                    Some(listed) => listed.quota,
                    None => quota.or_else(|| self.backend.quota(key)),
                };
                self.join(excess, policy, key, cost, (Some(decision), quota), listed)
            }
            Ok((answer, listed)) => self.decided(
                self.admission(answer, || quota.or_else(|| self.backend.quota(key)), listed),
                key,
            ),
            Err(pending) => {
                let room = Arc::clone(room);
                let wait = after_check(pending, room, Arc::clone(&self.backend), key.into(), cost, policy);
                Gate::Queue(wait, key.into())
            }
        }
    }

    /// A place in `key`'s queue, or a 429 at once: when the request cannot be served within
    /// its `max_wait` (its `Retry-After` then says when it could), or finds no room.
    fn join(
        &self,
        excess: &ExcessPolicies,
        policy: WaitPolicy,
        key: &str,
        cost: u64,
        (denial, quota): (Option<Decision>, Option<Quota>),
        listed: Option<Box<SeveralLimits>>,
    ) -> Gate {
        match queue(&excess.room, &self.backend, key, cost, &policy, denial, quota) {
            Ok(wait) => Gate::Queue(WaitFuture::new(wait), key.into()),
            Err(denial) => {
                let listed = listed.map(|listed| Box::new(ListedFields::new(&listed)));
                Gate::Decided(Admission::Deny(RateFields::new(&denial, quota), listed), None)
            }
        }
    }

    /// The admission of a backend's answer; `quota` is only asked for when fields are written
    /// (a key of several limits names its answer's own).
    pub(super) fn admission(
        &self,
        answer: Result<Decision, CheckError>,
        quota: impl FnOnce() -> Option<Quota>,
        listed: Option<Box<SeveralLimits>>,
    ) -> Admission {
        match listed {
            None => self.admit(answer, quota, None),
            Some(listed) => self.admit_listed(answer, &listed),
        }
    }

    /// The admission of an answer among several limits of its key (its own quota named).
    #[cold]
    #[inline(never)]
    fn admit_listed(&self, answer: Result<Decision, CheckError>, listed: &SeveralLimits) -> Admission {
        let fields = Some(Box::new(ListedFields::new(listed)));
        self.admit(answer, || listed.quota, fields)
    }

    #[inline]
    fn admit(
        &self,
        answer: Result<Decision, CheckError>,
        quota: impl FnOnce() -> Option<Quota>,
        listed: Listed,
    ) -> Admission {
        match answer {
            Ok(decision) if decision.is_allowed() => Admission::Pass(
                self.headers_on_allow.then(|| RateFields::new(&decision, quota())),
                listed,
            ),
            Ok(decision) => Admission::Deny(RateFields::new(&decision, quota()), listed),
            Err(CheckError::CostExceedsCapacity { capacity, .. }) => {
                Admission::Deny(RateFields::never(quota(), capacity), listed)
            }
        }
    }

    /// The fields as they are written into a response.
    pub(super) fn render(&self, fields: RateFields, listed: Option<&ListedFields>) -> Rendered {
        match listed {
            None => fields.render(self.policy_id, &self.policy_name),
            Some(listed) => fields.render_listed(&self.policy_name, listed),
        }
    }

    pub(super) fn denied<B: From<&'static str>>(&self, fields: RateFields, listed: Listed) -> Response<B> {
        let build = || {
            let mut headers = plain_headers();
            self.render(fields, listed.as_deref()).write(&mut headers);
            headers
        };
        let headers = match &listed {
            None => denial_headers(self.policy_id, fields, build),
            Some(_) => build(),
        };
        plain(StatusCode::TOO_MANY_REQUESTS, EXCEEDED_BODY, headers)
    }

    pub(super) fn bad_key<B: From<&'static str>>(rejection: KeyRejection) -> Response<B> {
        plain(StatusCode::BAD_REQUEST, rejection.body(), plain_headers())
    }
}

/// One of the layer's own answers.
fn plain<B: From<&'static str>>(status: StatusCode, body: &'static str, headers: HeaderMap) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// The headers of the layer's own answers.
fn plain_headers() -> HeaderMap {
    // Room for the rate-limit fields too, so the map is allocated once (see Rendered::write).
    let mut headers = HeaderMap::with_capacity(10);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers
}

/// The answer of a response future polled again after it completed.
pub(super) fn server_error<B: From<&'static str>>() -> Response<B> {
    let mut r = Response::new(B::from(""));
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}
