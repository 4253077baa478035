//! What a request costs: a number of units by route (path prefix) and method.

use http::Method;

/// One cost rule: requests whose path starts with `prefix` (at a `/` boundary) and, if given,
/// whose method is `method`, cost `cost` units.
///
/// # Example
/// ```
/// use sluice_http::CostRule;
/// let rule = CostRule::new("/reports", Some(http::Method::POST), 10);
/// assert_eq!(rule.cost(), 10);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostRule {
    prefix: String,
    method: Option<Method>,
    cost: u64,
}

impl CostRule {
    /// A rule for a path prefix and, optionally, one method.
    pub fn new(prefix: impl Into<String>, method: Option<Method>, cost: u64) -> Self {
        Self {
            prefix: prefix.into(),
            method,
            cost,
        }
    }

    /// The units this rule charges.
    pub fn cost(&self) -> u64 {
        self.cost
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.method.as_ref().is_none_or(|m| m == method) && under(path, &self.prefix)
    }
}

/// `/api` covers `/api` and `/api/x`, not `/apix`.
fn under(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
        None => false,
    }
}

/// The cost of each request: the rule with the longest matching prefix (a rule naming the
/// method beats one that does not), else the default cost (1).
///
/// A cost of 0 lets a request through without consuming anything.
///
/// # Example
/// ```
/// use http::Method;
/// use sluice_http::{CostRule, RouteCosts};
/// let costs = RouteCosts::new([
///     CostRule::new("/search", None, 5),
///     CostRule::new("/search/export", Some(Method::POST), 50),
/// ]);
/// assert_eq!(costs.cost(&Method::GET, "/"), 1);
/// assert_eq!(costs.cost(&Method::GET, "/search/export"), 5);
/// assert_eq!(costs.cost(&Method::POST, "/search/export"), 50);
/// ```
#[derive(Debug, Clone)]
pub struct RouteCosts {
    rules: Vec<CostRule>,
    default: u64,
}

impl Default for RouteCosts {
    fn default() -> Self {
        Self::new([])
    }
}

impl RouteCosts {
    /// These rules, with a default cost of 1.
    pub fn new(rules: impl IntoIterator<Item = CostRule>) -> Self {
        let mut rules: Vec<CostRule> = rules.into_iter().collect();
        // Most specific first, so the first match is the best one.
        rules.sort_by_key(|r| (std::cmp::Reverse(r.prefix.len()), r.method.is_none()));
        Self { rules, default: 1 }
    }

    /// The cost of requests no rule matches.
    pub fn with_default(mut self, cost: u64) -> Self {
        self.default = cost;
        self
    }

    /// The cost of a request.
    pub fn cost(&self, method: &Method, path: &str) -> u64 {
        self.rules
            .iter()
            .find(|r| r.matches(method, path))
            .map_or(self.default, |r| r.cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_then_method() {
        let costs = RouteCosts::new([
            CostRule::new("/", None, 2),
            CostRule::new("/api", None, 3),
            CostRule::new("/api", Some(Method::DELETE), 7),
            CostRule::new("/api/bulk/", None, 20),
        ])
        .with_default(9);
        assert_eq!(costs.cost(&Method::GET, "/other"), 2);
        assert_eq!(costs.cost(&Method::GET, "/api"), 3);
        assert_eq!(costs.cost(&Method::GET, "/apix"), 2);
        assert_eq!(costs.cost(&Method::DELETE, "/api/users/1"), 7);
        assert_eq!(costs.cost(&Method::DELETE, "/api/bulk/1"), 20);
        assert_eq!(
            RouteCosts::new([CostRule::new("/a", None, 4)]).cost(&Method::GET, "/b"),
            1
        );
    }
}
