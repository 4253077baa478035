//! The rate-limit service's part of the config (`rules`, `rls`, `api`, `counting`,
//! `merge_domains`) and the TLS sections every listener and client share (`tls`, `client_tls`,
//! `redis.tls`): checked into their settings, the files they name read.

use std::net::SocketAddr;

use sluice_rules_client::ClientTls;

use super::check::in_dir;
use super::raw::{RawListener, RawRls, RawRules, RawRulesService};
use super::{
    Answers, ConfigError, Counting, DEFAULT_RULES_POLL, DEFAULT_RULES_SNAPSHOT, FieldSet, LoadedRules,
    RulesFrom, RulesService, ServiceSettings, TlsSettings, duration, error,
};

/// The most RLQS servers `rls.rlqs_servers` may name.
const MAX_RLQS_SERVERS: u32 = 1024;
/// The rate-limit service's settings: the rules loaded and checked (their errors name the
/// rule file and the field in it), the listeners, the counting.
pub(super) fn service(
    rules: Option<&RawRules>,
    rls: Option<&RawRls>,
    api: Option<&RawListener>,
    counting: Option<&str>,
    merge_domains: bool,
    client_tls: Option<&ClientTls>,
    dir: Option<&std::path::Path>,
) -> Result<Option<ServiceSettings>, ConfigError> {
    let address = |field: &str, text: &str| {
        text.parse::<SocketAddr>()
            .map_err(|e| error(field, format!("invalid address {text:?}: {e}")))
    };
    let rls_listen = (rls.and_then(|r| r.listen.as_deref()))
        .map(|listen| address("rls.listen", listen))
        .transpose()?;
    let rlqs = rls.is_some_and(|r| r.rlqs);
    if rlqs && rls_listen.is_none() {
        return Err(error(
            "rls.rlqs",
            "is served on the RLS port: give rls.listen too",
        ));
    }
    let rlqs_servers = match rls.and_then(|r| r.rlqs_servers) {
        None => 1,
        Some(n) => u32::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_RLQS_SERVERS).contains(n))
            .ok_or_else(|| {
                error(
                    "rls.rlqs_servers",
                    format!(
                        "{n}: give the number of RLQS servers behind one address, 1 to {MAX_RLQS_SERVERS}"
                    ),
                )
            })?,
    };
    let api_listen = api.map(|a| address("api.listen", &a.listen)).transpose()?;
    let api_tls = (api.and_then(|a| a.tls.as_ref()))
        .map(|raw| tls("api.tls", raw, dir))
        .transpose()?;
    let rls_tls = (rls.and_then(|r| r.tls.as_ref()))
        .map(|raw| tls("rls.tls", raw, dir))
        .transpose()?;
    let headers = match rls.and_then(|r| r.headers.as_deref()) {
        Some(text) => text.parse().map_err(|e| error("rls.headers", e))?,
        None => FieldSet::default(),
    };
    let counting = match counting {
        Some(text) => text.parse().map_err(|e| error("counting", e))?,
        None => Counting::default(),
    };
    let Some(rules) = rules else {
        if rls.is_some() || api_listen.is_some() {
            let field = if rls.is_some() { "rls" } else { "api" };
            return Err(error(
                field,
                "the service needs rules: give `rules: FILE_OR_DIRECTORY` or `rules: {url: ...}`",
            ));
        }
        return Ok(None);
    };
    let options = sluice_descriptors::LoadOptions { merge_domains };
    let rules = match rules {
        RawRules::Path(written) => {
            let path = in_dir(dir, written);
            let loaded =
                sluice_descriptors::RuleSet::load_with(&path, options).map_err(|e| error("rules", e))?;
            RulesFrom::Files {
                path,
                options,
                loaded: std::sync::Arc::new(LoadedRules(loaded)),
            }
        }
        RawRules::Service(_) if merge_domains => {
            return Err(error(
                "merge_domains",
                "merges rules files; a rules service holds one document per domain",
            ));
        }
        RawRules::Service(service) => RulesFrom::Service(Box::new(rules_service(service, client_tls, dir)?)),
    };
    let answers = rls.map_or(Answers::default(), |rls| Answers {
        shadow: rls.shadow,
        quota_mode: rls.quota_mode,
        dynamic_metadata: rls.dynamic_metadata,
    });
    Ok(Some(ServiceSettings {
        rules,
        rls: rls_listen,
        rlqs,
        rlqs_servers,
        api: api_listen,
        counting,
        headers,
        answers,
        api_tls,
        rls_tls,
    }))
}

