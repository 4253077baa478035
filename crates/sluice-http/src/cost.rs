//! What a request costs: a number of units by route (path prefix) and method, matched on the
//! normalised path so that another spelling of a route pays that route's cost.

use std::borrow::Cow;

use http::Method;

/// One cost rule: requests whose normalised path starts with `prefix` (at a `/` boundary)
/// and, if given, whose method is `method`, cost `cost` units.
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
    /// A rule for a path prefix and, optionally, one method. The prefix is normalised as
    /// request paths are ([`normalize_path`]); a prefix that cannot be (`/a%2Fb`) never
    /// matches, since no normalised path contains it, but still counts toward the charge of
    /// paths that cannot be normalised (see [`RouteCosts`]).
    ///
    /// # Example
    /// ```
    /// use sluice_http::{CostRule, RouteCosts};
    /// let costs = RouteCosts::new([CostRule::new("/a/./b//c", None, 4)]);
    /// assert_eq!(costs.cost(&http::Method::GET, "/a/b/c/d"), 4);
    /// ```
    pub fn new(prefix: impl Into<String>, method: Option<Method>, cost: u64) -> Self {
        let prefix = prefix.into();
        let prefix = match normalize_path(&prefix) {
            Ok(Cow::Owned(normal)) => normal,
            Ok(Cow::Borrowed(_)) | Err(_) => prefix,
        };
        Self { prefix, method, cost }
    }

    /// The units this rule charges.
    ///
    /// # Example
    /// ```
    /// assert_eq!(sluice_http::CostRule::new("/", None, 2).cost(), 2);
    /// ```
    pub fn cost(&self) -> u64 {
        self.cost
    }

    fn applies_to(&self, method: &Method) -> bool {
        self.method.as_ref().is_none_or(|m| m == method)
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        self.applies_to(method) && under(path, &self.prefix)
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
/// Rules match the request's path normalised by [`normalize_path`], so `//export`,
/// `/%65xport` and `/api/../export` pay the cost of `/export`. A path that cannot be
/// normalised (an encoded `/`, `\` or `%`, a raw `\`, a control character, a broken escape:
/// servers disagree on what route it names) pays the most any rule for its method could
/// charge, or the default if that is more: never less than the route it may reach.
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
/// assert_eq!(costs.cost(&Method::POST, "//search/./%65xport"), 50);
/// assert_eq!(costs.cost(&Method::GET, "/files/a%2Fb"), 5, "the most a GET could cost");
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
    ///
    /// # Example
    /// ```
    /// let costs = sluice_http::RouteCosts::new([sluice_http::CostRule::new("/x", None, 3)]);
    /// assert_eq!(costs.cost(&http::Method::GET, "/x"), 3);
    /// ```
    pub fn new(rules: impl IntoIterator<Item = CostRule>) -> Self {
        let mut rules: Vec<CostRule> = rules.into_iter().collect();
        // Most specific first, so the first match is the best one.
        rules.sort_by_key(|r| (std::cmp::Reverse(r.prefix.len()), r.method.is_none()));
        Self { rules, default: 1 }
    }

    /// The cost of requests no rule matches.
    ///
    /// # Example
    /// ```
    /// let costs = sluice_http::RouteCosts::default().with_default(0);
    /// assert_eq!(costs.cost(&http::Method::GET, "/"), 0);
    /// ```
    pub fn with_default(mut self, cost: u64) -> Self {
        self.default = cost;
        self
    }

    /// The cost of a request for `path` (the URI's path, as received).
    ///
    /// # Example
    /// ```
    /// use sluice_http::{CostRule, RouteCosts};
    /// let costs = RouteCosts::new([CostRule::new("/export", None, 3)]);
    /// assert_eq!(costs.cost(&http::Method::GET, "/a/../export"), 3);
    /// ```
    pub fn cost(&self, method: &Method, path: &str) -> u64 {
        if self.rules.is_empty() {
            return self.default;
        }
        match normalize_path(path) {
            Ok(path) => self
                .rules
                .iter()
                .find(|r| r.matches(method, &path))
                .map_or(self.default, |r| r.cost),
            Err(_) => self
                .rules
                .iter()
                .filter(|r| r.applies_to(method))
                .map(|r| r.cost)
                .fold(self.default, u64::max),
        }
    }
}

