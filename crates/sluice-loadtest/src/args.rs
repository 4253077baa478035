//! The command-line arguments of `sluice loadtest`.

use std::path::PathBuf;
use std::time::Duration;

use crate::LoadtestError;

/// Connections per profile unless a profile or `--connections` says otherwise.
///
/// ```
/// assert!(sluice_loadtest::DEFAULT_CONNECTIONS <= sluice_loadtest::MAX_CONNECTIONS);
/// ```
pub const DEFAULT_CONNECTIONS: u32 = 4;

/// The most connections one profile may have.
///
/// ```
/// assert_eq!(sluice_loadtest::MAX_CONNECTIONS, 10_000);
/// ```
pub const MAX_CONNECTIONS: u32 = 10_000;

/// The longest trial.
///
/// ```
/// assert_eq!(sluice_loadtest::MAX_DURATION.as_secs(), 86_400);
/// ```
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Arguments of `sluice loadtest`, to be flattened into a subcommand.
///
/// # Example
/// ```
/// use clap::Parser;
/// #[derive(Parser)]
/// struct Cli {
///     #[command(flatten)]
///     loadtest: sluice_loadtest::Args,
/// }
/// let cli = Cli::try_parse_from(["sluice", "--url", "http://127.0.0.1:8080/", "--duration", "2s"])?;
/// assert_eq!(cli.loadtest.duration, std::time::Duration::from_secs(2));
/// assert_eq!(cli.loadtest.profiles, "demo");
/// # Ok::<(), clap::Error>(())
/// ```
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// The server to load, e.g. http://127.0.0.1:8080/
    #[arg(
        long,
        value_name = "URL",
        required_unless_present = "spawn",
        conflicts_with = "spawn"
    )]
    pub url: Option<String>,
    /// Start `sluice serve --listen 127.0.0.1:0` and load it; it is stopped at the end.
    #[arg(long)]
    pub spawn: bool,
    /// Config file passed to the spawned server (`sluice serve --config FILE`).
    #[arg(long, value_name = "FILE", requires = "spawn")]
    pub config: Option<PathBuf>,
    /// `demo` (twelve profiles against the built-in demo's accounts) or a YAML file of
    /// profiles.
    #[arg(long, value_name = "demo|FILE", default_value = "demo")]
    pub profiles: String,
    /// Length of each trial, e.g. 10s, 500ms, 2min.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = sluice::parse_duration)]
    pub duration: Duration,
    /// Trials run one after the other.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub trials: u32,
    /// Keep-alive connections per profile [default: the profile's own, else 4].
    #[arg(long, value_name = "N")]
    pub connections: Option<u32>,
    /// Start of each trial left out of the steady allow rate (the cold start: burst, failsafe
    /// quota during the quota fetch).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = sluice::parse_duration)]
    pub settle: Duration,
    /// Directory for results.tsv, rates.png and latencies.png.
    #[arg(long, value_name = "DIR", default_value = "loadtest-results")]
    pub out: PathBuf,
    /// No progress bar (there is none either when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
}

impl Args {
    /// Checks what clap cannot: ranges and the relation between arguments.
    ///
    /// ```
    /// use clap::Parser;
    /// #[derive(Parser)]
    /// struct Cli {
    ///     #[command(flatten)]
    ///     loadtest: sluice_loadtest::Args,
    /// }
    /// let cli = Cli::try_parse_from(["sluice", "--spawn", "--duration", "1s", "--settle", "2s"])?;
    /// let err = cli.loadtest.validate().unwrap_err();
    /// assert_eq!(err.to_string(), "--settle: must be shorter than --duration");
    /// # Ok::<(), clap::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`LoadtestError::Argument`] naming the argument.
    pub fn validate(&self) -> Result<(), LoadtestError> {
        let bad = |argument, reason: &str| {
            Err(LoadtestError::Argument {
                argument,
                reason: reason.into(),
            })
        };
        if self.trials == 0 {
            return bad("--trials", "must be at least 1");
        }
        if self
            .connections
            .is_some_and(|c| !(1..=MAX_CONNECTIONS).contains(&c))
        {
            return bad("--connections", "must be from 1 to 10000");
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return bad("--duration", "must be longer than 0 and at most 24h");
        }
        if self.settle >= self.duration {
            return bad("--settle", "must be shorter than --duration");
        }
        if self.url.is_none() && !self.spawn {
            return bad("--url", "give --url URL or --spawn");
        }
        Ok(())
    }
}
