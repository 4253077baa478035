//! # sluice-loadtest: does a rate-limited server grant each user what it should?
//!
//! The engine of `sluice loadtest`. Simulated users
//! (*profiles*: an account header and the rate it should get) load a server concurrently, each
//! over its own keep-alive HTTP/1.1 connections, for a number of trials. Every 200 counts as
//! allowed, every 429 as denied, anything else as an error. The results are:
//!
//! - `results.tsv`: one line per profile and trial (allowed, denied, rates, latency
//!   percentiles in µs, the expected rate, the error in percent and the cold-start split; see
//!   [`TrialRow`]);
//! - `rates.png` and `latencies.png`;
//! - a [`Report`] whose `Display` is the summary printed by the CLI, with a [`Grade`] per
//!   profile: `PASS` when its steady allow rate is within 1% (or 1 request) of the expected rate.
//!
//! The server is a URL (`--url`) or a `sluice serve` started for the run (`--spawn`).
//!
//! ```no_run
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     loadtest: sluice_loadtest::Args,
//! }
//! # async fn demo() -> Result<(), sluice_loadtest::LoadtestError> {
//! let cli = Cli::parse_from(["sluice", "--spawn", "--duration", "10s", "--trials", "2"]);
//! let exe = std::env::current_exe().ok();
//! let report = sluice_loadtest::run(&cli.loadtest, exe.as_deref()).await?;
//! print!("{report}");
//! std::process::exit(if report.passed() { 0 } else { 1 });
//! # }
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod args;
mod chart;
mod error;
mod generator;
mod http;
mod profile;
mod report;
mod target;

use std::io::IsTerminal;
use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

pub use args::{Args, DEFAULT_CONNECTIONS, MAX_CONNECTIONS, MAX_DURATION};
pub use error::LoadtestError;
pub use profile::{
    Account, DEFAULT_HEADER_NAME, DEMO_FAILSAFE_POOL, Expected, Profile, ProfileSet, UNIQUE_PLACEHOLDER,
};
pub use report::{Grade, Latencies, ProfileSummary, Report, TSV_COLUMNS, TrialRow};

use generator::Plan;
use target::{SpawnedServer, Target};

/// Runs the load test `args` describes and writes its files to `args.out`.
///
/// `server_exe` is the `sluice` executable that `--spawn` starts (`<exe> serve --listen
/// 127.0.0.1:0 [--config FILE]`); the server is stopped when the run ends, also on error.
///
/// # Errors
/// [`LoadtestError`], naming the argument, file or field at fault. Requests that fail during
/// the run are not errors of the run: they are counted per profile in the report.
pub async fn run(args: &Args, server_exe: Option<&Path>) -> Result<Report, LoadtestError> {
    args.validate()?;
    let set = ProfileSet::load(&args.profiles)?;
    let server = if args.spawn {
        let exe = target::server_exe(server_exe)?;
        Some(SpawnedServer::start(&exe, args.config.as_deref()).await?)
    } else {
        None
    };
    let url = match (&server, &args.url) {
        (Some(server), _) => server.url.clone(),
        (None, Some(url)) => url.clone(),
        (None, None) => {
            return Err(LoadtestError::Argument {
                argument: "--url",
                reason: "give --url URL or --spawn".into(),
            });
        }
    };
    let measured = measure(args, &set, &url).await;
    if let Some(server) = server {
        server.stop().await;
    }
    let mut report = measured?;
    write_outputs(&mut report, &args.out)?;
    Ok(report)
}

async fn measure(args: &Args, set: &ProfileSet, url: &str) -> Result<Report, LoadtestError> {
    let target = Target::resolve(url).await?;
    target.check_reachable().await?;
    // Before the run, so a bad --out does not waste it.
    std::fs::create_dir_all(&args.out).map_err(|source| LoadtestError::Write {
        path: args.out.clone(),
        source,
    })?;
    let plan = Plan {
        duration: args.duration,
        trials: args.trials,
        connections: set
            .profiles
            .iter()
            .map(|p| args.connections.or(p.connections).unwrap_or(DEFAULT_CONNECTIONS))
            .collect(),
    };
    tracing::info!(
        url,
        profiles = set.profiles.len(),
        trials = args.trials,
        duration = ?args.duration,
        "load test starting"
    );
    let progress = progress_bar(args);
    let trials = generator::run(&target, set, &plan, &progress).await;
    progress.finish_and_clear();
    Ok(Report::new(
        url.to_string(),
        args.duration,
        args.settle,
        &set.profiles,
        &trials,
    ))
}

fn progress_bar(args: &Args) -> ProgressBar {
    if args.no_progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let total = u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX) * u64::from(args.trials);
    let bar = ProgressBar::new(total);
    // The template is a constant known to be valid; fall back to the default style anyway.
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {percent:>3}% {msg}") {
        bar.set_style(style);
    }
    bar
}

fn write_outputs(report: &mut Report, out: &Path) -> Result<(), LoadtestError> {
    let write_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadtestError::Write { path, source }
    };
    let tsv = out.join("results.tsv");
    std::fs::write(&tsv, report.tsv()).map_err(write_error(&tsv))?;
    let rates = out.join("rates.png");
    chart::rates(report, &rates)?;
    let latencies = out.join("latencies.png");
    chart::latencies(report, &latencies)?;
    report.files = vec![tsv, rates, latencies];
    Ok(())
}
