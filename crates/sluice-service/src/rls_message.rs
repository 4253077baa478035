//! Envoy's RLS v3 messages to and from the engine: a `RateLimitRequest` read into a
//! [`CheckRequest`] (through the one wire conversion, `CheckRequest::from_wire`), decided, and
//! the verdict written as a `RateLimitResponse`. Apart from the gRPC server (`rls.rs`, behind
//! the `grpc` feature) so that a message can be answered, and checked on arbitrary bytes,
//! without tonic.

use prost::Message;

use crate::proto::{self, Unit};
use crate::request::WireDescriptor;
use crate::stats::FrontEnd;
use sluice_descriptors::Metadata;

use crate::{CheckRequest, Code, DescriptorRequest, DescriptorStatus, Engine, RequestError, Verdict};

/// The largest request message read: bounds what one call can make the server decode.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// Why an RLS message was not decided.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RlsMessageError {
    /// Over [`MAX_MESSAGE_BYTES`] (the server answers `RESOURCE_EXHAUSTED`).
    #[error("the message is {0} bytes, at most {MAX_MESSAGE_BYTES}")]
    TooLarge(usize),
    /// Not a `RateLimitRequest` (the server answers `INTERNAL`, as tonic does).
    #[error("not a RateLimitRequest: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A field that cannot be read, named by its place (`descriptors[1].limit: unit 9 is not
    /// a unit`; the server answers `INVALID_ARGUMENT`).
    #[error("{0}")]
    Field(String),
    /// Outside the request bounds (the server answers `INVALID_ARGUMENT`).
    #[error(transparent)]
    Bounds(#[from] RequestError),
}

/// Answers `message`, the bytes of one `RateLimitRequest`, as the RLS server does: bounded,
/// decoded by prost (as tonic's codec does), converted, decided and timed as RLS. Not part
/// of the API: the hostile-input checks (`sluice-invariants`) call it.
///
/// # Errors
/// The message is too large, not a request, or not one the engine decides.
#[doc(hidden)]
pub async fn answer_rls_message(
    engine: &Engine,
    message: &[u8],
) -> Result<proto::RateLimitResponse, RlsMessageError> {
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(RlsMessageError::TooLarge(message.len()));
    }
    let request = proto::RateLimitRequest::decode(message)?;
    answer(engine, request).await
}

/// Answers one decoded request, asked through RLS: a [`RlsMessageError::Field`] or
/// [`RlsMessageError::Bounds`] if it is not decided.
pub(crate) async fn answer(
    engine: &Engine,
    request: proto::RateLimitRequest,
) -> Result<proto::RateLimitResponse, RlsMessageError> {
    let request = from_proto(request).map_err(RlsMessageError::Field)?;
    let verdict = engine.check_from(Some(FrontEnd::Rls), &request, false).await?;
    Ok(to_proto(verdict))
}

/// The request as the engine reads it: strings moved, not copied.
fn from_proto(request: proto::RateLimitRequest) -> Result<CheckRequest, String> {
    let hits = Some(u64::from(request.hits_addend));
    CheckRequest::from_wire(request.domain, request.descriptors, hits)
}

impl WireDescriptor for proto::RateLimitDescriptor {
    fn into_request(self) -> Result<DescriptorRequest, String> {
        if self.is_negative_hits {
            return Err("is_negative_hits is not supported".to_string());
        }
        let limit = (self.limit.map(override_quota).transpose()).map_err(|e| format!("limit: {e}"))?;
        Ok(DescriptorRequest {
            entries: (self.entries.into_iter())
                .map(|entry| (entry.key, entry.value))
                .collect(),
            hits: self.hits_addend.map(|hits| hits.value),
            limit,
        })
    }
}

/// The quota of a descriptor's `limit` override.
fn override_quota(limit: proto::RateLimitOverride) -> Result<sluice::Quota, String> {
    let unit = Unit::from_number(limit.unit).ok_or_else(|| format!("unit {} is not a unit", limit.unit))?;
    if limit.requests_per_unit == 0 {
        return Ok(sluice::Quota::deny_all());
    }
    sluice::Quota::new(
        u64::from(limit.requests_per_unit),
        std::time::Duration::from_secs(unit.seconds()),
    )
    .map_err(|e| e.to_string())
}

fn to_proto(verdict: Verdict) -> proto::RateLimitResponse {
    proto::RateLimitResponse {
        overall_code: code(verdict.overall),
        statuses: verdict.statuses.iter().map(status).collect(),
        response_headers_to_add: verdict
            .headers
            .into_iter()
            .map(|(key, value)| proto::HeaderValue { key, value })
            .collect(),
        request_headers_to_add: Vec::new(),
        dynamic_metadata: match &verdict.dynamic_metadata {
            Some(Metadata::Map(fields)) => Some(proto::Struct::of(fields)),
            _ => None,
        },
    }
}

fn code(code: Code) -> i32 {
    match code {
        Code::Ok => proto::Code::Ok as i32,
        Code::OverLimit => proto::Code::OverLimit as i32,
    }
}

fn status(status: &DescriptorStatus) -> proto::DescriptorStatus {
    proto::DescriptorStatus {
        code: code(status.code),
        current_limit: status.limit.as_ref().map(|limit| {
            let (requests_per_unit, unit) = per_unit(limit.quota);
            proto::RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit,
                unit: unit as i32,
            }
        }),
        limit_remaining: u32::try_from(status.remaining).unwrap_or(u32::MAX),
        duration_until_reset: status.limit.as_ref().map(|_| proto::Duration {
            seconds: i64::try_from(status.reset_after.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(status.reset_after.subsec_nanos()).unwrap_or(0),
        }),
    }
}

/// A quota as requests per one of envoy's units: the shortest unit that holds a whole number
/// of its periods (`1.1/s` is 66 per minute); a quota whose period divides none is given per
/// second, rounded down.
pub(crate) fn per_unit(quota: sluice::Quota) -> (u32, Unit) {
    if quota.is_deny_all() {
        return (0, Unit::Second);
    }
    let (count, period) = (u128::from(quota.count()), u128::from(quota.period_nanos()));
    for unit in Unit::ALL {
        let unit_nanos = u128::from(unit.seconds()) * 1_000_000_000;
        if unit_nanos % period == 0 {
            let per_unit = count * (unit_nanos / period);
            return (u32::try_from(per_unit).unwrap_or(u32::MAX), unit);
        }
    }
    let per_second = count * 1_000_000_000 / period;
    (u32::try_from(per_second).unwrap_or(u32::MAX), Unit::Second)
}
