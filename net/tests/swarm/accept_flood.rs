//! The accept path under a reconnect flood: raw TCP connections from one address, from 16
//! addresses of one /24, or from 16 addresses in 16 /16s, that never send a byte. Some are
//! held (up to 9 s, less than the node's handshake timeout), the rest are reset and
//! reopened at once. A newcomer from another network must still join (within the
//! condition deadline of 20 s; issue 21 asks 10 s, measured 0.05–0.15 s).
//!
//! The flood comes from 127.2.0.0/24 (and up to 127.17.0.0/24). The newcomer dials from
//! 127.0.0.1 whatever it listens on (libp2p binds its dials to 0.0.0.0 and the kernel picks
//! the source), so it is a /16 apart: the node caps pending handshakes per /24 too, and
//! keeps half its pending slots for /16s with none pending, so a newcomer inside the
//! flood's /24 is refused by design while that network is at its cap, and one inside a
//! flooding /16 while half the slots are taken.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atoll_net::{Node, PeerId};
use libp2p::multiaddr::Protocol;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::hygiene::start_with;
use crate::support::{stop_all, wait_until};

/// Connection attempts per second, all flood tasks together. Bounded so that the flood
/// itself does not take a loaded 2-core CI machine; the node's accept path pays for each.
const FLOOD_RATE: u64 = 3000;
/// Flood tasks; each connects in ticks of [`TICK`], yielding between them.
const WORKERS: u64 = 3;
const TICK: Duration = Duration::from_millis(10);
/// Sockets each source address holds open, silent (more than the node's per-host cap of
/// pending handshakes).
const HELD_PER_SOURCE: u64 = 16;
/// A held socket is reset after [`HOLD_MIN_MS`] plus up to [`HOLD_SPREAD_MS`] (1 to 9 s), unless the
/// node closes it first: the attacker lets go before the node's 10 s handshake timeout and
/// takes the slot again at once, so held slots never come free together.
const HOLD_MIN_MS: u64 = 1000;
const HOLD_SPREAD_MS: u64 = 8000;
/// A connect that the kernel does not complete within this long counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The flood must reach at least this rate (connects a second) for the test to mean anything.
const MIN_RATE: f64 = 300.0;
/// How long the flood runs before the newcomer starts.
const WARM_UP: Duration = Duration::from_secs(2);

/// What the flood achieved.
#[derive(Default)]
struct Tally {
    connected: AtomicU64,
    failed: AtomicU64,
    held: AtomicU64,
}

struct Flood {
    tally: Arc<Tally>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    started: Instant,
}

impl Flood {
    fn start(target: SocketAddr, sources: Vec<Ipv4Addr>) -> Self {
        let tally = Arc::new(Tally::default());
        let (stop, stopped) = watch::channel(false);
        let held: Arc<Vec<AtomicU64>> =
            Arc::new(sources.iter().map(|_| AtomicU64::new(0)).collect());
        let tasks = (0..WORKERS)
            .map(|w| {
                let (tally, stopped, held, sources) =
                    (tally.clone(), stopped.clone(), held.clone(), sources.clone());
                tokio::spawn(worker(w as usize, target, sources, held, tally, stopped))
            })
            .collect();
        Flood { tally, stop, tasks, started: Instant::now() }
    }

    /// Successful connects per second so far.
    fn rate(&self) -> f64 {
        self.tally.connected.load(Ordering::Relaxed) as f64 / self.started.elapsed().as_secs_f64()
    }

    fn report(&self, what: &str) -> String {
        let t = &self.tally;
        format!(
            "{what}: {} connects in {:.1} s ({:.0}/s), {} failed, {} held now",
            t.connected.load(Ordering::Relaxed),
            self.started.elapsed().as_secs_f64(),
            self.rate(),
            t.failed.load(Ordering::Relaxed),
            t.held.load(Ordering::Relaxed),
        )
    }

    fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.abort();
        }
    }
}

/// One flood task: [`FLOOD_RATE`]/[`WORKERS`] connects a second, in ticks, round-robin over
/// the sources. A connection whose source holds fewer than [`HELD_PER_SOURCE`] sockets is
/// held (never a byte sent, see [`hold`]); any other is reset at once.
async fn worker(
    w: usize,
    target: SocketAddr,
    sources: Vec<Ipv4Addr>,
    held: Arc<Vec<AtomicU64>>,
    tally: Arc<Tally>,
    stopped: watch::Receiver<bool>,
) {
    let per_tick = (FLOOD_RATE / WORKERS * TICK.as_millis() as u64 / 1000).max(1);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next = w;
    loop {
        tick.tick().await;
        for _ in 0..per_tick {
            let i = next % sources.len();
            next += 1;
            let Some(stream) = connect(sources[i], target).await else {
                tally.failed.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            tally.connected.fetch_add(1, Ordering::Relaxed);
            if held[i].fetch_add(1, Ordering::Relaxed) < HELD_PER_SOURCE {
                tally.held.fetch_add(1, Ordering::Relaxed);
                let (held, tally, stopped) = (held.clone(), tally.clone(), stopped.clone());
                let hold_for =
                    Duration::from_millis(HOLD_MIN_MS + (next as u64 * 7919) % HOLD_SPREAD_MS);
                tokio::spawn(async move {
                    hold(stream, hold_for, stopped).await;
                    held[i].fetch_sub(1, Ordering::Relaxed);
                    tally.held.fetch_sub(1, Ordering::Relaxed);
                });
            } else {
                held[i].fetch_sub(1, Ordering::Relaxed);
                // A reset, not a close: no TIME_WAIT left on either side.
                let _ = stream.set_zero_linger();
            }
        }
    }
}

/// Holds `stream` without sending a byte until the node closes it, `hold_for` passes or the
/// flood stops; then resets it.
async fn hold(mut stream: TcpStream, hold_for: Duration, mut stopped: watch::Receiver<bool>) {
    let closed = async {
        let mut buf = [0u8; 64];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = closed => {}
        _ = tokio::time::sleep(hold_for) => {}
        _ = stopped.changed() => {}
    }
    let _ = stream.set_zero_linger();
}

async fn connect(src: Ipv4Addr, target: SocketAddr) -> Option<TcpStream> {
    let socket = TcpSocket::new_v4().ok()?;
    socket.set_reuseaddr(true).ok()?;
    socket.bind(SocketAddr::from((src, 0))).ok()?;
    tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(target)).await.ok()?.ok()
}

