//! Blob throughput of atoll-net on loopback: TCP and QUIC, one source to one and to four
//! fetchers, and with the upload cap.
//!
//! `cargo bench -p atoll-net --bench net_blobs [-- --size-mib N --cap-mbps X]`
//! Prints a markdown table (paste into bench/RESULTS.md with the command and machine).

use std::time::{Duration, Instant};

use anyhow::Context;
use atoll_net::{NetConfig, Node, PeerId};
use bytes::Bytes;
use rand::{RngCore, SeedableRng};

const TCP: &str = "/ip4/127.0.0.1/tcp/0";
const QUIC: &str = "/ip4/127.0.0.1/udp/0/quic-v1";

struct Args {
    size_mib: usize,
    cap_mbps: f64,
    cap_size_mib: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args { size_mib: 128, cap_mbps: 10.0, cap_size_mib: 16 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().context("missing value");
        match flag.as_str() {
            "--size-mib" => a.size_mib = val()?.parse()?,
            "--cap-mbps" => a.cap_mbps = val()?.parse()?,
            "--cap-size-mib" => a.cap_size_mib = val()?.parse()?,
            // cargo bench passes --bench; ignore flags we do not know.
            _ => {}
        }
    }
    Ok(a)
}

async fn node(listen: &str, bootstrap: Option<&Node>, cap: Option<u64>) -> anyhow::Result<Node> {
    let mut cfg = NetConfig::new(libp2p_key(), "bench");
    cfg.listen = vec![listen.parse()?];
    cfg.bootstrap = bootstrap.map(|b| b.listen_addrs.clone()).unwrap_or_default();
    cfg.max_upload_bytes_per_sec = cap;
    cfg.store_budget = 4 << 30;
    Ok(Node::start(cfg).await?)
}

fn libp2p_key() -> libp2p::identity::Keypair {
    libp2p::identity::Keypair::generate_ed25519()
}

async fn wait_connected(n: &Node, peer: PeerId) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !n.client.run_peers().await?.contains(&peer) {
        anyhow::ensure!(Instant::now() < deadline, "peers did not connect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One source, `fetchers` downloaders; returns (seconds, aggregate MB/s).
async fn scenario(
    listen: &str,
    fetchers: usize,
    size: usize,
    cap: Option<u64>,
) -> anyhow::Result<(f64, f64)> {
    let src = node(listen, None, cap).await?;
    let mut dsts = Vec::new();
    for _ in 0..fetchers {
        let d = node(listen, Some(&src), None).await?;
        wait_connected(&d, src.client.peer_id()).await?;
        dsts.push(d);
    }
    let mut data = vec![0u8; size];
    rand_chacha::ChaCha8Rng::seed_from_u64(size as u64).fill_bytes(&mut data);
    let data = Bytes::from(data);
    let hash = src.client.put_blob(data.clone())?;
    let sid = src.client.peer_id();
    let t0 = Instant::now();
    let tasks: Vec<_> = dsts
        .iter()
        .map(|d| {
            let c = d.client.clone();
            tokio::spawn(async move { c.fetch_blob(hash, &[sid]).await })
        })
        .collect();
    for t in tasks {
        let got = t.await??;
        anyhow::ensure!(got.len() == data.len(), "short blob");
    }
    let secs = t0.elapsed().as_secs_f64();
    let mb = (size * fetchers) as f64 / 1e6;
    src.handle.shutdown().await?;
    for d in dsts {
        d.handle.shutdown().await?;
    }
    Ok((secs, mb / secs))
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        let size = args.size_mib << 20;
        println!("| transport | fetchers | blob | cap | time (s) | aggregate MB/s |");
        println!("|---|---|---|---|---|---|");
        for (name, listen) in [("TCP+noise+yamux", TCP), ("QUIC", QUIC)] {
            for fetchers in [1, 4] {
                let (secs, rate) = scenario(listen, fetchers, size, None).await?;
                println!(
                    "| {name} | {fetchers} | {} MiB | none | {secs:.2} | {rate:.0} |",
                    args.size_mib
                );
            }
        }
        let cap = atoll_net::limiter::mbps_to_bytes_per_sec(args.cap_mbps);
        let (secs, rate) = scenario(TCP, 1, args.cap_size_mib << 20, Some(cap)).await?;
        let mbps = rate * 8.0;
        println!(
            "| TCP+noise+yamux | 1 | {} MiB | {} Mbit/s | {secs:.2} | {rate:.2} (= {mbps:.2} Mbit/s, {:+.1}% of cap) |",
            args.cap_size_mib,
            args.cap_mbps,
            (mbps / args.cap_mbps - 1.0) * 100.0
        );
        anyhow::Ok(())
    })
}
