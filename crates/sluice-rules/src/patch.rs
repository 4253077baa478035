//! JSON Patch (RFC 6902) on a domain's rules: the rules file read as a document, the
//! operations applied in order (all or none), the result written back as YAML and checked
//! like any other write. Paths are JSON Pointers (RFC 6901) into the file's fields, as
//! `/descriptors/0/rate_limit/requests_per_unit`. Comments in the file do not survive a patch.
//!
//! Rules the document would change (a text field YAML takes for a number) are refused, as is
//! a document growing past a rules file's size or nesting past 128 levels on the way.

use serde::Deserialize;
use serde_json::Value;
use sluice_descriptors::Rule;

use crate::api::MAX_RULES_BYTES;

/// The most operations one patch holds.
pub const MAX_PATCH_OPERATIONS: usize = 1000;

/// The deepest a document may nest while it is patched: deeper than any rules file (the YAML
/// reader takes 128 levels), and shallow enough to write back and free without a deep stack.
const MAX_NESTING: usize = 128;

/// One operation.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum Operation {
    Add { path: String, value: Value },
    Remove { path: String },
    Replace { path: String, value: Value },
    Move { from: String, path: String },
    Copy { from: String, path: String },
    Test { path: String, value: Value },
}

/// Why a patch was not applied: the operation's index and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// Not a JSON Patch document.
    #[error("not a JSON Patch (an array of operations): {0}")]
    Syntax(String),
    /// More than [`MAX_PATCH_OPERATIONS`].
    #[error("a patch holds at most {MAX_PATCH_OPERATIONS} operations, not {0}")]
    TooLong(usize),
    /// The stored rules do not check, or their document could not be written (never for
    /// rules this store wrote).
    #[error("the stored rules cannot be patched: {0}")]
    Stored(String),
    /// An operation failed.
    #[error("operation {index} ({op} {path}): {message}")]
    Operation {
        /// Its place in the patch, from 0.
        index: usize,
        /// Its kind.
        op: &'static str,
        /// Its path.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A `test` operation found another value: the document is not what the patch expects.
    #[error("operation {index} (test {path}): the value differs")]
    TestFailed {
        /// Its place in the patch, from 0.
        index: usize,
        /// Its path.
        path: String,
    },
    /// The stored rules do not read as a document, or not back as the same rules: a YAML tag
    /// a document cannot hold (`!x`), or a text field holding what YAML takes for a number
    /// (`value: 1e3` is the text "1e3" to the rules, the number 1000.0 to a document, written
    /// back as `1000.0`). Patched, such rules would fail or change unseen; they are to be
    /// written again (`PUT`) without the tag or with the value quoted first.
    #[error(
        "the stored rules do not read back as the same rules once read as a document ({0}): write them again without YAML tags and with the values YAML takes for numbers (such as 1e3 or 0x10) quoted, then patch"
    )]
    NotADocument(String),
    /// The patched rules file is larger than a write may be ([`MAX_RULES_BYTES`]).
    #[error("the patched rules are {0} bytes, more than the {MAX_RULES_BYTES} a rules file may be")]
    TooLarge(usize),
}

/// The rules file `text` with `patch` (a JSON Patch document) applied, as YAML.
///
/// The document may not grow past [`MAX_RULES_BYTES`] (counted by `measure`) nor nest past
/// `MAX_NESTING` levels while it is patched: a few operations copying the document into
/// itself would otherwise double it each time.
pub(crate) fn apply(text: &str, patch: &[u8]) -> Result<String, PatchError> {
    let operations: Vec<Operation> =
        serde_json::from_slice(patch).map_err(|e| PatchError::Syntax(e.to_string()))?;
    if operations.len() > MAX_PATCH_OPERATIONS {
        return Err(PatchError::TooLong(operations.len()));
    }
    let document: Value =
        serde_norway::from_str(text).map_err(|e| PatchError::NotADocument(e.to_string()))?;
    reads_back(text, &document)?;
    let (weight, _) = measure(&document);
    let mut patched = Patched { document, weight };
    for (index, operation) in operations.into_iter().enumerate() {
        apply_one(&mut patched, index, operation)?;
    }
    let text = serde_norway::to_string(&patched.document).map_err(|e| PatchError::Stored(e.to_string()))?;
    if text.len() > MAX_RULES_BYTES {
        return Err(PatchError::TooLarge(text.len()));
    }
    Ok(text)
}

