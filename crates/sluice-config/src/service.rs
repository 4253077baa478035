//! The settings of the rate-limit service (rules, listeners, how answers are given) and the
//! TLS of a listener, as the config gives them.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Counting, FieldSet};

/// The rate-limit service: descriptor rules and where they are asked for.
///
/// ```
/// let file = "rules: {url: http://127.0.0.1:8083}\nrls: {listen: 127.0.0.1:8081, headers: draft}\n";
/// let service = sluice_config::parse(file)?.service.unwrap();
/// assert_eq!(service.rls, Some("127.0.0.1:8081".parse().unwrap()));
/// assert_eq!(service.headers, sluice_config::FieldSet::Draft);
/// assert_eq!(service.counting, sluice_config::Counting::AllOrNothing);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Where the rules come from.
    pub rules: RulesFrom,
    /// Where the RLS v3 gRPC service listens, if anywhere.
    pub rls: Option<SocketAddr>,
    /// `rls.rlqs` (default `false`): Envoy's Rate Limit Quota Service (RLQS,
    /// `StreamRateLimitQuotas`) on the RLS port too, on the same rules. It needs `rls.listen`.
    ///
    /// ```
    /// let rlqs = |rls: &str| {
    ///     let file = format!("rules: {{url: http://127.0.0.1:8083}}\nrls: {rls}\n");
    ///     sluice_config::parse(&file).map(|settings| settings.service.map(|s| s.rlqs))
    /// };
    /// assert_eq!(rlqs("{listen: 127.0.0.1:8081, rlqs: true}")?, Some(true));
    /// assert_eq!(rlqs("{listen: 127.0.0.1:8081, rlqs: false}")?, Some(false));
    /// assert_eq!(rlqs("{listen: 127.0.0.1:8081}")?, Some(false));
    /// // Not a boolean.
    /// assert!(rlqs("{listen: 127.0.0.1:8081, rlqs: sometimes}").is_err());
    /// // Served on the RLS port: without one there is nowhere to serve it.
    /// let e = rlqs("{rlqs: true}").unwrap_err();
    /// assert_eq!(e.field, "rls.rlqs");
    /// # Ok::<(), sluice_config::ConfigError>(())
    /// ```
    pub rlqs: bool,
    /// `rls.rlqs_servers` (default 1, at most 1 024): the RLQS servers behind one address,
    /// each owning the Envoys that stream to it; each hands out `1 / rlqs_servers` of every
    /// limit, so together they hand out the limit. RLS answers are not affected.
    ///
    /// ```
    /// let servers = |rls: &str| {
    ///     let file = format!("rules: {{url: http://127.0.0.1:8083}}\nrls: {rls}\n");
    ///     sluice_config::parse(&file).map(|settings| settings.service.map(|s| s.rlqs_servers))
    /// };
    /// assert_eq!(servers("{listen: 127.0.0.1:8081, rlqs: true}")?, Some(1));
    /// assert_eq!(servers("{listen: 127.0.0.1:8081, rlqs: true, rlqs_servers: 3}")?, Some(3));
    /// let e = servers("{listen: 127.0.0.1:8081, rlqs: true, rlqs_servers: 0}").unwrap_err();
    /// assert_eq!(e.field, "rls.rlqs_servers");
    /// # Ok::<(), sluice_config::ConfigError>(())
    /// ```
    pub rlqs_servers: u32,
    /// Where the HTTP check API listens, if anywhere.
    pub api: Option<SocketAddr>,
    /// TLS on the check API (`api.tls`).
    pub api_tls: Option<TlsSettings>,
    /// TLS on the RLS port (`rls.tls`).
    pub rls_tls: Option<TlsSettings>,
    /// How one request's descriptors are counted.
    pub counting: Counting,
    /// The rate-limit header fields answers carry (`rls.headers`).
    pub headers: FieldSet,
    /// How answers are given beyond the rules (`rls.shadow`, `rls.quota_mode`,
    /// `rls.dynamic_metadata`).
    pub answers: Answers,
}

/// A listener's TLS (`tls: {cert, key, client_ca, allow}`): the files are read again when they
/// change, so a rotated certificate needs no restart.
///
/// ```
/// let dir = std::env::temp_dir();
/// let (cert, key) = (dir.join("sluice-doc-cert.pem"), dir.join("sluice-doc-key.pem"));
/// std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\n")?;
/// std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n")?;
/// let file = format!("admin: {{listen: 127.0.0.1:9901, tls: {{cert: {}, key: {}}}}}\n", cert.display(), key.display());
/// let tls = sluice_config::parse(&file)?.admin_tls.unwrap();
/// assert_eq!((tls.cert, tls.client_ca), (cert, None));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain, PEM, leaf first.
    pub cert: std::path::PathBuf,
    /// Its private key, PEM.
    pub key: std::path::PathBuf,
    /// Clients must present a certificate issued by one of these (PEM), if given.
    pub client_ca: Option<std::path::PathBuf>,
    /// With `client_ca`: the DNS names (a certificate's subject alternative names) a client
    /// may have; any, if empty.
    pub allow: Vec<String>,
}

