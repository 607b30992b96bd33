//! The HTTP/1 server behind `--http` and `--metrics-addr`: read-only, GET and HEAD only,
//! bounded in connections, header size and connection lifetime.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::board::Board;
use super::prom;

/// Connections served at once per server; more are closed at once (a browser polling
/// the page holds one or two).
pub const MAX_CONNECTIONS: usize = 32;
/// Longest wait for a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of a connection (keep-alive included); a browser simply reconnects.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
/// Read buffer of a connection, which bounds a request's headers (hyper's minimum).
const MAX_BUF: usize = 8 * 1024;
/// Most headers in a request.
const MAX_HEADERS: usize = 64;
/// Pause after a failed accept (e.g. out of file descriptors) before the next.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The page: HTML, CSS and JS in one file, no external resources.
const PAGE: &str = include_str!("page.html");
/// Nothing but this origin: the page loads no outside resource and talks only to its peer.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'";

/// What a server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// The status page, its JSON API and `/metrics`.
    Page,
    /// `/metrics` only.
    Metrics,
}

/// Accepts connections until the task is aborted (which drops and so ends every
/// connection it serves).
pub async fn serve(listener: TcpListener, board: Board, routes: Routes) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match slots.clone().try_acquire_owned() {
                    Ok(permit) => {
                        connections.spawn(connection(stream, board.clone(), routes, permit));
                    }
                    // Full: the connection is closed unanswered.
                    Err(_) => drop(stream),
                },
                Err(e) => {
                    tracing::debug!(error = %e, "cannot accept an HTTP connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn connection(stream: TcpStream, board: Board, routes: Routes, _slot: OwnedSemaphorePermit) {
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let response = respond(&board, routes, req.method(), req.uri().path());
        async move { Ok::<_, Infallible>(response) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BUF)
        .max_headers(MAX_HEADERS)
        .serve_connection(TokioIo::new(stream), service);
    // A connection past its lifetime is dropped, which closes it.
    if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
        tracing::trace!(error = %e, "HTTP connection ended");
    }
}

/// The answer to a request (the body is never read: every route is a GET).
pub fn respond(
    board: &Board,
    routes: Routes,
    method: &Method,
    path: &str,
) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET or HEAD only\n");
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match (routes, path) {
        (_, "/metrics") => match prom::encode(board) {
            Ok(text) => reply(StatusCode::OK, prom::CONTENT_TYPE, text),
            Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "cannot encode\n"),
        },
        (Routes::Page, "/" | "/index.html") => {
            let mut r = reply(StatusCode::OK, "text/html; charset=utf-8", PAGE);
            r.headers_mut().insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
            r
        }
        (Routes::Page, "/api/status") => match board.page_status_json() {
            Some(Ok(json)) => reply(StatusCode::OK, "application/json", json),
            Some(Err(_)) => {
                reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "cannot encode\n")
            }
            None => reply(StatusCode::SERVICE_UNAVAILABLE, "application/json", "null"),
        },
        (Routes::Page, "/api/history") => match board.with_history(serde_json::to_vec) {
            Ok(json) => reply(StatusCode::OK, "application/json", json),
            Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "cannot encode\n"),
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use atoll_net::NetStats;

    #[test]
    fn only_reads_are_answered_and_unknown_paths_are_not_found() {
        let board = Board::new();
        let code = |routes, m: Method, p| respond(&board, routes, &m, p).status();
        assert_eq!(code(Routes::Page, Method::POST, "/"), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(code(Routes::Page, Method::DELETE, "/metrics"), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(code(Routes::Page, Method::GET, "/"), StatusCode::OK);
        assert_eq!(code(Routes::Page, Method::HEAD, "/"), StatusCode::OK);
        assert_eq!(code(Routes::Page, Method::GET, "/api/status"), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(code(Routes::Page, Method::GET, "/../etc/passwd"), StatusCode::NOT_FOUND);
        assert_eq!(code(Routes::Metrics, Method::GET, "/"), StatusCode::NOT_FOUND);
        assert_eq!(code(Routes::Metrics, Method::GET, "/metrics"), StatusCode::OK);
        board.set_status(true, NetStats::default(), None);
        assert_eq!(code(Routes::Page, Method::GET, "/api/status"), StatusCode::OK);
        assert_eq!(code(Routes::Page, Method::GET, "/api/history"), StatusCode::OK);
    }
}
