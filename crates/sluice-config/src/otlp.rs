//! `otlp:`: traces exported over OTLP (gRPC) to a collector, off unless configured here or by
//! the standard `OTEL_EXPORTER_OTLP_ENDPOINT`.

use crate::raw::{RawClientTls, RawOtlp};
use crate::{ConfigError, error};

/// Where and how much to trace.
///
/// ```
/// let s = sluice_config::parse("otlp: {endpoint: 'http://127.0.0.1:4317', sample_ratio: 0.25}")?;
/// let otlp = s.otlp.unwrap();
/// assert_eq!((otlp.endpoint.as_str(), otlp.sample_ratio, otlp.keys), ("http://127.0.0.1:4317", 0.25, false));
/// assert!(sluice_config::parse("otlp: {endpoint: '127.0.0.1:4317'}").is_err());
/// // Shown without the PEMs: a client key is a secret.
/// let shown = format!("{otlp:?}");
/// assert!(shown.contains("127.0.0.1:4317") && !shown.contains("pem"));
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Clone, PartialEq)]
pub struct OtlpSettings {
    /// The collector's gRPC address, `http://` or `https://`.
    pub endpoint: String,
    /// The share of traces begun here that are kept, 0 to 1 (a caller's `traceparent` decides
    /// for the traces it continues).
    pub sample_ratio: f64,
    /// Whether a decision's span names its descriptors (the keys being limited).
    pub keys: bool,
    /// For an `https://` endpoint: the CA's PEM (`client_tls.ca`; Mozilla's roots if `None`).
    pub ca_pem: Option<Vec<u8>>,
    /// For an `https://` endpoint: the client certificate's and key's PEM (`client_tls`).
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
}

/// Shown without the PEMs (`validate --show` prints the settings): the key is a secret.
impl std::fmt::Debug for OtlpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OtlpSettings")
            .field("endpoint", &self.endpoint)
            .field("sample_ratio", &self.sample_ratio)
            .field("keys", &self.keys)
            .field("ca", &self.ca_pem.as_ref().map(|_| "(from client_tls.ca)"))
            .field(
                "identity",
                &self
                    .identity_pem
                    .as_ref()
                    .map(|_| "(from client_tls.cert and .key)"),
            )
            .finish()
    }
}

/// `otlp:` checked; `client_tls` gives an `https://` endpoint its CA and certificate.
pub(crate) fn check(
    raw: &RawOtlp,
    client_tls: Option<&RawClientTls>,
    dir: Option<&std::path::Path>,
) -> Result<OtlpSettings, ConfigError> {
    let endpoint = raw.endpoint.trim().to_owned();
    let https = match endpoint.split_once("://") {
        Some(("http", rest)) if !rest.is_empty() => false,
        Some(("https", rest)) if !rest.is_empty() => true,
        _ => {
            return Err(error(
                "otlp.endpoint",
                format!(
                    "{endpoint:?} is not an http:// or https:// address (a collector's OTLP gRPC port, say http://127.0.0.1:4317)"
                ),
            ));
        }
    };
    endpoint
        .parse::<http::Uri>()
        .map_err(|e| error("otlp.endpoint", format!("{endpoint:?}: {e}")))?;
    let sample_ratio = raw.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(error(
            "otlp.sample_ratio",
            format!("must be between 0 and 1, not {sample_ratio}"),
        ));
    }
    let (ca_pem, identity_pem) = match client_tls {
        Some(raw) if https => {
            let files = crate::check_service::tls_files("client_tls", raw, dir)?;
            (files.ca, files.client)
        }
        _ => (None, None),
    };
    Ok(OtlpSettings {
        endpoint,
        sample_ratio,
        keys: raw.keys,
        ca_pem,
        identity_pem,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_https_collector_takes_client_tls_and_is_never_shown_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [("ca.pem", "CA"), ("c.pem", "CERT"), ("k.pem", "SECRET-KEY")] {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let tls = RawClientTls {
            ca: Some("ca.pem".into()),
            cert: Some("c.pem".into()),
            key: Some("k.pem".into()),
        };
        let raw = |endpoint: &str| RawOtlp {
            endpoint: endpoint.into(),
            sample_ratio: None,
            keys: true,
        };
        let otlp = check(&raw("https://collector:4317"), Some(&tls), Some(dir.path())).unwrap();
        assert_eq!(otlp.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert_eq!(
            otlp.identity_pem,
            Some((b"CERT".to_vec(), b"SECRET-KEY".to_vec()))
        );
        assert_eq!((otlp.sample_ratio, otlp.keys), (1.0, true));
        // `validate --show` prints the settings' Debug: neither the key's text nor its bytes.
        let shown = format!("{otlp:?}");
        let key_bytes = format!("{:?}", b"SECRET-KEY".to_vec());
        assert!(
            !shown.contains("SECRET-KEY") && !shown.contains(&key_bytes[1..20]),
            "{shown}"
        );
        // Over http:// the client TLS is not read for the collector.
        let plain = check(&raw("http://collector:4317"), Some(&tls), Some(dir.path())).unwrap();
        assert_eq!((plain.ca_pem, plain.identity_pem), (None, None));
        let mut over = raw("http://collector:4317");
        over.sample_ratio = Some(1.5);
        let e = check(&over, None, None).unwrap_err();
        assert!(e.to_string().contains("otlp.sample_ratio"), "{e}");
    }
}
