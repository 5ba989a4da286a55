//! The `provisioner` binary (contract: `shared/spec/cli.md`).
//!
//! Exit codes: 0 success, 1 a failure at run time (including a simulation that broke an
//! invariant), 2 bad usage or input.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use provisioner::sim::{self, Scenario};

#[derive(Parser)]
#[command(name = "provisioner", version, about = "A machine provisioner built from actix actors")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a scenario file against the simulated cloud and model on virtual time.
    Simulate {
        /// The scenario (`.toml` or `.json`).
        file: PathBuf,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Print the JSON report instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Print a random scenario (what the property test runs), to reproduce a failing seed.
    GenerateScenario {
        /// The seed that picks the scenario.
        #[arg(long)]
        seed: u64,
    },
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PROVISIONER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::Simulate { file, seed, json } => {
            let scenario = match Scenario::load(&file) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            let report = sim::run(&scenario, seed);
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_human());
            }
            if report.violations.is_empty() {
                ExitCode::SUCCESS
            } else {
                eprintln!("error: the run broke {} invariant(s); see violations", report.violations.len());
                ExitCode::from(1)
            }
        }
        Command::GenerateScenario { seed } => {
            print!("{}", sim::generate(seed).to_toml());
            ExitCode::SUCCESS
        }
    }
}
