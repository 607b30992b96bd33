//! The `atoll` command line. Only the binary knows clap, anyhow and the tracing subscriber.

mod cmd;

use clap::{Parser, Subcommand};

/// atoll: a leaderless peer-to-peer trainer for language models.
#[derive(Debug, Parser)]
#[command(name = "atoll", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train one peer alone on the embedded corpus (or --data).
    Train(cmd::train::Args),
    /// Print text generated from the latest checkpoint of a run dir.
    Sample(cmd::sample::Args),
    /// Start a peer: join the swarm of a run (see --no-train for a pure bootstrap node).
    Run(cmd::run::Args),
    /// Run a local swarm: N peer processes on loopback training together.
    Demo(cmd::demo::Args),
    /// Run a local swarm under a seeded schedule of kills, restarts and pauses, and
    /// report goodput, uptime and loss against a failure-free run.
    Chaos(cmd::chaos::Args),
    /// Print the status of a running (or stopped) peer (--swarm: every peer of its run).
    Status(cmd::status::Args),
    /// Diagnose a peer from its run dir: what is wrong and what to do. Exits 1 when a
    /// problem was found, 2 when the run dir cannot be read.
    Doctor(cmd::doctor::Args),
    /// Synchronous DiLoCo in one process, on the demo's manifest, shards and seed: the
    /// quality reference of a swarm at equal tokens.
    Baseline(cmd::baseline::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    cmd::init_tracing();
    let result = match cli.command {
        Command::Train(args) => cmd::train::main(args),
        Command::Sample(args) => cmd::sample::main(args),
        Command::Run(args) => cmd::run::main(args),
        Command::Demo(args) => cmd::demo::main(args),
        Command::Chaos(args) => cmd::chaos::main(args),
        Command::Status(args) => cmd::status::main(args),
        Command::Doctor(args) => return cmd::doctor::main(args),
        Command::Baseline(args) => cmd::baseline::main(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
