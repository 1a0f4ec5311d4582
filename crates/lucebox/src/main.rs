//! `lucebox`: the command-line entry point. It parses flags, composes the library crates and
//! reports errors as one line.

mod batch_bench;
mod bench;
mod doctor;
mod fetch;
mod generate;
mod health_gate;
mod load;
mod pair;
mod serve;
mod serve_bench;
mod spec_bench;
mod spec_replay;
mod toml_text;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "lucebox",
    version,
    about = "Speculative-decoding LLM inference server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Download pinned models into the cache and verify their sha256.
    Fetch(fetch::FetchArgs),
    /// Stream a continuation of a prompt.
    Generate(generate::GenerateArgs),
    /// Measure prefill and decode throughput.
    Bench(bench::BenchArgs),
    /// Check that a drafter may serve a target, and write a record of the verdict.
    VerifyPair(pair::VerifyPairArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Report this machine's CPU, GPUs and runtime against the chip profile, and its models.
    Doctor(doctor::DoctorArgs),
    /// Probe the local server and keep, commit or roll back the running NixOS generation.
    HealthGate(health_gate::HealthGateArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fetch(args) => fetch::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Bench(args) => bench::run(args),
        Command::VerifyPair(args) => pair::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::HealthGate(args) => health_gate::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lucebox: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
