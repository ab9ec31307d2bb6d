//! The `specd` command line.

mod bench;
mod device;
mod draft;
mod embedded_draft_model;
mod embedded_drafter;
mod embedded_mtp;
mod generate;
mod serve;
mod text;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "specd",
    version,
    about = "Distributed speculative decoding server and CLI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate from a prompt in this process (embedded mode); `run` is the same command.
    #[command(visible_alias = "run")]
    Generate(generate::GenerateArgs),
    /// Prefill with the target, then draft one block with a Gemma 4 assistant.
    Draft(draft::DraftArgs),
    /// Run a service: verifier, drafter or router.
    Serve(serve::ServeArgs),
    /// Compare plain, embedded speculative and split (gRPC) decoding on one checkpoint pair.
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SPECD_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Draft(args) => draft::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
    }
}
