//! The `specd` command line.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use specd::{draft, generate, health, serve};

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
    Serve(Box<serve::ServeArgs>),
    /// Ask a specd server whether it is serving (exit status 0 when it is), for health probes.
    Health(health::HealthArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let serve_args = match &cli.command {
        Command::Serve(args) => Some(&**args),
        _ => None,
    };
    // Flushes buffered spans when dropped, after the command returned.
    let _telemetry = serve::init_telemetry(serve_args)?;
    match cli.command {
        Command::Generate(args) => generate::run(args),
        Command::Draft(args) => draft::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Health(args) => health::run(args),
    }
}
