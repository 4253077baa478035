//! `sluice rules`: the rules service on a store in a file (by default `sluice-rules.db` in
//! the working directory) or in PostgreSQL (`--db postgres://...`), and the store's bulk
//! import and export in envoy ratelimit's format.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_rules::{PostgresStore, RuleStore, RulesApi, SqliteStore, StoreError, Tokens};

/// `sluice rules` and its subcommands.
#[derive(Debug, clap::Args)]
pub struct RulesArgs {
    /// The store: an SQLite database file, or a PostgreSQL URL (`postgres://user@host/db`)
    /// that several rules services may share.
    #[arg(
        long,
        value_name = "FILE|URL",
        default_value = "sluice-rules.db",
        global = true
    )]
    pub db: String,
    /// The address the API listens on. Without --tokens only a loopback address is allowed.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8083")]
    pub listen: SocketAddr,
    /// The tokens file: one `NAME SCOPE TOKEN` a line (SCOPE read or write; TOKEN the secret
    /// or `sha256:HEX`); default: the file SLUICE_RULES_SERVICE_TOKENS names, if set. Without tokens
    /// everyone on this host may read and write.
    #[arg(long, value_name = "FILE")]
    pub tokens: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM, leaf first; re-read when it changes).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates issued by this CA (PEM): mTLS.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// With --tls-client-ca: a DNS name a client certificate may have (repeat for more).
    #[arg(long, value_name = "NAME", requires = "tls_client_ca")]
    pub tls_allow: Vec<String>,
    /// What to do instead of serving.
    #[command(subcommand)]
    pub action: Option<RulesAction>,
}

/// The store's bulk operations.
#[derive(Debug, clap::Subcommand)]
pub enum RulesAction {
    /// Store the domains of a rules file, or of a directory of them (created, or replaced).
    Import {
        /// A rules file, or a directory of `*.yaml` files.
        path: PathBuf,
    },
    /// Print a domain's rules file.
    Export {
        /// The domain.
        domain: String,
    },
}

/// Runs `sluice rules`.
pub fn run(args: RulesArgs) -> Result<(), String> {
    if args.db.starts_with("postgres://") || args.db.starts_with("postgresql://") {
        // The URL may hold a password: errors name the option, not its value.
        let store = PostgresStore::connect(&args.db).map_err(|e| format!("--db: {e}"))?;
        on(store, args)
    } else {
        let store = SqliteStore::open(args.db.as_ref()).map_err(|e| format!("{}: {e}", args.db))?;
        on(store, args)
    }
}

fn on<S: RuleStore + Send + Sync + 'static>(store: S, args: RulesArgs) -> Result<(), String> {
    match args.action {
        Some(RulesAction::Import { path }) => import(&store, &path),
        Some(RulesAction::Export { domain }) => {
            let record = store.get(&domain).map_err(|e| e.to_string())?;
            print!("{}", record.text);
            Ok(())
        }
        None => serve(store, &args),
    }
}

fn import(store: &impl RuleStore, path: &Path) -> Result<(), String> {
    let files = rule_files(path)?;
    // Every file checked before anything is stored.
    let mut texts = Vec::with_capacity(files.len());
    for file in &files {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let domain =
            sluice_descriptors::parse_domain(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        texts.push((domain.name().to_owned(), text));
    }
    let who = format!(
        "import by {}",
        std::env::var("USER").unwrap_or_else(|_| "a local user".into())
    );
    for (domain, text) in texts {
        let record = match store.create(&text, &who) {
            Err(StoreError::Exists(_)) => store.replace(&domain, &text, None, &who),
            other => other,
        }
        .map_err(|e| format!("{domain}: {e}"))?;
        println!("{domain}: revision {}", record.revision);
    }
    Ok(())
}

fn rule_files(path: &Path) -> Result<Vec<PathBuf>, String> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|file| file.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    Ok(files)
}

fn serve<S: RuleStore + Send + Sync + 'static>(store: S, args: &RulesArgs) -> Result<(), String> {
    crate::init_logging(None);
    let from_env = std::env::var_os("SLUICE_RULES_SERVICE_TOKENS").map(PathBuf::from);
    let tokens = match args.tokens.as_ref().or(from_env.as_ref()) {
        Some(file) => std::fs::read_to_string(file)
            .map_err(|e| format!("{}: {e}", file.display()))?
            .parse::<Tokens>()
            .map_err(|e| format!("{}: {e}", file.display()))?,
        None => Tokens::default(),
    };
    if tokens.is_empty() && !args.listen.ip().is_loopback() {
        return Err(format!(
            "--listen {}: without --tokens the rules service listens on a loopback address only",
            args.listen
        ));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async {
        let shutdown = crate::shutdown_signal()?;
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .map_err(|e| format!("--listen {}: {e}", args.listen))?;
        let bound = listener.local_addr().map_err(|e| e.to_string())?;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => {
                let settings = crate::config::TlsSettings {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: args.tls_client_ca.clone(),
                    allow: args.tls_allow.clone(),
                };
                let tls =
                    crate::tls::ServerTls::start(&settings, crate::tls::Protocol::Http1, stopping.clone())
                        .map_err(|e| format!("--tls-cert: {e}"))?;
                Some(tls)
            }
            _ => None,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        println!("rules listening on {scheme}://{bound}/");
        let db = if args.db.contains("://") {
            "postgres"
        } else {
            args.db.as_str()
        };
        tracing::info!(db, tokens = !tokens.is_empty(), "rules service");
        let api = RulesApi::new(Arc::new(store), tokens);
        let shutdown = async move {
            shutdown.await;
            stop.send_replace(true);
        };
        let served = match tls {
            None => api.serve(listener, shutdown).await,
            Some(tls) => {
                let listener =
                    crate::tls::TlsListener::new(listener, tls, stopping).map_err(|e| e.to_string())?;
                axum::serve(listener, api.router())
                    .with_graceful_shutdown(shutdown)
                    .await
            }
        };
        served.map_err(|e| e.to_string())
    })
}