/// How the service answers beyond what the rules say: envoy ratelimit's global settings.
///
/// ```
/// let file = "rules: {url: http://127.0.0.1:8083}\nrls: {shadow: true, dynamic_metadata: true}\n";
/// let service = sluice_config::parse(file)?.service.unwrap();
/// assert!(service.answers.shadow && service.answers.dynamic_metadata && !service.answers.quota_mode);
/// assert_eq!(service.rls, None);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Answers {
    /// `rls.shadow`: every request answered OK, counted and reported as if enforced.
    pub shadow: bool,
    /// `rls.quota_mode`: every rule in quota mode.
    pub quota_mode: bool,
    /// `rls.dynamic_metadata`: answers carry the request and the admitting rules' metadata.
    pub dynamic_metadata: bool,
}

/// Where the service's rules come from.
///
/// ```
/// use sluice_config::RulesFrom;
/// let service = sluice_config::parse("rules: {url: http://127.0.0.1:8083}\n")?.service.unwrap();
/// assert!(matches!(service.rules, RulesFrom::Service(ref remote) if remote.url == "http://127.0.0.1:8083"));
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub enum RulesFrom {
    /// A file or directory, watched for changes.
    Files {
        /// The file or directory (relative paths resolved against the config's directory).
        path: std::path::PathBuf,
        /// How they are read (`merge_domains`).
        options: sluice_descriptors::LoadOptions,
        /// The rules, loaded and checked.
        loaded: std::sync::Arc<LoadedRules>,
    },
    /// A rules service, polled.
    Service(Box<RulesService>),
}

/// `rules: {url, poll, timeout, token, snapshot}`: a rules service the host polls.
///
/// ```
/// use sluice_config::RulesFrom;
/// let file = "rules: {url: http://127.0.0.1:8083, poll: 2s}\n";
/// let Some(RulesFrom::Service(remote)) = sluice_config::parse(file)?.service.map(|s| s.rules) else {
///     unreachable!()
/// };
/// assert_eq!(remote.poll, std::time::Duration::from_secs(2));
/// assert_eq!(remote.source.authority(), "127.0.0.1:8083");
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct RulesService {
    /// The service's URL, as written.
    pub url: String,
    /// The client: address, token, timeout.
    pub source: sluice_rules_client::RulesSource,
    /// How often it is asked for a change.
    pub poll: Duration,
    /// The file the last good rules are kept in, to start from when the service is down.
    pub snapshot: std::path::PathBuf,
}

/// The rules' poll period when `rules.poll` is left out.
///
/// ```
/// use sluice_config::RulesFrom;
/// let file = "rules: {url: http://127.0.0.1:8083}\n";
/// let Some(RulesFrom::Service(remote)) = sluice_config::parse(file)?.service.map(|s| s.rules) else {
///     unreachable!()
/// };
/// assert_eq!(remote.poll, sluice_config::DEFAULT_RULES_POLL);
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub const DEFAULT_RULES_POLL: Duration = Duration::from_secs(10);

/// The snapshot file, beside the config, when `rules.snapshot` is left out.
///
/// ```
/// use std::path::Path;
/// use sluice_config::RulesFrom;
/// let file = "rules: {url: http://127.0.0.1:8083}\n";
/// let in_etc = sluice_config::parse_in(file, Some(Path::new("/etc/sluice")))?;
/// let Some(RulesFrom::Service(remote)) = in_etc.service.map(|s| s.rules) else { unreachable!() };
/// assert_eq!(remote.snapshot, Path::new("/etc/sluice").join(sluice_config::DEFAULT_RULES_SNAPSHOT));
/// # Ok::<(), sluice_config::ConfigError>(())
/// ```
pub const DEFAULT_RULES_SNAPSHOT: &str = "sluice-rules-snapshot.json";

/// The environment variable that sets `rules.token` (as [`env_name`] names every key's),
/// over the file's.
///
/// ```
/// assert_eq!(sluice_config::RULES_TOKEN_ENV, sluice_config::env_name("rules.token"));
/// ```
pub const RULES_TOKEN_ENV: &str = "SLUICE_RULES_TOKEN";

/// Loaded descriptor rules (a newtype so settings print without every rule).
///
/// ```
/// use sluice_config::LoadedRules;
/// let loaded = LoadedRules(sluice_descriptors::RuleSet::default());
/// assert_eq!(format!("{loaded:?}"), "0 rules");
/// ```
pub struct LoadedRules(pub sluice_descriptors::RuleSet);

impl std::fmt::Debug for LoadedRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} rules", self.0.len())
    }
}
