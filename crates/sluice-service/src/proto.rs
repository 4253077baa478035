//! The messages of Envoy's rate-limit service, v3 (`envoy.service.ratelimit.v3`), written out
//! by hand with the field numbers and wire types of Envoy's `rls.proto` and
//! `ratelimit.proto`: only what the service reads and writes, so no protobuf compiler and no
//! copy of Envoy's whole API is needed to build. `tests/rls_wire.rs` checks them against the
//! official definitions (the `envoy-types` crate) over a socket.
//!
//! Enumerations are carried as their `int32` numbers, which is how they travel on the wire.

/// `RateLimitRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    /// The domain the descriptors are looked up in.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors to limit on, all of them.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    /// Hits the request adds to each matched limit; 0 means 1.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    /// The key/value path.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    /// A limit the caller sets for this descriptor, in place of the configured one.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// Hits for this descriptor, in place of the request's (`google.protobuf.UInt64Value`).
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// The hits are to be subtracted (not supported: refused).
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Entry {
    /// The descriptor key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The descriptor value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitDescriptor.RateLimitOverride`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct RateLimitOverride {
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// The unit, a [`Unit`] number.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `google.protobuf.UInt64Value`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct UInt64Value {
    /// The value.
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

/// `RateLimitResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    /// The answer to the whole request, a [`Code`] number.
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    /// One status per request descriptor, in order.
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    /// Headers for the downstream response.
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
    /// Headers for the upstream request.
    #[prost(message, repeated, tag = "4")]
    pub request_headers_to_add: Vec<HeaderValue>,
    /// What later filters and access logs may read: the request, and the `metadata:` of the
    /// rules that admitted it (with `rls.dynamic_metadata`).
    #[prost(message, optional, tag = "6")]
    pub dynamic_metadata: Option<Struct>,
}

/// `google.protobuf.Struct`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    /// Its fields by name.
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: std::collections::BTreeMap<String, Value>,
}

/// `google.protobuf.Value`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    /// What it holds.
    #[prost(oneof = "Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<Kind>,
}

/// `google.protobuf.Value.kind`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Kind {
    /// `null` (`NullValue.NULL_VALUE`, 0).
    #[prost(int32, tag = "1")]
    Null(i32),
    /// A number.
    #[prost(double, tag = "2")]
    Number(f64),
    /// A string.
    #[prost(string, tag = "3")]
    String(String),
    /// A bool.
    #[prost(bool, tag = "4")]
    Bool(bool),
    /// A map.
    #[prost(message, tag = "5")]
    Struct(Struct),
    /// A list.
    #[prost(message, tag = "6")]
    List(ListValue),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    /// Its items.
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

impl Value {
    /// The protobuf value of a rule's metadata.
    pub fn of(metadata: &sluice_descriptors::Metadata) -> Self {
        use sluice_descriptors::Metadata;
        let kind = match metadata {
            Metadata::Null => Kind::Null(0),
            Metadata::Bool(b) => Kind::Bool(*b),
            Metadata::Number(n) => Kind::Number(*n),
            Metadata::String(s) => Kind::String(s.clone()),
            Metadata::List(items) => Kind::List(ListValue {
                values: items.iter().map(Value::of).collect(),
            }),
            Metadata::Map(fields) => Kind::Struct(Struct::of(fields)),
        };
        Self { kind: Some(kind) }
    }
}

impl Struct {
    /// The protobuf struct of a metadata map.
    pub fn of(fields: &std::collections::BTreeMap<String, sluice_descriptors::Metadata>) -> Self {
        Self {
            fields: (fields.iter())
                .map(|(name, value)| (name.clone(), Value::of(value)))
                .collect(),
        }
    }
}

/// `RateLimitResponse.DescriptorStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    /// A [`Code`] number.
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// The limit that applied, if any.
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    /// What is left of it.
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    /// When it is whole again (`google.protobuf.Duration`).
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

/// `RateLimitResponse.RateLimit`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct RateLimit {
    /// The limit's name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Requests per unit.
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    /// A [`Unit`] number.
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

/// `envoy.config.core.v3.HeaderValue`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct HeaderValue {
    /// The header name.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The header value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Duration {
    /// Whole seconds.
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    /// Nanoseconds past them.
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

/// `RateLimitResponse.Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Not decided.
    Unknown = 0,
    /// Within the limits.
    Ok = 1,
    /// Over a limit.
    OverLimit = 2,
}

/// `RateLimitResponse.RateLimit.Unit` (and the override's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Not given.
    Unknown = 0,
    /// A second.
    Second = 1,
    /// A minute.
    Minute = 2,
    /// An hour.
    Hour = 3,
    /// A day.
    Day = 4,
    /// 30 days.
    Month = 5,
    /// 365 days.
    Year = 6,
    /// 7 days.
    Week = 7,
}

impl Unit {
    /// Every unit with a length, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit numbered `n` on the wire.
    pub fn from_number(n: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|unit| *unit as i32 == n)
    }

    /// Its name in the rules' `unit` field (`unknown` for none).
    pub const fn name(self) -> &'static str {
        match self {
            Unit::Unknown => "unknown",
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Its length in seconds, as the rules read it (`sluice_descriptors::UNITS`); 0 for none.
    pub fn seconds(self) -> u64 {
        sluice_descriptors::unit_seconds(self.name()).unwrap_or(0)
    }
}
