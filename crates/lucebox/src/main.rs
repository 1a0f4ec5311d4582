//! `lucebox`: the command-line entry point. It parses flags, composes the library crates and
//! reports errors as one line.

mod fetch;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "lucebox", version, about = "Speculative-decoding LLM inference server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Download pinned models into the cache and verify their sha256.
    Fetch(fetch::FetchArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fetch(args) => fetch::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lucebox: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
