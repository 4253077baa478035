//! https:// for the services a host asks: rustls with the ring provider, trusting a CA the
//! config names or, by default, Mozilla's roots; with a client certificate where the service
//! asks for one (mTLS).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How a host speaks TLS to the services it asks (`client_tls:` in its config).
///
/// # Example
/// ```
/// use sluice_rules_client::{ClientTls, RulesSource};
/// let mozilla = ClientTls::new(None, None)?;
/// let source = RulesSource::new("https://rules.internal", None)?.tls(mozilla);
/// assert_eq!(source.authority(), "rules.internal:443");
/// assert!(ClientTls::new(Some(b"not PEM"), None).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct ClientTls(pub(crate) Arc<rustls::ClientConfig>);

/// Why a [`ClientTls`] could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientTlsError {
    /// The CA's PEM holds no usable certificate.
    #[error("ca: {0}")]
    Ca(String),
    /// The client certificate or its key is not usable.
    #[error("cert: {0}")]
    Identity(String),
}

impl ClientTls {
    /// Trusting the CA certificates in `ca_pem` (Mozilla's roots if `None`), presenting the
    /// certificate chain and key of `identity` (both PEM) if given.
    ///
    /// # Errors
    /// A PEM holds no certificate or key, or rustls refuses the pair.
    pub fn new(ca_pem: Option<&[u8]>, identity: Option<(&[u8], &[u8])>) -> Result<Self, ClientTlsError> {
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            Some(pem) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<_, _>>()
                    .map_err(|e| ClientTlsError::Ca(format!("not PEM certificates: {e}")))?;
                if certs.is_empty() {
                    return Err(ClientTlsError::Ca("no certificate in it".into()));
                }
                for cert in certs {
                    roots.add(cert).map_err(|e| ClientTlsError::Ca(e.to_string()))?;
                }
            }
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientTlsError::Ca(e.to_string()))?
            .with_root_certificates(roots);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<_, _>>()
                    .map_err(|e| ClientTlsError::Identity(format!("not PEM certificates: {e}")))?;
                if chain.is_empty() {
                    return Err(ClientTlsError::Identity("no certificate in it".into()));
                }
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| ClientTlsError::Identity(format!("key: no private key in it: {e}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| ClientTlsError::Identity(e.to_string()))?
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self(Arc::new(config)))
    }

    /// The rustls configuration, for a client of sluice's own that connects by itself (the
    /// reverse proxy's upstream connections); it offers `http/1.1` over ALPN.
    ///
    /// # Example
    /// ```
    /// let tls = sluice_rules_client::ClientTls::new(None, None)?;
    /// assert_eq!(tls.rustls_config().alpn_protocols, [b"http/1.1".to_vec()]);
    /// # Ok::<(), sluice_rules_client::ClientTlsError>(())
    /// ```
    pub fn rustls_config(&self) -> &Arc<rustls::ClientConfig> {
        &self.0
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field(
                "client_certificate",
                &self.0.client_auth_cert_resolver.has_certs(),
            )
            .finish_non_exhaustive()
    }
}