/// Why a path cannot be normalised: servers disagree on what it names.
///
/// # Example
/// ```
/// use sluice_http::{PathError, normalize_path};
/// assert_eq!(normalize_path("/a%2Fb"), Err(PathError::EncodedDelimiter));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    /// The path does not start with `/` (`*`, or an empty path).
    #[error("the path does not start with '/'")]
    NotAbsolute,
    /// A `%` not followed by two hex digits.
    #[error("a '%' not followed by two hex digits")]
    InvalidEscape,
    /// `%2F`, `%5C` or `%25`: an encoded `/` or `\` (a separator to some servers, not to
    /// others) or `%` (decoded twice by some).
    #[error("an encoded '/', '\\' or '%' (%2F, %5C, %25)")]
    EncodedDelimiter,
    /// A raw `\`, a separator to some servers.
    #[error("a '\\' (a separator to some servers)")]
    Backslash,
    /// A control character (below 0x20, or 0x7F; NUL included), raw or encoded.
    #[error("a control character, raw or encoded")]
    ControlCharacter,
}

/// The path as cost rules see it. Exactly these steps, which change no path a server reads
/// as a different resource:
///
/// 1. percent-escapes of unreserved characters (`A`–`Z`, `a`–`z`, `0`–`9`, `-`, `.`, `_`,
///    `~`) are decoded (`%65` is `e`); other escapes stay, with upper-case hex (`%c3` is
///    `%C3`); characters that must be escaped in a path (space, `"`, `<`, `>`, `[`, `]`,
///    `^`, `` ` ``, `{`, `|`, `}`, non-ASCII) are escaped, so `é` and `%C3%A9` are one path;
/// 2. runs of `/` are merged into one;
/// 3. `.` segments are removed and `..` segments remove the segment before them, never going
///    above the root (`/../a` is `/a`); a path ending in such a segment keeps a trailing `/`.
///
/// Case is kept (`/Export` is not `/export`), and `;` parameters are part of their segment.
/// The result starts with `/`, is ASCII, and has no empty, `.` or `..` segment (but a
/// trailing `/`); normalising it again changes nothing. An already normal path is returned
/// as it is, without copying.
///
/// # Errors
/// [`PathError`] for a path that does not start with `/`, or that has a broken escape, an
/// encoded `/`, `\` or `%`, a raw `\`, or a control character (raw or encoded).
///
/// # Example
/// ```
/// use sluice_http::normalize_path;
/// assert_eq!(normalize_path("//export")?, "/export");
/// assert_eq!(normalize_path("/%65xport")?, "/export");
/// assert_eq!(normalize_path("/a/b/../../../export/.")?, "/export/");
/// assert_eq!(normalize_path("/caf%c3%a9")?, "/caf%C3%A9");
/// assert!(normalize_path("/export%00").is_err());
/// # Ok::<(), sluice_http::PathError>(())
/// ```
pub fn normalize_path(path: &str) -> Result<Cow<'_, str>, PathError> {
    let bytes = path.as_bytes();
    let Some(rest) = bytes.strip_prefix(b"/") else {
        return Err(PathError::NotAbsolute);
    };
    if is_normal(rest) {
        return Ok(Cow::Borrowed(path));
    }
    let mut out = String::with_capacity(path.len());
    let mut trailing_slash = false;
    for segment in rest.split(|&b| b == b'/') {
        let start = out.len();
        out.push('/');
        decode_segment(segment, &mut out)?;
        match &out[start + 1..] {
            "" | "." => {
                out.truncate(start);
                trailing_slash = true;
            }
            ".." => {
                out.truncate(start);
                let parent = out.rfind('/').unwrap_or(0);
                out.truncate(parent);
                trailing_slash = true;
            }
            _ => trailing_slash = false,
        }
    }
    if out.is_empty() || trailing_slash {
        out.push('/');
    }
    Ok(Cow::Owned(out))
}

/// Whether the path after its first `/` is already normal: only characters kept as they are,
/// no empty segment but the last, no `.` or `..` segment.
fn is_normal(rest: &[u8]) -> bool {
    let mut segments = rest.split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last) || segment == b"." || segment == b".." {
            return false;
        }
        if !segment.iter().all(|&b| kept(b)) {
            return false;
        }
    }
    true
}

/// RFC 3986 unreserved characters.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Characters a path segment may hold unescaped (`pchar` but `%`), kept as written.
fn kept(b: u8) -> bool {
    unreserved(b)
        || matches!(
            b,
            b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@'
        )
}

fn is_control(b: u8) -> bool {
    b < 0x20 || b == 0x7f
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

fn push_escaped(out: &mut String, b: u8) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xf)]));
}

