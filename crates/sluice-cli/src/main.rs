//! `sluice`: a rate-limited HTTP server (`serve`), a config checker (`validate`) and a load
//! generator (`loadtest`).

mod admin;
mod app;
mod connection;
mod limits;
mod metrics;
mod protocols;
mod reload;
mod rules;
mod server;
mod service;
mod tls;
mod traces;
mod upstream;
mod watch;

use std::io::IsTerminal as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sluice_config as config;
use tracing::level_filters::LevelFilter;

/// Exact, fast, bounded rate limiting.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve HTTP: `Hello World!` (200) or `Exceeded quota` (429), limited per key.
    ///
    /// Without --config, runs the built-in demo (X-Account-ID keys, alice..eve,
    /// admin@example.com bypassing). Prints `listening on http://ADDR` once listening;
    /// logs go to stderr (level from SLUICE_LOG: error, warn, info, debug; default info).
    Serve(ServeArgs),
    /// Check a config file and exit: 0 if it is valid, 1 with the field at fault if not.
    Validate {
        /// The YAML config file.
        file: PathBuf,
        /// Print the settings in effect: the file's, the environment's (`SLUICE_*`) over
        /// them, and every default, secrets masked.
        #[arg(long)]
        show: bool,
    },
    /// Load a server with concurrent user profiles (by default, the demo's twelve).
    ///
    /// Writes results.tsv, rates.png and latencies.png to --out and prints a verdict per
    /// profile; exits 1 if a profile failed. With --spawn it starts `sluice serve` itself.
    Loadtest(sluice_loadtest::Args),
    /// Serve the rules store's API (JSON, ETag/If-Match, bearer tokens), or import and export
    /// its domains in envoy ratelimit's format.
    ///
    /// Prints `rules listening on http://ADDR/` once listening.
    Rules(rules::RulesArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The YAML config file, reloaded when it changes (default: the built-in demo).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The address to listen on (overrides the config's `listen`; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Serving threads, each with its own event loop and listener (default: one per core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Share limits with every server on this Redis (sets or overrides the config's
    /// `redis.url`), e.g. redis://127.0.0.1:6379.
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Validate { file, show } => validate(&file, show),
        Command::Loadtest(args) => loadtest(&args),
        Command::Rules(args) => rules::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("sluice: {message}");
            ExitCode::FAILURE
        }
    }
}

fn validate(file: &std::path::Path, show: bool) -> Result<(), String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: file: {e}", file.display()))?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| format!("{}: file: not UTF-8 text", file.display()))?;
    let env = |name: &str| std::env::var(name).ok();
    let (settings, from_env) =
        config::parse_with_env(text, file.parent(), &env).map_err(|e| format!("{}: {e}", file.display()))?;
    // The limit `serve` would use here, with this process's descriptor limit.
    let connections = limits::ConnectionLimit::new(settings.max_connections);
    println!("{}: ok; {connections}", file.display());
    if show {
        for from in &from_env {
            println!("# {} set by {}", from.path, from.variable);
        }
        println!("{:#?}", masked(settings));
    }
    Ok(())
}

/// `settings` with the secrets they hold masked: a Redis URL's user and password (the rules
/// token is kept masked by its client).
fn masked(mut settings: config::Settings) -> config::Settings {
    fn mask(url: &str) -> String {
        match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme + 3 => format!("{}***{}", &url[..scheme + 3], &url[at..]),
            _ => url.to_owned(),
        }
    }
    if let Some(redis) = settings.limiter.redis.as_mut() {
        redis.url = redis.url.as_deref().map(mask);
        redis.cluster = redis.cluster.iter().map(|url| mask(url)).collect();
    }
    settings
}

fn loadtest(args: &sluice_loadtest::Args) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    // --spawn starts this very executable as the server.
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the sluice executable: {e}"))?;
    let report = runtime
        .block_on(sluice_loadtest::run(args, Some(&exe)))
        .map_err(|e| e.to_string())?;
    print!("{report}");
    if report.passed() {
        Ok(())
    } else {
        Err("loadtest: not every profile passed (see the summary above)".into())
    }
}

