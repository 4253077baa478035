//! Envoy's RLS request, as the RLS server reads and answers it.

use prost::Message;
use sluice::Quota;
use sluice_service::proto::{Code, RateLimitOverride, RateLimitRequest, RateLimitResponse, Unit};
use sluice_service::{MAX_MESSAGE_BYTES, RlsMessageError, answer_rls_message};

use crate::service::{block_on, engine, fields_are_headers, hits, rule, within_bounds};

/// `data` as the bytes of a `RateLimitRequest` sent to `ShouldRateLimit`, answered on a fresh
/// engine over a small rules table: never a panic; bytes that are not a request, a
/// descriptor with `is_negative_hits` or an override no quota holds (in no unit, or not held
/// exactly), and a request outside the bounds are refused (a field by its descriptor's
/// place); an answered request has one status per descriptor, is over the limit exactly when
/// a status not in shadow mode is, has no limit only where it is not over, reports the
/// override's rate (or its rule's; an override the rule's algorithm cannot hold is denied)
/// with no more remaining than its capacity, is over where the hits can never fit (up to the
/// first denying status: all-or-nothing only looks at the rest), carries fields a response
/// can hold, and encodes back to itself.
///
/// # Example
/// ```
/// // domain "edge", one descriptor user=al with a limit override of 2 per minute.
/// sluice_invariants::rls(b"\x0a\x04edge\x12\x12\x0a\x0a\x0a\x04user\x12\x02al\x12\x04\x08\x02\x10\x02");
/// sluice_invariants::rls(b"\x12\xff");
/// ```
pub fn rls(data: &[u8]) {
    let engine = engine();
    let answer = block_on(answer_rls_message(&engine, data));
    if data.len() > MAX_MESSAGE_BYTES {
        assert!(matches!(answer, Err(RlsMessageError::TooLarge(_))), "{answer:?}");
        return;
    }
    let request = match RateLimitRequest::decode(data) {
        Ok(request) => request,
        Err(_) => {
            assert!(matches!(answer, Err(RlsMessageError::Decode(_))), "{answer:?}");
            return;
        }
    };
    // An override in no unit, or one no quota holds exactly (4000000000 per second).
    let no_quota = |o: &RateLimitOverride| match Unit::from_number(o.unit) {
        None => true,
        Some(unit) => o.requests_per_unit > 0 && Quota::new(o.requests_per_unit.into(), secs(unit)).is_err(),
    };
    let unreadable = (request.descriptors.iter())
        .position(|d| d.is_negative_hits || d.limit.as_ref().is_some_and(no_quota));
    if let Some(index) = unreadable {
        match &answer {
            Err(RlsMessageError::Field(field)) => {
                let place = format!("descriptors[{index}].");
                assert!(field.starts_with(&place), "{field:?} does not name {place}");
            }
            other => panic!("descriptor {index} cannot be read, yet {other:?}"),
        }
        return;
    }
    let entries: Vec<Vec<(String, String)>> = (request.descriptors.iter())
        .map(|d| {
            (d.entries.iter())
                .map(|e| (e.key.clone(), e.value.clone()))
                .collect()
        })
        .collect();
    if !within_bounds(&request.domain, entries.iter().map(Vec::as_slice)) {
        assert!(matches!(answer, Err(RlsMessageError::Bounds(_))), "{answer:?}");
        return;
    }
    let response = match answer {
        Ok(response) => response,
        Err(e) => panic!("a request within the bounds refused: {e}"),
    };
    answer_holds(&request, &response);
}

fn answer_holds(request: &RateLimitRequest, response: &RateLimitResponse) {
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(response.statuses.len(), request.descriptors.len());
    let request_hits = Some(u64::from(request.hits_addend));
    let mut denies = false;
    for (i, (asked, status)) in request.descriptors.iter().zip(&response.statuses).enumerate() {
        assert!(status.code == ok || status.code == over, "status {i}: {status:?}");
        let Some(limit) = &status.current_limit else {
            assert_eq!(status.code, ok, "status {i} is over no limit: {status:?}");
            assert!(status.duration_until_reset.is_none(), "status {i}: {status:?}");
            continue;
        };
        let Some((rule_quota, shadow, kind)) = rule(&limit.name) else {
            panic!("status {i} names no rule: {limit:?}");
        };
        let quota = match asked.limit {
            Some(o) if o.requests_per_unit == 0 => Quota::deny_all(),
            Some(o) => match Unit::from_number(o.unit)
                .and_then(|unit| Quota::new(o.requests_per_unit.into(), secs(unit)).ok())
            {
                Some(quota) => quota,
                None => panic!("status {i}: the override {o:?} was taken"),
            },
            None => match rule_quota {
                Some(quota) => quota,
                None => panic!("status {i}: the unlimited rule {} was counted", limit.name),
            },
        };
        if kind.check(&quota).is_err() {
            // An override the rule's algorithm cannot hold (63067937/s on a bucket) is taken,
            // and its counter stays on the failsafe quota (deny-all here): denied, and reported
            // as that quota. Refused as an unreadable override is, it would say why.
            if !denies {
                assert_eq!(status.code, over, "status {i}: {quota} admitted on {kind}");
            }
            denies |= status.code == over && !shadow;
            continue;
        }
        if quota.is_deny_all() {
            assert_eq!(limit.requests_per_unit, 0, "status {i}: {limit:?}");
        } else if limit.requests_per_unit < u32::MAX {
            // The same rate, per the unit the answer chose.
            let Some(unit) = Unit::from_number(limit.unit) else {
                panic!("status {i}: unit {}", limit.unit)
            };
            let reported = u128::from(limit.requests_per_unit) * u128::from(quota.period_nanos());
            let expected = u128::from(quota.count()) * secs(unit).as_nanos();
            assert_eq!(reported, expected, "status {i}: {limit:?} for {quota}");
        }
        let capacity = u32::try_from(quota.capacity()).unwrap_or(u32::MAX);
        assert!(
            status.limit_remaining <= capacity,
            "status {i}: {} left of {quota}",
            status.limit_remaining
        );
        let Some(reset) = status.duration_until_reset else {
            panic!("status {i}: a limit without a reset time");
        };
        assert!(
            reset.seconds >= 0 && (0..1_000_000_000).contains(&reset.nanos),
            "{reset:?}"
        );
        // After a descriptor that denies, all-or-nothing only looks at the rest.
        let own = asked.hits_addend.map(|h| h.value);
        if !denies && hits(own, request_hits) > quota.capacity() {
            assert_eq!(status.code, over, "status {i}: more hits than {quota} holds");
        }
        denies |= status.code == over && !shadow;
    }
    let overall = if denies { over } else { ok };
    assert_eq!(response.overall_code, overall, "{response:?}");
    fields_are_headers((response.response_headers_to_add.iter()).map(|h| (h.key.as_str(), h.value.as_str())));
    let encoded = response.encode_to_vec();
    assert_eq!(
        RateLimitResponse::decode(encoded.as_slice()).as_ref(),
        Ok(response)
    );
}

fn secs(unit: Unit) -> std::time::Duration {
    std::time::Duration::from_secs(unit.seconds())
}