/// One segment's bytes, normalised onto `out`.
fn decode_segment(segment: &[u8], out: &mut String) -> Result<(), PathError> {
    let mut i = 0;
    while let Some(&b) = segment.get(i) {
        if b == b'%' {
            let byte = match (
                segment.get(i + 1).and_then(|&h| hex(h)),
                segment.get(i + 2).and_then(|&l| hex(l)),
            ) {
                (Some(high), Some(low)) => high << 4 | low,
                _ => return Err(PathError::InvalidEscape),
            };
            if unreserved(byte) {
                out.push(char::from(byte));
            } else if matches!(byte, b'/' | b'\\' | b'%') {
                return Err(PathError::EncodedDelimiter);
            } else if is_control(byte) {
                return Err(PathError::ControlCharacter);
            } else {
                push_escaped(out, byte);
            }
            i += 3;
            continue;
        }
        if b == b'\\' {
            return Err(PathError::Backslash);
        }
        if is_control(b) {
            return Err(PathError::ControlCharacter);
        }
        if kept(b) {
            out.push(char::from(b));
        } else {
            push_escaped(out, b);
        }
        i += 1;
    }
    Ok(())
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

    #[test]
    fn normal_forms() {
        let cases = [
            ("/", "/"),
            ("/export", "/export"),
            ("/export/", "/export/"),
            ("//export", "/export"),
            ("/a///b//", "/a/b/"),
            ("/%65xport", "/export"),
            ("/%45%78%50ORT", "/ExPORT"),
            ("/%7e%2D%5f%2e", "/~-_."),
            ("/a/%2e/b", "/a/b"),
            ("/a/%2E%2e/b", "/b"),
            ("/a/.%2e", "/"),
            ("/..", "/"),
            ("/../../export", "/export"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/./b/../c", "/a/c"),
            ("/.../x", "/.../x"),
            ("/..a/b.", "/..a/b."),
            ("/caf%c3%a9", "/caf%C3%A9"),
            ("/café", "/caf%C3%A9"),
            ("/a b\"<>[]^`{|}", "/a%20b%22%3C%3E%5B%5D%5E%60%7B%7C%7D"),
            ("/%3b;%3D=", "/%3B;%3D="),
            ("/a?b#c", "/a%3Fb%23c"),
        ];
        for (path, normal) in cases {
            assert_eq!(normalize_path(path).as_deref(), Ok(normal), "{path:?}");
            assert_eq!(normalize_path(normal).as_deref(), Ok(normal), "{normal:?} again");
        }
        assert!(matches!(normalize_path("/a/b;c=1"), Ok(Cow::Borrowed(_))));
    }

    #[test]
    fn paths_that_cannot_be_normalised() {
        let cases = [
            ("", PathError::NotAbsolute),
            ("*", PathError::NotAbsolute),
            ("export", PathError::NotAbsolute),
            ("/a%2Fb", PathError::EncodedDelimiter),
            ("/a%2fb", PathError::EncodedDelimiter),
            ("/a%5cb", PathError::EncodedDelimiter),
            ("/%2565xport", PathError::EncodedDelimiter),
            ("/a\\b", PathError::Backslash),
            ("/a%00", PathError::ControlCharacter),
            ("/a%0a", PathError::ControlCharacter),
            ("/a%7F", PathError::ControlCharacter),
            ("/a\u{0}", PathError::ControlCharacter),
            ("/a%", PathError::InvalidEscape),
            ("/a%4", PathError::InvalidEscape),
            ("/a%zz", PathError::InvalidEscape),
            ("/a%+1", PathError::InvalidEscape),
        ];
        for (path, error) in cases {
            assert_eq!(normalize_path(path), Err(error), "{path:?}");
        }
    }

    #[test]
    fn other_spellings_pay_the_route_cost() {
        let costs = RouteCosts::new([
            CostRule::new("/export", None, 3),
            CostRule::new("/admin", Some(Method::POST), 10),
            CostRule::new("/free", None, 0),
        ]);
        for path in [
            "/export",
            "//export",
            "/%65xport",
            "/./export",
            "/x/../export/",
            "/export//a",
        ] {
            assert_eq!(costs.cost(&Method::GET, path), 3, "{path:?}");
        }
        assert_eq!(costs.cost(&Method::GET, "/exports"), 1);
        assert_eq!(costs.cost(&Method::GET, "/free/../export"), 3);
        // Cannot be normalised: the most a rule for the method could charge.
        assert_eq!(costs.cost(&Method::GET, "/%2e%2e%2fexport"), 3);
        assert_eq!(costs.cost(&Method::POST, "/free%2F..%2Fadmin"), 10);
        assert_eq!(costs.cost(&Method::GET, "/free\\..\\export"), 3);
        assert_eq!(
            RouteCosts::new([CostRule::new("/free", None, 0)]).cost(&Method::GET, "/free%00"),
            1,
            "never below the default"
        );
        // Prefixes are normalised as paths are.
        let costs = RouteCosts::new([CostRule::new("//a/%62/", None, 5)]);
        assert_eq!(costs.cost(&Method::GET, "/a/b/c"), 5);
    }
}
