//! Which rate-limit fields an answer of the rate-limit service carries: the engine's setting,
//! written `rls.headers:` in a config; here, beside the fields themselves, so that the config
//! reader and the engine share one definition.

/// Which rate-limit fields an answer carries for the client. None by default, as in envoy's
/// own service: Envoy's rate-limit filter writes the draft's fields itself from the statuses
/// (`enable_x_ratelimit_headers`), so an answer's fields are for callers that want them
/// written for them.
///
/// # Example
/// ```
/// use sluice_http::FieldSet;
/// assert_eq!("legacy".parse(), Ok(FieldSet::Legacy));
/// assert_eq!(FieldSet::default(), FieldSet::None);
/// assert_eq!("envoy".parse(), Ok(FieldSet::Envoy));
/// assert!("some".parse::<FieldSet>().unwrap_err().contains("none, draft, legacy, all or envoy"));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldSet {
    /// `none` (the default).
    #[default]
    None,
    /// `draft`: the IETF draft's `RateLimit-Policy` and `RateLimit`, and `Retry-After` on a
    /// denial.
    Draft,
    /// `legacy`: `X-RateLimit-Limit`, `-Remaining`, `-Reset`, and `Retry-After` on a denial.
    Legacy,
    /// `all`: both.
    All,
    /// `envoy`: `RateLimit-Limit` (requests per unit), `RateLimit-Remaining` and
    /// `RateLimit-Reset` (seconds) of the status closest to its limit, as envoy ratelimit
    /// writes them with `LIMIT_RESPONSE_HEADERS_ENABLED`.
    Envoy,
}

impl std::str::FromStr for FieldSet {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "none" => Ok(Self::None),
            "draft" => Ok(Self::Draft),
            "legacy" => Ok(Self::Legacy),
            "all" => Ok(Self::All),
            "envoy" => Ok(Self::Envoy),
            other => Err(format!(
                "unknown field set '{other}' (use none, draft, legacy, all or envoy)"
            )),
        }
    }
}