/// `rules: {url, ...}`: the client of a rules service, checked (its rules are fetched when
/// the server starts).
fn rules_service(
    raw: &RawRulesService,
    client_tls: Option<&ClientTls>,
    dir: Option<&std::path::Path>,
) -> Result<RulesService, ConfigError> {
    let poll = match &raw.poll {
        Some(text) => duration("rules.poll", text)?,
        None => DEFAULT_RULES_POLL,
    };
    if poll.is_zero() {
        return Err(error("rules.poll", "must be more than 0"));
    }
    let timeout = match &raw.timeout {
        Some(text) => duration("rules.timeout", text)?,
        None => sluice_rules_client::DEFAULT_TIMEOUT,
    };
    if timeout.is_zero() {
        return Err(error("rules.timeout", "must be more than 0"));
    }
    // SLUICE_RULES_TOKEN has already been laid over the file's (`env.rs`).
    let token = raw.token.clone();
    let source = sluice_rules_client::RulesSource::new(&raw.url, token.as_deref())
        .map_err(|e| match e {
            sluice_rules_client::UrlError::Token => error("rules.token", e),
            _ => error("rules.url", e),
        })?
        .timeout(timeout);
    let source = match client_tls {
        Some(tls) => source.tls(tls.clone()),
        None => source,
    };
    let snapshot = in_dir(dir, raw.snapshot.as_deref().unwrap_or(DEFAULT_RULES_SNAPSHOT));
    Ok(RulesService {
        url: raw.url.clone(),
        source,
        poll,
        snapshot,
    })
}

/// Checks that every rule's algorithm has a Redis script and its quota fits Redis' numbers
/// (the rules of a service whose counters are on Redis); the message names the rule.
pub(super) fn rules_fit_redis(
    rules: &sluice_descriptors::RuleSet,
    algorithm: sluice::AlgorithmKind,
) -> Result<(), String> {
    for rule in rules.rules() {
        if let sluice_descriptors::Limit::Quota(quota) = rule.limit {
            let kind = rule.algorithm.unwrap_or(algorithm);
            for quota in std::iter::once(&quota).chain(&rule.stacked) {
                sluice_redis::check_quota(kind, quota).map_err(|e| format!("rule {}: {e}", rule.id))?;
            }
        }
    }
    Ok(())
}

/// The PEM files of a `{ca, cert, key}` section (`field`), read: the CA's bytes, and the
/// client certificate's and key's (both or neither).
pub(super) fn tls_files(
    field: &str,
    raw: &super::raw::RawClientTls,
    dir: Option<&std::path::Path>,
) -> Result<sluice_redis::RedisTls, ConfigError> {
    let read = |name: &str, written: &str| {
        let path = in_dir(dir, written);
        std::fs::read(&path).map_err(|e| {
            error(
                format!("{field}.{name}"),
                format!("cannot read {}: {e}", path.display()),
            )
        })
    };
    let ca = raw.ca.as_deref().map(|written| read("ca", written)).transpose()?;
    let identity = match (&raw.cert, &raw.key) {
        (Some(cert), Some(key)) => Some((read("cert", cert)?, read("key", key)?)),
        (None, None) => None,
        (Some(_), None) => {
            return Err(error(
                format!("{field}.key"),
                format!("is missing beside {field}.cert"),
            ));
        }
        (None, Some(_)) => {
            return Err(error(
                format!("{field}.cert"),
                format!("is missing beside {field}.key"),
            ));
        }
    };
    Ok(sluice_redis::RedisTls { ca, client: identity })
}

/// `client_tls: {ca, cert, key}` read into the TLS client of every `https://` service.
pub(super) fn client_tls(
    raw: &super::raw::RawClientTls,
    dir: Option<&std::path::Path>,
) -> Result<ClientTls, ConfigError> {
    let sluice_redis::RedisTls { ca, client: identity } = tls_files("client_tls", raw, dir)?;
    let identity = identity
        .as_ref()
        .map(|(cert, key)| (cert.as_slice(), key.as_slice()));
    ClientTls::new(ca.as_deref(), identity).map_err(|e| match e {
        sluice_rules_client::ClientTlsError::Ca(_) => error("client_tls.ca", e),
        _ => error("client_tls.cert", e),
    })
}

/// `field: {cert, key, client_ca, allow}` checked: each file readable (relative paths from the
/// config's directory), `allow` only beside `client_ca`. The binary reads the PEM itself.
pub(super) fn tls(
    field: &str,
    raw: &super::raw::RawTls,
    dir: Option<&std::path::Path>,
) -> Result<TlsSettings, ConfigError> {
    let readable = |name: &str, written: &str| {
        let path = in_dir(dir, written);
        std::fs::metadata(&path).map_err(|e| {
            error(
                format!("{field}.{name}"),
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        Ok::<_, ConfigError>(path)
    };
    let cert = readable("cert", &raw.cert)?;
    let key = readable("key", &raw.key)?;
    let client_ca = (raw.client_ca.as_deref())
        .map(|written| readable("client_ca", written))
        .transpose()?;
    if !raw.allow.is_empty() && client_ca.is_none() {
        return Err(error(
            format!("{field}.allow"),
            "names clients, which only a listener with client_ca asks for",
        ));
    }
    if let Some(name) = raw.allow.iter().find(|name| name.is_empty() || name.len() > 253) {
        return Err(error(
            format!("{field}.allow"),
            format!("{name:?} is not a DNS name"),
        ));
    }
    Ok(TlsSettings {
        cert,
        key,
        client_ca,
        allow: raw.allow.clone(),
    })
}