/// Whether `document`, read from the stored rules `text`, writes back as the same rules.
fn reads_back(text: &str, document: &Value) -> Result<(), PatchError> {
    let written = serde_norway::to_string(document).map_err(|e| PatchError::Stored(e.to_string()))?;
    let rules = |text: &str| {
        sluice_descriptors::parse_domain(text).map(|domain| {
            let mut rules: Vec<Rule> = domain.rules().cloned().collect();
            rules.sort_by(|a, b| a.id.cmp(&b.id));
            (domain.name().to_owned(), rules)
        })
    };
    let (stored, again) = (rules(text), rules(&written));
    if stored == again {
        return Ok(());
    }
    let detail = match (stored, again) {
        (Ok((name, _)), Ok((other, _))) if name != other => format!("domain {name:?} reads as {other:?}"),
        (Ok((_, stored)), Ok((_, again))) => match stored.iter().find(|rule| !again.contains(rule)) {
            Some(rule) => format!("rule '{}' changes", rule.id),
            None => "a rule is added".to_owned(),
        },
        (_, Err(e)) => format!("then {e}"),
        (Err(e), _) => return Err(PatchError::Stored(e.to_string())),
    };
    Err(PatchError::NotADocument(detail))
}

/// A document being patched, and its weight (`measure`).
struct Patched {
    document: Value,
    weight: usize,
}

impl Patched {
    /// Puts `value` at `pointer` (`add`, or with `replace` only where a value is), keeping the
    /// document within its bounds.
    fn put(&mut self, pointer: &str, value: Value, replace: bool) -> Result<(), String> {
        let (weight, depth) = measure(&value);
        let tokens = tokens(pointer)?.len();
        if tokens + depth > MAX_NESTING {
            return Err(format!("the rules would nest deeper than {MAX_NESTING} levels"));
        }
        let displaced = if replace {
            let slot = find(&mut self.document, pointer)?;
            Some(std::mem::replace(slot, value))
        } else {
            add(&mut self.document, pointer, value)?
        };
        let freed = displaced.as_ref().map_or(0, |old| measure(old).0);
        self.weight = (self.weight - freed.min(self.weight)).saturating_add(weight);
        if self.weight > MAX_RULES_BYTES {
            return Err(format!("the rules would grow past {MAX_RULES_BYTES} bytes"));
        }
        Ok(())
    }

    /// Takes the value at `pointer` out.
    fn take(&mut self, pointer: &str) -> Result<Value, String> {
        let value = remove(&mut self.document, pointer)?;
        self.weight -= measure(&value).0.min(self.weight);
        Ok(value)
    }
}

/// A value's weight, a little under the bytes of its text (every value counts one, and a
/// string or a field's name its bytes), and its depth (a value with no fields is 1 deep).
fn measure(value: &Value) -> (usize, usize) {
    match value {
        Value::String(text) => (1 + text.len(), 1),
        Value::Array(items) => items.iter().fold((1, 1), |(weight, depth), item| {
            let (w, d) = measure(item);
            (weight.saturating_add(w), depth.max(d + 1))
        }),
        Value::Object(map) => map.iter().fold((1, 1), |(weight, depth), (key, item)| {
            let (w, d) = measure(item);
            (weight.saturating_add(w + key.len()), depth.max(d + 1))
        }),
        _ => (1, 1),
    }
}

