//! What a peer shows over HTTP: a status page (`--http`) and Prometheus metrics
//! (`--metrics-addr`), both served from memory by the peer itself.
//!
//! - [`board`]: the latest status and the bounded loss / `val_bpb` curves, fed by the peer
//!   as it writes `status.json`;
//! - [`prom`]: `/metrics`, the status in the OpenMetrics text format (prometheus-client);
//! - [`http`]: the read-only HTTP/1 server (hyper), bounded, GET only; it serves
//!   `page.html` (one self-contained file, plots drawn as SVG by its script) and the JSON
//!   it polls, `/api/status` and `/api/history`.

pub mod board;
pub mod consensus;
pub mod http;
pub mod prom;

use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::task::JoinSet;

pub use board::Board;

use crate::rundir::status::Endpoints;

/// A server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    #[error("cannot listen on {addr} for {what}: {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
}

/// Where to serve (each `None`: not served).
#[derive(Debug, Clone, Copy, Default)]
pub struct WebOptions {
    /// The status page, its JSON and `/metrics`.
    pub http: Option<SocketAddr>,
    /// `/metrics` alone.
    pub metrics: Option<SocketAddr>,
}

/// The running servers; they stop when [`Servers::shutdown`] is called or this is dropped.
#[derive(Debug)]
pub struct Servers {
    /// The bound addresses (port 0 resolved), also set on the board.
    pub endpoints: Endpoints,
    tasks: JoinSet<()>,
}

impl Servers {
    /// Stops accepting and ends every open connection.
    pub async fn shutdown(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Binds the servers `opts` asks for, serving `board`, and records their addresses on it.
pub async fn start(opts: WebOptions, board: &Board) -> Result<Servers, WebError> {
    let mut tasks = JoinSet::new();
    let mut endpoints = Endpoints::default();
    if let Some(addr) = opts.http {
        let bound = bind(&mut tasks, addr, "the status page", board, http::Routes::Page).await?;
        tracing::info!(url = %format!("http://{bound}/"), "status page");
        endpoints.http_addr = Some(bound.to_string());
    }
    if let Some(addr) = opts.metrics {
        let bound = bind(&mut tasks, addr, "metrics", board, http::Routes::Metrics).await?;
        tracing::info!(url = %format!("http://{bound}/metrics"), "metrics");
        endpoints.metrics_addr = Some(bound.to_string());
    }
    board.set_endpoints(endpoints.clone());
    Ok(Servers { endpoints, tasks })
}

async fn bind(
    tasks: &mut JoinSet<()>,
    addr: SocketAddr,
    what: &'static str,
    board: &Board,
    routes: http::Routes,
) -> Result<SocketAddr, WebError> {
    let err = |source| WebError::Bind { what, addr, source };
    let listener = TcpListener::bind(addr).await.map_err(err)?;
    let bound = listener.local_addr().map_err(err)?;
    if !bound.ip().is_loopback() {
        tracing::warn!(
            addr = %bound,
            "{what} is public: anyone who can reach this address can read it (read-only)"
        );
    }
    tasks.spawn(http::serve(listener, board.clone(), routes));
    Ok(bound)
}
