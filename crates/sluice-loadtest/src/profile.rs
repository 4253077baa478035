//! User profiles: who each simulated user claims to be, and what rate the server should grant.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use sluice::Quota;

use crate::LoadtestError;
use crate::args::MAX_CONNECTIONS;

/// The header carrying the account unless a profiles file names another.
///
/// ```
/// assert_eq!(sluice_loadtest::ProfileSet::demo().header_name, sluice_loadtest::DEFAULT_HEADER_NAME);
/// ```
pub const DEFAULT_HEADER_NAME: &str = "X-Account-ID";

/// The rate (per second) of the demo's failsafe pool (`failsafe_pool` in `sluice serve`'s
/// built-in config): what the demo's `invalidN` profile, a new account per request, gets.
///
/// ```
/// use sluice_loadtest::{DEMO_FAILSAFE_POOL, Expected, ProfileSet};
/// let demo = ProfileSet::demo();
/// let flood = demo.profiles.iter().find(|p| p.name == "invalidN@example.com").unwrap();
/// assert_eq!(flood.expected, Expected::Rate(DEMO_FAILSAFE_POOL));
/// ```
pub const DEMO_FAILSAFE_POOL: f64 = 20.0;

/// The placeholder in a header value replaced by a new number on every request.
///
/// ```
/// let account = sluice_loadtest::Account::from_header(Some("user{n}".into()));
/// assert!(matches!(account, sluice_loadtest::Account::Unique { .. }));
/// ```
pub const UNIQUE_PLACEHOLDER: &str = "{n}";

/// The rate a profile should be allowed.
///
/// # Example
/// ```
/// use sluice_loadtest::Expected;
/// assert_eq!(Expected::Rate(1.1).to_string(), "1.1");
/// assert_eq!(Expected::Unlimited.to_string(), "unlimited");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expected {
    /// Requests per second.
    Rate(f64),
    /// Never limited (a bypass account; or a new account on every request, against a server
    /// without a failsafe pool).
    Unlimited,
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::Rate(rate) => write!(f, "{rate}"),
            Expected::Unlimited => f.write_str("unlimited"),
        }
    }
}

/// What a profile sends in the account header.
///
/// # Example
/// ```
/// use sluice_loadtest::Account;
/// assert_eq!(Account::from_header(None), Account::None);
/// assert_eq!(
///     Account::from_header(Some("n{n}@example.com".into())),
///     Account::Unique { prefix: "n".into(), suffix: "@example.com".into() }
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Account {
    /// No header: the server's default account.
    None,
    /// The same value on every request.
    Fixed(String),
    /// `prefix`, a number new on every request, `suffix`.
    Unique {
        /// Before the number.
        prefix: String,
        /// After the number.
        suffix: String,
    },
}

impl Account {
    /// The account of a header value; `{n}` in it makes a new account per request.
    pub fn from_header(value: Option<String>) -> Self {
        match value {
            None => Account::None,
            Some(v) => match v.split_once(UNIQUE_PLACEHOLDER) {
                Some((prefix, suffix)) => Account::Unique {
                    prefix: prefix.to_string(),
                    suffix: suffix.to_string(),
                },
                None => Account::Fixed(v),
            },
        }
    }
}

/// One simulated user: a name (the `account ID` column), its account header, the rate it
/// should get, and optionally its own number of connections.
///
/// # Example
/// ```
/// let demo = sluice_loadtest::ProfileSet::demo();
/// let alice = demo.profiles.iter().find(|p| p.name == "alice@example.com").unwrap();
/// assert_eq!(alice.expected, sluice_loadtest::Expected::Rate(1.0));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Shown in results and charts.
    pub name: String,
    /// What goes in the account header.
    pub account: Account,
    /// The rate the server should allow.
    pub expected: Expected,
    /// Connections for this profile (else `--connections`).
    pub connections: Option<u32>,
    /// Requests per second this profile offers over all its connections, each sending its
    /// next request when its turn comes or its last is answered, whichever is later (else
    /// each sends as fast as it is answered).
    pub offered: Option<f64>,
}

