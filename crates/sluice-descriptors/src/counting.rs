//! How one request's descriptors are counted: the engine's setting, written `counting:` in a
//! config; here so that the config reader and the engine share one definition.

/// How one request's descriptors are counted.
///
/// # Example
/// ```
/// use sluice_descriptors::Counting;
/// assert_eq!("independent".parse(), Ok(Counting::Independent));
/// assert_eq!(Counting::default(), Counting::AllOrNothing);
/// assert!("each".parse::<Counting>().unwrap_err().contains("all_or_nothing or independent"));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Counting {
    /// `all_or_nothing` (the default): a denied request consumes nothing from any of its
    /// limits.
    #[default]
    AllOrNothing,
    /// `independent`: each descriptor is counted on its own, as envoy's ratelimit service
    /// does: a request denied by its second descriptor has still consumed from its first.
    Independent,
}

impl std::str::FromStr for Counting {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "all_or_nothing" => Ok(Self::AllOrNothing),
            "independent" => Ok(Self::Independent),
            other => Err(format!(
                "unknown counting '{other}' (use all_or_nothing or independent)"
            )),
        }
    }
}
