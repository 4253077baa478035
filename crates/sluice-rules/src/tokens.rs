//! Who may read and write the rules: bearer tokens with a scope, kept only as SHA-256 hashes
//! and compared in constant time.
//!
//! A tokens file has one token a line, `NAME SCOPE TOKEN`, where SCOPE is `read` or `write`
//! (which reads too) and TOKEN is the secret itself or `sha256:` and its hash in hex; blank
//! lines and lines starting with `#` are skipped. The name is what the history records.

use sha2::{Digest, Sha256};

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Read rules and history.
    Read,
    /// Read, and create, replace and delete rules.
    Write,
}

/// The caller a request's token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name.
    pub name: String,
    /// What it may do.
    pub scope: Scope,
}

/// Why a tokens file was refused: the line and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct TokensError {
    /// The line, from 1.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// The tokens the rules service accepts.
///
/// # Example
/// ```
/// use sluice_rules::{Scope, Tokens};
/// let tokens: Tokens = "# name scope token\nci write s3cret-token-value\n".parse()?;
/// let caller = tokens.caller("s3cret-token-value").unwrap();
/// assert_eq!((caller.name.as_str(), caller.scope), ("ci", Scope::Write));
/// assert!(tokens.caller("guess").is_none());
/// # Ok::<(), sluice_rules::TokensError>(())
/// ```
#[derive(Clone, Default)]
pub struct Tokens {
    entries: Vec<(String, Scope, [u8; 32])>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} entries)", self.entries.len())
    }
}

/// The shortest secret accepted: a guessable token is no access control.
const MIN_SECRET_BYTES: usize = 16;

impl std::str::FromStr for Tokens {
    type Err = TokensError;

    fn from_str(text: &str) -> Result<Self, TokensError> {
        let mut entries = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let error = |message: String| TokensError {
                line: index + 1,
                message,
            };
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, scope, secret] = fields[..] else {
                return Err(error("expected NAME SCOPE TOKEN".into()));
            };
            let scope = match scope {
                "read" => Scope::Read,
                "write" => Scope::Write,
                other => return Err(error(format!("scope '{other}' is not read or write"))),
            };
            let hash = match secret.strip_prefix("sha256:") {
                Some(hex) => parse_hash(hex).ok_or_else(|| error("sha256: wants 64 hex digits".into()))?,
                None if secret.len() < MIN_SECRET_BYTES => {
                    return Err(error(format!(
                        "a token has at least {MIN_SECRET_BYTES} characters"
                    )));
                }
                None => Sha256::digest(secret.as_bytes()).into(),
            };
            if entries.iter().any(|(held, _, _)| held == name) {
                return Err(error(format!("the name '{name}' is given twice")));
            }
            entries.push((name.to_owned(), scope, hash));
        }
        Ok(Self { entries })
    }
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut hash = [0u8; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

/// Equal in time that does not depend on where two hashes differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Tokens {
    /// Whether no token is configured.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The caller `secret` names, if it is one of the tokens. Every token is compared, each
    /// in constant time, so the answer's timing does not tell which one or how close.
    pub fn caller(&self, secret: &str) -> Option<Caller> {
        let presented: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let mut found = None;
        for (name, scope, hash) in &self.entries {
            if same(&presented, hash) && found.is_none() {
                found = Some(Caller {
                    name: name.clone(),
                    scope: *scope,
                });
            }
        }
        found
    }
}
