//! What can go wrong before, during or after a load test, each naming what was at fault.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Why a load test could not run or could not write its results.
///
/// # Example
/// ```
/// let e = sluice_loadtest::LoadtestError::Argument {
///     argument: "--trials",
///     reason: "must be at least 1".into(),
/// };
/// assert_eq!(e.to_string(), "--trials: must be at least 1");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// A command-line argument is out of range or inconsistent with another.
    #[error("{argument}: {reason}")]
    Argument {
        /// The argument at fault, e.g. `--settle`.
        argument: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The target URL cannot be used.
    #[error("--url {url}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `--spawn` was asked for but the caller gave no server executable.
    #[error("--spawn: no sluice executable to start was given")]
    NoServerExecutable,
    /// The server executable could not be started.
    #[error("--spawn: cannot start `{exe}`: {source}")]
    Spawn {
        /// The executable.
        exe: PathBuf,
        /// Why it did not start.
        source: io::Error,
    },
    /// The spawned server ended before it said where it listens.
    #[error("--spawn: `{exe}` exited ({status}) before printing `listening on http://ADDR`{stderr}")]
    ServerExited {
        /// The executable.
        exe: PathBuf,
        /// How it ended.
        status: ExitStatus,
        /// The last lines it wrote to stderr, prefixed with `: `, or empty.
        stderr: String,
    },
    /// The spawned server did not say where it listens in time.
    #[error("--spawn: `{exe}` printed no `listening on http://ADDR` line within {waited:?}")]
    ServerSilent {
        /// The executable.
        exe: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// The profiles file cannot be read.
    #[error("--profiles {path}: {source}")]
    ProfilesRead {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The profiles file is not valid YAML of the expected shape, or a value is out of range;
    /// the message names the field (e.g. `profiles[2].expected`).
    #[error("--profiles {path}: {message}")]
    ProfilesInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the field.
        message: String,
    },
    /// An output file or directory cannot be written.
    #[error("{path}: {source}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A chart could not be drawn.
    #[error("{path}: cannot draw chart: {reason}")]
    Chart {
        /// The PNG being drawn.
        path: PathBuf,
        /// The drawing library's error.
        reason: String,
    },
}
