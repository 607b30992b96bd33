//! `atoll run --http ADDR` and `--metrics-addr ADDR`: the status page and metrics servers
//! (see [`atoll::web`]).

use atoll::web::{self, Board};

use super::Args;

/// Starts the status page and metrics servers the flags ask for (none by default).
pub async fn start(args: &Args) -> anyhow::Result<(Option<Board>, Option<web::Servers>)> {
    if args.http.is_none() && args.metrics_addr.is_none() {
        return Ok((None, None));
    }
    let board = Board::new();
    let opts = web::WebOptions { http: args.http, metrics: args.metrics_addr };
    let servers = web::start(opts, &board).await?;
    if let Some(a) = &servers.endpoints.http_addr {
        println!("status page http://{a}/");
    }
    if let Some(a) = &servers.endpoints.metrics_addr {
        println!("metrics http://{a}/metrics");
    }
    Ok((Some(board), Some(servers)))
}