fn serve(args: ServeArgs) -> Result<(), String> {
    let (settings, config_file) = match args.config {
        Some(file) => {
            let (settings, bytes) =
                config::load_with_bytes(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            (settings, Some((file, bytes)))
        }
        // Settings from the environment alone: a real service, not the demo.
        None if config::ENV_KEYS.iter().any(|key| {
            let name = config::env_name(key);
            std::env::var_os(&name).is_some() || std::env::var_os(format!("{name}_FILE")).is_some()
        }) =>
        {
            let settings = config::parse("{}").map_err(|e| format!("environment: {e}"))?;
            (settings, None)
        }
        None => {
            let settings =
                config::parse(config::DEFAULT_CONFIG).map_err(|e| format!("built-in config: {e}"))?;
            (settings, None)
        }
    };
    let settings = match &args.redis {
        Some(url) => config::with_redis_url(settings, url).map_err(|e| e.to_string())?,
        None => settings,
    };
    let threads = match args.threads {
        Some(0) => return Err("--threads: must be at least 1".into()),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    // This thread's runtime; `serve` starts one more per extra thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let traces = match &settings.otlp {
        Some(otlp) => {
            let _runtime = runtime.enter();
            Some(traces::start(otlp)?)
        }
        None => None,
    };
    let (traces, export) = traces.unzip();
    init_logging(export);
    let options = server::ServeOptions {
        settings,
        config_file,
        listen: args.listen,
        redis_url: args.redis,
    };
    runtime.block_on(async {
        let signals = StopSignals::install()?;
        let served = server::serve(options, threads, signals)
            .await
            .map_err(|e| e.to_string());
        if let Some(traces) = traces {
            traces.flush().await;
        }
        served
    })
}

/// Logs to stderr (`SLUICE_LOG`, `SLUICE_LOG_FORMAT`), and beside them the trace exporter's
/// layer if traces are on.
pub(crate) fn init_logging(export: Option<traces::ExportLayer>) {
    let level = std::env::var("SLUICE_LOG")
        .ok()
        .and_then(|l| l.parse::<LevelFilter>().ok())
        .unwrap_or(LevelFilter::INFO);
    let format = std::env::var("SLUICE_LOG_FORMAT").unwrap_or_default();
    // One JSON object a line, for a log pipeline.
    let json = format.eq_ignore_ascii_case("json");
    match export {
        None => {
            // The subscriber as it always was: a span the exporter would see is never enabled.
            let logs = tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_max_level(level);
            if json {
                logs.json().init();
            } else {
                logs.with_ansi(std::io::stderr().is_terminal()).init();
            }
        }
        Some(export) => {
            use tracing_subscriber::layer::SubscriberExt;
            use tracing_subscriber::util::SubscriberInitExt;
            use tracing_subscriber::{Layer, fmt};
            let logs = fmt::layer().with_writer(std::io::stderr);
            let logs = if json {
                logs.json().with_filter(level).boxed()
            } else {
                (logs.with_ansi(std::io::stderr().is_terminal()))
                    .with_filter(level)
                    .boxed()
            };
            tracing_subscriber::registry().with(vec![logs, export]).init();
        }
    }
    if !json && !format.is_empty() && !format.eq_ignore_ascii_case("text") {
        tracing::warn!("SLUICE_LOG_FORMAT={format:?}: not json or text; logging text");
    }
}

/// Which signal asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// SIGTERM, as an orchestrator sends it: drain first.
    Terminate,
    /// SIGINT (Ctrl-C): stop accepting at once.
    Interrupt,
}

impl Stop {
    /// The exit status of a process a second signal stops at once (128 + its number).
    pub(crate) fn exit_code(self) -> i32 {
        match self {
            Stop::Terminate => 143,
            Stop::Interrupt => 130,
        }
    }
}

/// The signals that stop the process. Installed before the server says it is listening, so a
/// signal sent right after that line is not missed.
pub(crate) struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    #[cfg(unix)]
    pub(crate) fn install() -> Result<Self, String> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?,
            terminate: signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?,
        })
    }

    #[cfg(not(unix))]
    pub(crate) fn install() -> Result<Self, String> {
        Ok(Self {})
    }

    /// The next signal.
    #[cfg(unix)]
    pub(crate) async fn next(&mut self) -> Stop {
        tokio::select! {
            _ = self.interrupt.recv() => Stop::Interrupt,
            _ = self.terminate.recv() => Stop::Terminate,
        }
    }

    /// The next Ctrl-C.
    #[cfg(not(unix))]
    pub(crate) async fn next(&mut self) -> Stop {
        let _ = tokio::signal::ctrl_c().await;
        Stop::Interrupt
    }
}

/// A future that completes on SIGINT or SIGTERM.
pub(crate) fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    let mut signals = StopSignals::install()?;
    Ok(async move {
        signals.next().await;
    })
}