fn apply_one(patched: &mut Patched, index: usize, operation: Operation) -> Result<(), PatchError> {
    let failed = |op: &'static str, path: &str, message: String| PatchError::Operation {
        index,
        op,
        path: path.to_owned(),
        message,
    };
    match operation {
        Operation::Add { path, value } => {
            (patched.put(&path, value, false)).map_err(|m| failed("add", &path, m))
        }
        Operation::Remove { path } => (patched.take(&path))
            .map(drop)
            .map_err(|m| failed("remove", &path, m)),
        Operation::Replace { path, value } => {
            (patched.put(&path, value, true)).map_err(|m| failed("replace", &path, m))
        }
        Operation::Move { from, path } => {
            if path.starts_with(&from) && path[from.len()..].starts_with('/') {
                return Err(failed("move", &path, format!("cannot move {from} into itself")));
            }
            let value = patched.take(&from).map_err(|m| failed("move", &path, m))?;
            patched
                .put(&path, value, false)
                .map_err(|m| failed("move", &path, m))
        }
        Operation::Copy { from, path } => {
            let value = find(&mut patched.document, &from)
                .map_err(|m| failed("copy", &path, m))?
                .clone();
            patched
                .put(&path, value, false)
                .map_err(|m| failed("copy", &path, m))
        }
        Operation::Test { path, value } => {
            let found = find(&mut patched.document, &path).map_err(|m| failed("test", &path, m))?;
            if *found == value {
                Ok(())
            } else {
                Err(PatchError::TestFailed { index, path })
            }
        }
    }
}

/// A pointer's tokens, unescaped (`~1` is `/`, `~0` is `~`).
fn tokens(pointer: &str) -> Result<Vec<String>, String> {
    if pointer.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err("a path starts with '/'".into());
    };
    Ok(rest
        .split('/')
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .collect())
}

/// An array index as RFC 6901 writes it (no sign, no leading zero).
fn array_index(token: &str, len: usize, past_end: bool) -> Result<usize, String> {
    let digits = !token.is_empty() && token.bytes().all(|b| b.is_ascii_digit());
    if !digits || (token.len() > 1 && token.starts_with('0')) {
        return Err(format!("{token:?} is not an array index"));
    }
    let index: usize = token.parse().map_err(|_| format!("{token:?} is out of range"))?;
    let bound = if past_end { len } else { len.saturating_sub(1) };
    if index > bound || (!past_end && len == 0) {
        return Err(format!("index {index} is past the end ({len} items)"));
    }
    Ok(index)
}

fn find<'a>(document: &'a mut Value, pointer: &str) -> Result<&'a mut Value, String> {
    walk(document, tokens(pointer)?)
}

/// The value `tokens` lead to from `document`.
fn walk(document: &mut Value, tokens: Vec<String>) -> Result<&mut Value, String> {
    let mut here = document;
    for token in tokens {
        here = match here {
            Value::Object(map) => map.get_mut(&token).ok_or_else(|| format!("no field {token:?}"))?,
            Value::Array(items) => {
                let index = array_index(&token, items.len(), false)?;
                &mut items[index]
            }
            _ => return Err(format!("{token:?} is inside a value that has no fields")),
        };
    }
    Ok(here)
}

/// The container a pointer's last token is in, and that token.
fn parent<'a>(document: &'a mut Value, pointer: &str) -> Result<(&'a mut Value, String), String> {
    let mut all = tokens(pointer)?;
    let Some(last) = all.pop() else {
        return Err("the whole document cannot be added or removed".into());
    };
    Ok((walk(document, all)?, last))
}

