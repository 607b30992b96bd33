//! One module per subcommand. Each exposes `Args` (clap) and `main(Args) -> anyhow::Result<()>`.

pub mod chaos;
pub mod demo;
pub mod run;
pub mod sample;
pub mod status;
pub mod swarm;
pub mod train;

/// Logs go to stderr; `RUST_LOG` overrides the default level (`info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