fn socket_addr(node: &Node) -> anyhow::Result<SocketAddr> {
    let addr = &node.listen_addrs[0];
    let ip = addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(ip),
        _ => None,
    });
    let port = addr.iter().find_map(|p| match p {
        Protocol::Tcp(port) => Some(port),
        _ => None,
    });
    match (ip, port) {
        (Some(ip), Some(port)) => Ok(SocketAddr::from((ip, port))),
        _ => anyhow::bail!("no TCP/IPv4 listen address: {addr}"),
    }
}

/// Inbound connections the node refused: over a per-host or per-network cap (`ip_limit`),
/// or over the global pending cap, reset or timed out in the handshake (`handshake`).
async fn refused(node: &Node) -> anyhow::Result<(u64, u64)> {
    let r = node.client.stats().await?.rejects;
    let get = |k: &str| r.get(k).copied().unwrap_or(0);
    Ok((get("ip_limit"), get("handshake")))
}

/// Floods a node from `sources`, then starts a newcomer (from 127.0.0.1, another /16)
/// bootstrapped to it; returns how long the newcomer took to become a run peer.
async fn join_under_flood(what: &str, sources: Vec<Ipv4Addr>) -> anyhow::Result<Duration> {
    let node = start_with(|c| {
        c.exempt_loopback = false;
        c.listen = vec!["/ip4/127.0.0.1/tcp/0".parse().expect("valid address")];
    })
    .await?;
    let target = socket_addr(&node)?;
    let flood = Flood::start(target, sources);
    // The flood reaches the node: its connections over the per-host caps are refused.
    wait_until("the flood refused", || async {
        let (ip, handshake) = refused(&node).await?;
        Ok(ip + handshake >= 100 && flood.started.elapsed() >= WARM_UP)
    })
    .await?;
    let before = refused(&node).await?;
    let t0 = Instant::now();
    let newcomer = start_with(|c| c.bootstrap = vec![node.listen_addrs[0].clone()]).await?;
    let id: PeerId = newcomer.client.peer_id();
    let joined = wait_until("the newcomer joined under the flood", || async {
        Ok(node.client.run_peers().await?.contains(&id))
    })
    .await;
    let took = t0.elapsed();
    // The flood goes on being refused after the newcomer is in.
    let still = wait_until("the flood refused after the join", || async {
        let (ip, handshake) = refused(&node).await?;
        Ok(ip + handshake > before.0 + before.1)
    })
    .await;
    let after = refused(&node).await?;
    let (report, rate) = (flood.report(&format!("flood from {what}")), flood.rate());
    eprintln!(
        "{report}; newcomer joined after {took:?}; refused (ip_limit, handshake) {before:?} -> {after:?}"
    );
    flood.stop();
    joined?;
    still?;
    // A newcomer locked out never joins (the condition's deadline, 20 s, fails it); one
    // that gets in takes 0.05–0.15 s (printed). How fast is a figure, not an assertion.
    anyhow::ensure!(rate >= MIN_RATE, "the flood was too slow to test anything ({report})");
    stop_all(vec![node, newcomer]).await?;
    Ok(took)
}

/// One test, the floods in turn (two at once would share the machine's cores): from one
/// address, from 16 addresses of one /24, and from 16 addresses in 16 /16s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_joins_a_peer_under_a_reconnect_flood() -> anyhow::Result<()> {
    let one = join_under_flood("1 address", vec![Ipv4Addr::new(127, 2, 0, 10)]).await?;
    let one_24 = join_under_flood(
        "16 addresses of one /24",
        (10..=25).map(|i| Ipv4Addr::new(127, 2, 0, i)).collect(),
    )
    .await?;
    let spread = join_under_flood(
        "16 addresses in 16 /16s",
        (2..=17).map(|i| Ipv4Addr::new(127, i, 0, 10)).collect(),
    )
    .await?;
    eprintln!(
        "joined under a flood from 1 address in {one:?}, from 16 of one /24 in {one_24:?}, \
         from 16 in 16 /16s in {spread:?}"
    );
    Ok(())
}