/// Adds `value` at `pointer`; the value it took the place of, if any (an object's field, or
/// the whole document).
fn add(document: &mut Value, pointer: &str, value: Value) -> Result<Option<Value>, String> {
    if pointer.is_empty() {
        return Ok(Some(std::mem::replace(document, value)));
    }
    let (container, last) = parent(document, pointer)?;
    match container {
        Value::Object(map) => Ok(map.insert(last, value)),
        Value::Array(items) => {
            let index = if last == "-" {
                items.len()
            } else {
                array_index(&last, items.len(), true)?
            };
            items.insert(index, value);
            Ok(None)
        }
        _ => Err(format!("{last:?} is inside a value that has no fields")),
    }
}

fn remove(document: &mut Value, pointer: &str) -> Result<Value, String> {
    let (container, last) = parent(document, pointer)?;
    match container {
        Value::Object(map) => map.remove(&last).ok_or_else(|| format!("no field {last:?}")),
        Value::Array(items) => {
            let index = array_index(&last, items.len(), false)?;
            Ok(items.remove(index))
        }
        _ => Err(format!("{last:?} is inside a value that has no fields")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EDGE: &str =
        "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 60}\n";

    fn patched(patch: &str) -> Result<Value, PatchError> {
        let text = apply(EDGE, patch.as_bytes())?;
        Ok(serde_norway::from_str(&text).unwrap())
    }

    #[test]
    fn operations_apply_in_order() {
        let doc = patched(
            r#"[
            {"op": "test", "path": "/descriptors/0/rate_limit/requests_per_unit", "value": 60},
            {"op": "replace", "path": "/descriptors/0/rate_limit/requests_per_unit", "value": 30},
            {"op": "add", "path": "/descriptors/-", "value": {"key": "user"}},
            {"op": "copy", "from": "/descriptors/0/rate_limit", "path": "/descriptors/1/rate_limit"},
            {"op": "add", "path": "/descriptors/0/shadow_mode", "value": true},
            {"op": "remove", "path": "/descriptors/0/shadow_mode"},
            {"op": "move", "from": "/descriptors/1", "path": "/descriptors/0"}
        ]"#,
        )
        .unwrap();
        assert_eq!(doc["descriptors"][0]["key"], "user");
        assert_eq!(doc["descriptors"][0]["rate_limit"]["requests_per_unit"], 30);
        assert_eq!(doc["descriptors"][1]["key"], "ip");
        assert!(doc["descriptors"][1].get("shadow_mode").is_none());
    }

    #[test]
    fn a_failing_operation_is_named_and_a_test_guards() {
        let e = patched(r#"[{"op": "replace", "path": "/descriptors/3/key", "value": "x"}]"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("operation 0 (replace /descriptors/3/key)"),
            "{e}"
        );
        let e = patched(r#"[{"op": "test", "path": "/domain", "value": "api"}]"#).unwrap_err();
        assert!(matches!(e, PatchError::TestFailed { index: 0, .. }), "{e}");
        assert!(matches!(
            patched(r#"{"op": "remove"}"#),
            Err(PatchError::Syntax(_))
        ));
        assert!(matches!(
            patched(r#"[{"op": "fly", "path": ""}]"#),
            Err(PatchError::Syntax(_))
        ));
        let e = patched(r#"[{"op": "remove", "path": "/descriptors/01"}]"#).unwrap_err();
        assert!(e.to_string().contains("not an array index"), "{e}");
        let e =
            patched(r#"[{"op": "move", "from": "/descriptors", "path": "/descriptors/0/x"}]"#).unwrap_err();
        assert!(e.to_string().contains("into itself"), "{e}");
        let many = format!(
            "[{}]",
            vec![r#"{"op":"test","path":"","value":1}"#; 1001].join(",")
        );
        assert!(matches!(
            apply(EDGE, many.as_bytes()),
            Err(PatchError::TooLong(1001))
        ));
    }

    #[test]
    fn a_patch_cannot_grow_the_rules_past_a_rules_file() {
        // Each copy of the document into itself doubles it: 2^40 times the rules, unbounded.
        let doubling = vec![r#"{"op": "copy", "from": "", "path": "/descriptors/-"}"#; 40];
        let e = apply(EDGE, format!("[{}]", doubling.join(",")).as_bytes()).unwrap_err();
        assert!(matches!(e, PatchError::Operation { op: "copy", .. }), "{e}");
        assert!(e.to_string().contains("grow past 4194304 bytes"), "{e}");
        // Removing makes room again: the same copy after the copies are gone applies.
        let mut room = vec![r#"{"op": "copy", "from": "", "path": "/descriptors/-"}"#; 12];
        room.extend([r#"{"op": "remove", "path": "/descriptors/1"}"#; 12]);
        room.extend([r#"{"op": "copy", "from": "", "path": "/x"}"#]);
        let text = apply(EDGE, format!("[{}]", room.join(",")).as_bytes()).unwrap();
        assert!(text.len() < 1000, "{text}");

        // Within the count, yet written out as YAML, too long (one zero per indented line).
        let mut deep = "0".to_string();
        let zeros = vec!["0"; 100_000].join(",");
        for _ in 0..30 {
            deep = format!(r#"{{"a": {deep}}}"#);
        }
        let deep = deep.replacen('0', &format!("[{zeros}]"), 1);
        let patch = format!(r#"[{{"op": "add", "path": "/x", "value": {deep}}}]"#);
        let e = apply(EDGE, patch.as_bytes()).unwrap_err();
        assert!(matches!(e, PatchError::TooLarge(n) if n > MAX_RULES_BYTES), "{e}");
    }

    #[test]
    fn a_patch_cannot_nest_the_rules_without_bound() {
        // Each add nests 100 levels below the last one: the writer's stack would run out.
        let nested = |levels: usize| "[".repeat(levels) + &"]".repeat(levels);
        let first = format!(r#"{{"op": "add", "path": "/x", "value": {}}}"#, nested(100));
        let below = format!("/x{}", "/0".repeat(99));
        let second = format!(
            r#"{{"op": "add", "path": "{below}/-", "value": {}}}"#,
            nested(100)
        );
        let e = apply(EDGE, format!("[{first},{second}]").as_bytes()).unwrap_err();
        assert!(e.to_string().contains("nest deeper than 128 levels"), "{e}");
        // Moving a deep value below another deep one is the same.
        let sibling = format!(r#"{{"op": "add", "path": "/y", "value": {}}}"#, nested(100));
        let r#move = format!(r#"{{"op": "move", "from": "/y", "path": "{below}/-"}}"#);
        let e = apply(EDGE, format!("[{first},{sibling},{move}]").as_bytes()).unwrap_err();
        assert!(e.to_string().contains("nest deeper than 128 levels"), "{e}");
    }

    #[test]
    fn rules_a_document_would_change_are_refused_not_changed() {
        // To the rules `1e3` is text; to a document, the number 1000.0.
        let stored = "domain: edge\ndescriptors:\n  - key: v\n    value: 1e3\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
        let e = apply(stored, b"[]").unwrap_err();
        assert!(matches!(e, PatchError::NotADocument(_)), "{e}");
        assert!(e.to_string().contains("rule 'edge: v=1e3' changes"), "{e}");
        // A tag the rules take and a document cannot hold.
        let tagged = "domain: edge\ndescriptors:\n !-   ";
        assert!(sluice_descriptors::parse_domain(tagged).is_ok());
        let e = apply(tagged, b"[]").unwrap_err();
        assert!(matches!(e, PatchError::NotADocument(_)), "{e}");
        // Quoted, it is text to both.
        let quoted = stored.replace("1e3", "'1e3'");
        let patched = apply(&quoted, b"[]").unwrap();
        assert!(patched.contains("'1e3'"), "{patched}");
    }

    #[test]
    fn pointers_unescape_tilde_and_slash() {
        let doc = patched(r#"[{"op": "add", "path": "/a~1b~0c", "value": 1}]"#).unwrap();
        assert_eq!(doc["a/b~c"], 1);
    }
}
