//! One module per subcommand. Each exposes `Args` (clap) and `main(Args) -> anyhow::Result<()>`.

pub mod baseline;
pub mod chaos;
pub mod demo;
pub mod doctor;
pub mod run;
pub mod sample;
pub mod status;
pub mod swarm;
pub mod swarm_table;
pub mod train;

/// Logs go to stderr; `RUST_LOG` overrides the default level (`info`).
pub fn init_tracing() {
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // libp2p's "dropping inbound stream" lines name no peer, so they cannot be throttled per
    // offender: an outsider could decide how much is written to disk.
    for d in atoll_net::blob::wire::QUIET_LOG_DIRECTIVES {
        if let Ok(d) = d.parse() {
            filter = filter.add_directive(d);
        }
    }
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