/// A set of profiles run together, and the header that carries the account.
///
/// Loaded from `demo` (the built-in set) or a YAML file:
///
/// ```yaml
/// header_name: X-Account-ID          # optional, this is the default
/// profiles:
///   - name: alice@example.com
///     header: alice@example.com      # omit for no header
///     expected: 1                    # per second; or "1.1/s", "10/min"; or "unlimited"
///     connections: 4                 # optional
///     offered: 2/s                   # optional: paced to this rate over its connections
///   - name: invalidN@example.com
///     header: "invalid{n}@example.com"   # {n}: a new number on every request
///     expected: 20/s                     # the server's failsafe pool (or unlimited, without)
/// ```
///
/// # Example
/// ```
/// let set = sluice_loadtest::ProfileSet::demo();
/// assert_eq!(set.profiles.len(), 12);
/// assert_eq!(set.header_name, "X-Account-ID");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSet {
    /// The request header that carries the account.
    pub header_name: String,
    /// The profiles, in report order.
    pub profiles: Vec<Profile>,
}

/// What `--profiles` takes for the built-in set: `demo` (and the name it had before, kept so
/// older scripts still run).
const DEMO_NAMES: [&str; 2] = ["demo", "seed"];

impl ProfileSet {
    /// The twelve profiles of the built-in demo: an unknown account, a new unknown account
    /// per request (together at the demo's failsafe pool, [`DEMO_FAILSAFE_POOL`]), no account
    /// (`ANONYMOUS`), alice@example.com to eve@example.com at their quotas, and
    /// admin@example.com, never limited.
    pub fn demo() -> Self {
        let limited = |name: &str, rate: f64| Profile {
            name: format!("{name}@example.com"),
            account: Account::Fixed(format!("{name}@example.com")),
            expected: Expected::Rate(rate),
            connections: None,
            offered: None,
        };
        let mut profiles = vec![
            // An account the server does not know: quota 0 once its fetch completes.
            limited("invalid", 0.0),
            // A new unknown account on every request: each is admitted under the failsafe
            // quota, and all of them together no more than the failsafe pool.
            Profile {
                name: "invalidN@example.com".into(),
                account: Account::from_header(Some("invalid{n}@example.com".into())),
                expected: Expected::Rate(DEMO_FAILSAFE_POOL),
                connections: None,
                offered: None,
            },
            Profile {
                name: "ANONYMOUS".into(),
                account: Account::None,
                expected: Expected::Rate(0.1),
                connections: None,
                offered: None,
            },
        ];
        for (name, rate) in [
            ("alice", 1.0),
            ("bob", 1.1),
            ("carol", 2.0),
            ("chuck", 10.0),
            ("craig", 100.0),
            ("dan", 1000.0),
            ("erin", 10_000.0),
            ("eve", 100_000.0),
        ] {
            profiles.push(limited(name, rate));
        }
        // The control: bypasses the limiter.
        profiles.push(Profile {
            name: "admin@example.com".into(),
            account: Account::Fixed("admin@example.com".into()),
            expected: Expected::Unlimited,
            connections: None,
            offered: None,
        });
        ProfileSet {
            header_name: DEFAULT_HEADER_NAME.into(),
            profiles,
        }
    }

