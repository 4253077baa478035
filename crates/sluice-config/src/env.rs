//! Settings from the environment: `SLUICE_` and a key's path in the file, in upper case with
//! `_` for `.` (`SLUICE_REDIS_URL` sets `redis.url`). A value is read as YAML, so a list or a
//! map can be given whole (`SLUICE_ACCOUNTS='{alice: 10/s}'`); `NAME_FILE` reads the value from
//! a file instead, as container platforms mount secrets. The environment wins over the file;
//! command-line flags win over both.

use serde_norway::{Mapping, Value};

use crate::{ConfigError, error};

/// The sections whose string form is the shorthand for one key of their map form, and that
/// key: `upstream: URL` is `upstream: {url: URL}` (as `raw.rs` reads it). A variable that sets
/// another key of such a section keeps the file's string in that key. (`rules: PATH` is no
/// such shorthand: a rules file and a rules service are different things, and a variable that
/// sets a key of `rules` replaces the path.)
const SHORTHANDS: &[(&str, &str)] = &[("upstream", crate::raw::UPSTREAM_SHORTHAND)];

/// Every key the environment can set, as its path in the file. A section given as a map in
/// the file (`redis`, `rls`) is set key by key; a list or a map of the user's own entries
/// (`accounts`, `costs`, `upstream.routes`) is set whole. A section that may be a string
/// (`rules`, `upstream`) can be set whole too.
pub const ENV_KEYS: &[&str] = &[
    "listen",
    "tls",
    "client_tls",
    "idle_timeout",
    "drain_delay",
    "shutdown_timeout",
    "max_connections",
    "max_header_bytes",
    "max_headers",
    "key.from",
    "key.default",
    "key.max_length",
    "trusted_proxies",
    "client_ip_header",
    "ipv6_prefix",
    "algorithm",
    "burst",
    "failsafe",
    "failsafe_pool",
    "unknown",
    "fetch_latency",
    "fetch_timeout",
    "refresh",
    "capacity",
    "headers",
    "bypass",
    "on_excess",
    "max_wait",
    "queue_limit",
    "queue_order",
    "max_waiters",
    "accounts",
    "accounts_url",
    "costs",
    "charge_from.header",
    "charge_from.max",
    "charge_from.strip",
    "upstream",
    "upstream.url",
    "upstream.routes",
    "upstream.host",
    "upstream.connect_timeout",
    "upstream.head_timeout",
    "upstream.idle_timeout",
    "upstream.max_idle",
    "redis.url",
    "redis.cluster",
    "redis.policy",
    "redis.hosts",
    "redis.timeout",
    "redis.degrade_after",
    "redis.prefix",
    "redis.tls",
    "rules",
    "rules.url",
    "rules.poll",
    "rules.timeout",
    "rules.token",
    "rules.snapshot",
    "rls.listen",
    "rls.headers",
    "rls.shadow",
    "rls.quota_mode",
    "rls.dynamic_metadata",
    "rls.rlqs",
    "rls.rlqs_servers",
    "rls.tls",
    "api.listen",
    "api.tls",
    "counting",
    "merge_domains",
    "admin.listen",
    "admin.tls",
    "denied_log",
    "otlp.endpoint",
    "otlp.sample_ratio",
    "otlp.keys",
    "metrics.per_rule",
];

/// The standard OpenTelemetry variables that set the collector, in the order they are
/// looked at, when `SLUICE_OTLP_ENDPOINT` is not set.
const OTEL_ENDPOINTS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variable that sets `path` (`redis.url`: `SLUICE_REDIS_URL`).
///
/// ```
/// assert_eq!(sluice_config::env_name("rls.quota_mode"), "SLUICE_RLS_QUOTA_MODE");
/// ```
pub fn env_name(path: &str) -> String {
    format!("SLUICE_{}", path.replace('.', "_").to_ascii_uppercase())
}

/// One setting taken from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FromEnv {
    /// Its path in the file.
    pub path: &'static str,
    /// The variable it came from (`NAME`, or `NAME_FILE`).
    pub variable: String,
}

/// The settings `lookup` (the environment, or a test's) gives, each as a YAML value.
pub(crate) fn read(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Vec<(FromEnv, Value)>, ConfigError> {
    let mut given = Vec::new();
    for &path in ENV_KEYS {
        let name = env_name(path);
        let file_name = format!("{name}_FILE");
        let (variable, text) = match (lookup(&name), lookup(&file_name)) {
            (Some(_), Some(_)) => {
                return Err(error(
                    path,
                    format!("both {name} and {file_name} are set: give one"),
                ));
            }
            (Some(text), None) => (name, text),
            (None, Some(file)) => {
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| error(path, format!("{file_name}: cannot read {file}: {e}")))?;
                // A secret file ends with a line break more often than not.
                (file_name, text.trim_end_matches(['\n', '\r']).to_owned())
            }
            (None, None) => continue,
        };
        let value = if variable.ends_with("_FILE") {
            Value::String(text)
        } else {
            serde_norway::from_str::<Value>(&text)
                .map_err(|e| error(path, format!("{variable}: not a YAML value: {e}")))?
        };
        given.push((FromEnv { path, variable }, value));
    }
    if !given.iter().any(|(from, _)| from.path == "otlp.endpoint")
        && let Some((variable, endpoint)) =
            (OTEL_ENDPOINTS.iter()).find_map(|name| Some((*name, lookup(name).filter(|v| !v.is_empty())?)))
    {
        let from = FromEnv {
            path: "otlp.endpoint",
            variable: variable.to_owned(),
        };
        given.push((from, Value::String(endpoint)));
    }
    Ok(given)
}

/// `file` (the file's YAML) with each of `given` set at its path: a section the file gives
/// as something other than a map (`rules: limits.yaml`) becomes a map when a key inside it
/// is set; the string of a shorthand (`upstream: URL`) becomes the key it stands for
/// ([`SHORTHANDS`]).
pub(crate) fn overlay(file: Value, given: &[(FromEnv, Value)]) -> Value {
    let mut root = match file {
        Value::Mapping(map) => map,
        _ => Mapping::new(),
    };
    for (from, value) in given {
        let mut parts = from.path.split('.').peekable();
        let mut at = &mut root;
        let mut section = String::new();
        while let Some(part) = parts.next() {
            let key = Value::String(part.to_owned());
            if parts.peek().is_none() {
                at.insert(key, value.clone());
                break;
            }
            if !section.is_empty() {
                section.push('.');
            }
            section.push_str(part);
            let entry = at.entry(key).or_insert_with(|| Value::Mapping(Mapping::new()));
            if !entry.is_mapping() {
                *entry = map_form(&section, std::mem::replace(entry, Value::Null));
            }
            let Value::Mapping(inner) = entry else { break };
            at = inner;
        }
    }
    Value::Mapping(root)
}

/// `written`, the file's value of `section` where a map is needed: a shorthand's string in the
/// key it stands for, anything else dropped (an empty map).
fn map_form(section: &str, written: Value) -> Value {
    let mut map = Mapping::new();
    if let (Some((_, key)), Value::String(_)) =
        (SHORTHANDS.iter().find(|(name, _)| *name == section), &written)
    {
        map.insert(Value::String((*key).to_owned()), written);
    }
    Value::Mapping(map)
}
