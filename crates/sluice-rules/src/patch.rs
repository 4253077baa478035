//! JSON Patch (RFC 6902) on a domain's rules: the rules file read as a document, the
//! operations applied in order (all or none), the result written back as YAML and checked
//! like any other write. Paths are JSON Pointers (RFC 6901) into the file's fields, as
//! `/descriptors/0/rate_limit/requests_per_unit`. Comments in the file do not survive a patch.

use serde::Deserialize;
use serde_json::Value;

/// The most operations one patch holds.
pub const MAX_PATCH_OPERATIONS: usize = 1000;

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
    /// The stored rules could not be read as a document (never for rules this store wrote).
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
}

/// The rules file `text` with `patch` (a JSON Patch document) applied, as YAML.
pub(crate) fn apply(text: &str, patch: &[u8]) -> Result<String, PatchError> {
    let operations: Vec<Operation> =
        serde_json::from_slice(patch).map_err(|e| PatchError::Syntax(e.to_string()))?;
    if operations.len() > MAX_PATCH_OPERATIONS {
        return Err(PatchError::TooLong(operations.len()));
    }
    let mut document: Value = serde_norway::from_str(text).map_err(|e| PatchError::Stored(e.to_string()))?;
    for (index, operation) in operations.into_iter().enumerate() {
        apply_one(&mut document, index, operation)?;
    }
    serde_norway::to_string(&document).map_err(|e| PatchError::Stored(e.to_string()))
}

fn apply_one(document: &mut Value, index: usize, operation: Operation) -> Result<(), PatchError> {
    let failed = |op: &'static str, path: &str, message: String| PatchError::Operation {
        index,
        op,
        path: path.to_owned(),
        message,
    };
    match operation {
        Operation::Add { path, value } => add(document, &path, value).map_err(|m| failed("add", &path, m)),
        Operation::Remove { path } => remove(document, &path)
            .map(drop)
            .map_err(|m| failed("remove", &path, m)),
        Operation::Replace { path, value } => {
            let slot = find(document, &path).map_err(|m| failed("replace", &path, m))?;
            *slot = value;
            Ok(())
        }
        Operation::Move { from, path } => {
            if path.starts_with(&from) && path[from.len()..].starts_with('/') {
                return Err(failed("move", &path, format!("cannot move {from} into itself")));
            }
            let value = remove(document, &from).map_err(|m| failed("move", &path, m))?;
            add(document, &path, value).map_err(|m| failed("move", &path, m))
        }
        Operation::Copy { from, path } => {
            let value = find(document, &from)
                .map_err(|m| failed("copy", &path, m))?
                .clone();
            add(document, &path, value).map_err(|m| failed("copy", &path, m))
        }
        Operation::Test { path, value } => {
            let found = find(document, &path).map_err(|m| failed("test", &path, m))?;
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

fn add(document: &mut Value, pointer: &str, value: Value) -> Result<(), String> {
    if pointer.is_empty() {
        *document = value;
        return Ok(());
    }
    let (container, last) = parent(document, pointer)?;
    match container {
        Value::Object(map) => {
            map.insert(last, value);
        }
        Value::Array(items) => {
            let index = if last == "-" {
                items.len()
            } else {
                array_index(&last, items.len(), true)?
            };
            items.insert(index, value);
        }
        _ => return Err(format!("{last:?} is inside a value that has no fields")),
    }
    Ok(())
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
    fn pointers_unescape_tilde_and_slash() {
        let doc = patched(r#"[{"op": "add", "path": "/a~1b~0c", "value": 1}]"#).unwrap();
        assert_eq!(doc["a/b~c"], 1);
    }
}