    /// The built-in set ([`ProfileSet::demo`]) for `demo`, else the YAML file at `spec`.
    ///
    /// ```
    /// assert_eq!(sluice_loadtest::ProfileSet::load("demo")?.profiles.len(), 12);
    /// let err = sluice_loadtest::ProfileSet::load("/nonexistent/profiles.yaml").unwrap_err();
    /// assert!(err.to_string().starts_with("--profiles /nonexistent/profiles.yaml: "));
    /// # Ok::<(), sluice_loadtest::LoadtestError>(())
    /// ```
    ///
    /// # Errors
    /// [`LoadtestError::ProfilesRead`] if the file cannot be read,
    /// [`LoadtestError::ProfilesInvalid`] naming the field at fault.
    pub fn load(spec: &str) -> Result<Self, LoadtestError> {
        if DEMO_NAMES.contains(&spec) {
            return Ok(Self::demo());
        }
        let path = Path::new(spec);
        let text = std::fs::read_to_string(path).map_err(|source| LoadtestError::ProfilesRead {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text).map_err(|message| LoadtestError::ProfilesInvalid {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses the YAML form; the error names the field at fault.
    ///
    /// # Example
    /// ```
    /// let set = sluice_loadtest::ProfileSet::parse("profiles:\n  - name: a\n    expected: 2/s\n")?;
    /// assert_eq!(set.profiles[0].expected, sluice_loadtest::Expected::Rate(2.0));
    /// let err = sluice_loadtest::ProfileSet::parse("profiles:\n  - name: a\n    expected: fast\n");
    /// assert!(err.unwrap_err().starts_with("profiles[0].expected"));
    /// # Ok::<(), String>(())
    /// ```
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: FileSet = serde_norway::from_str(text).map_err(|e| e.to_string())?;
        if file.profiles.is_empty() {
            return Err("profiles: the list is empty".into());
        }
        let header_name = file.header_name.unwrap_or_else(|| DEFAULT_HEADER_NAME.into());
        if header_name.is_empty() || !header_name.bytes().all(is_token_byte) {
            return Err(format!("header_name: `{header_name}` is not a valid header name"));
        }
        let mut profiles: Vec<Profile> = Vec::with_capacity(file.profiles.len());
        for (i, p) in file.profiles.into_iter().enumerate() {
            let field = |name: &str| format!("profiles[{i}].{name}");
            if p.name.is_empty() || p.name.contains(['\t', '\n', '\r']) {
                return Err(format!(
                    "{}: must be non-empty, without tabs or line breaks",
                    field("name")
                ));
            }
            if profiles.iter().any(|q| q.name == p.name) {
                return Err(format!("{}: `{}` is used twice", field("name"), p.name));
            }
            if let Some(h) = &p.header
                && h.bytes().any(|b| b.is_ascii_control())
            {
                return Err(format!("{}: control characters are not allowed", field("header")));
            }
            if p.connections.is_some_and(|c| !(1..=MAX_CONNECTIONS).contains(&c)) {
                return Err(format!(
                    "{}: must be from 1 to {MAX_CONNECTIONS}",
                    field("connections")
                ));
            }
            let expected = expected_of(&p.expected).map_err(|e| format!("{}: {e}", field("expected")))?;
            let offered = match &p.offered {
                None => None,
                Some(rate) => match expected_of(rate) {
                    Ok(Expected::Rate(r)) if r > 0.0 => Some(r),
                    Ok(_) => return Err(format!("{}: must be a rate above 0", field("offered"))),
                    Err(e) => return Err(format!("{}: {e}", field("offered"))),
                },
            };
            profiles.push(Profile {
                name: p.name,
                account: Account::from_header(p.header),
                expected,
                connections: p.connections,
                offered,
            });
        }
        Ok(ProfileSet {
            header_name,
            profiles,
        })
    }
}

/// The file's shape; unknown fields are errors so a typo is named.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSet {
    header_name: Option<String>,
    profiles: Vec<FileProfile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProfile {
    name: String,
    #[serde(default)]
    header: Option<String>,
    expected: RateText,
    #[serde(default)]
    connections: Option<u32>,
    #[serde(default)]
    offered: Option<RateText>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RateText {
    Number(f64),
    Text(String),
}

fn expected_of(rate: &RateText) -> Result<Expected, String> {
    match rate {
        RateText::Number(r) if r.is_finite() && *r >= 0.0 => Ok(Expected::Rate(*r)),
        RateText::Number(r) => Err(format!("{r} is not a rate (a number of requests per second ≥ 0)")),
        RateText::Text(t) if t == "unlimited" => Ok(Expected::Unlimited),
        RateText::Text(t) => match t.parse::<Quota>() {
            Ok(q) => Ok(Expected::Rate(q.count() as f64 / q.period().as_secs_f64())),
            Err(e) => Err(format!(
                "`{t}` is neither a number per second, a quota like `1.1/s`, nor `unlimited` ({e})"
            )),
        },
    }
}

/// Bytes allowed in an HTTP header name (RFC 9110 token).
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}
