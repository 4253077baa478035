//! What is wrong with a rules file, and where.

use std::path::PathBuf;

/// A rules file's fault: the field as a path in the file (`descriptors[2].rate_limit.unit`)
/// and what is wrong with it. Its text is one line whatever the file holds.
///
/// # Example
/// ```
/// let e = sluice_descriptors::RuleSet::from_yaml("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
///     .unwrap_err();
/// assert_eq!(e.field, "descriptors[0].rate_limit.unit");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RulesError {
    /// Where.
    pub field: String,
    /// What.
    pub message: String,
}

impl RulesError {
    pub(crate) fn new(field: impl Into<String>, message: impl ToString) -> Self {
        Self {
            field: one_line(&field.into()),
            message: one_line(&message.to_string()),
        }
    }
}

/// `text` with control characters escaped, so an error stays on one line.
fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

/// Why rules could not be loaded from disk.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A file or directory could not be read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// Which.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file's rules are wrong.
    #[error("{path}: {error}", path = path.display())]
    Rules {
        /// Which file.
        path: PathBuf,
        /// What is wrong, and where in it.
        error: RulesError,
    },
    /// Two files give rules for one domain.
    #[error("{second}: domain '{domain}' is already given by {first}", first = first.display(), second = second.display())]
    DuplicateDomain {
        /// The domain.
        domain: String,
        /// The file read first.
        first: PathBuf,
        /// The file read second.
        second: PathBuf,
    },
}
