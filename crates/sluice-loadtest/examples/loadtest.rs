//! `sluice loadtest` as a stand-alone program:
//!
//! ```sh
//! cargo run --release -p sluice-loadtest --example loadtest -- --url http://127.0.0.1:8080/ --trials 2
//! cargo run --release -p sluice-loadtest --example loadtest -- --spawn --sluice target/release/sluice
//! ```
//!
//! Prints the summary; exits 1 if a profile failed or a request had an error, 2 if the run
//! could not be made.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Load a rate-limited HTTP server with concurrent user profiles")]
struct Cli {
    #[command(flatten)]
    loadtest: sluice_loadtest::Args,
    /// The `sluice` executable that --spawn starts.
    #[arg(long, value_name = "PATH", default_value = "sluice")]
    sluice: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match sluice_loadtest::run(&cli.loadtest, Some(&cli.sluice)).await {
        Ok(report) => {
            print!("{report}");
            if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
