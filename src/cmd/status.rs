//! `atoll status`: print the status a running (or stopped) peer keeps in its run dir.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;

use atoll::node::status::{StatusFile, FILE_NAME as STATUS_FILE};

/// A status older than this while "running" means the peer probably died.
const STALE_MS: u64 = 5_000;

/// Arguments of `atoll status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run dir of the peer (as given to `atoll run --run-dir`).
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Print the status file as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let path = args.run_dir.join(STATUS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (is a peer running with --run-dir {}?)",
            path.display(),
            args.run_dir.display()
        )
    })?;
    let status: StatusFile = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid status file", path.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", human(&status));
    }
    Ok(())
}

fn human(s: &StatusFile) -> String {
    let now =
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    let age = now.saturating_sub(s.updated_unix_ms);
    let state = match (s.running, age > STALE_MS) {
        (false, _) => "stopped".to_string(),
        (true, false) => "running".to_string(),
        (true, true) => format!("stale: no update for {} s, the peer may have died", age / 1000),
    };
    let st = &s.stats;
    let mut out = String::new();
    out += &format!("peer     {} (pid {}, {state})\n", st.peer_id, s.pid);
    out += &format!("run      {}\n", st.run_name);
    for a in &st.listen_addrs {
        out += &format!("listen   {a}\n");
    }
    if let Some(a) = &s.endpoints.http_addr {
        out += &format!("page     http://{a}/\n");
    }
    if let Some(a) = &s.endpoints.metrics_addr {
        out += &format!("metrics  http://{a}/metrics\n");
    }
    out += &format!(
        "peers    {} in the run, {} connected, {} in the routing table\n",
        st.run_peers.len(),
        st.connected,
        st.routing_table_size
    );
    for p in &st.run_peers {
        out += &format!("         {p}\n");
    }
    out += &format!(
        "traffic  {} sent, {} received (blob {} / {}, announce {} / {})\n",
        bytes(st.bytes_sent),
        bytes(st.bytes_received),
        bytes(st.protocols.get("blob").map_or(0, |b| b.sent)),
        bytes(st.protocols.get("blob").map_or(0, |b| b.received)),
        bytes(st.protocols.get("announce").map_or(0, |b| b.sent)),
        bytes(st.protocols.get("announce").map_or(0, |b| b.received)),
    );
    out += &format!("store    {} blobs, {}\n", st.blobs_stored, bytes(st.store_bytes));
    if !st.rejects.is_empty() || st.penalised > 0 {
        let r: Vec<String> = st.rejects.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out += &format!("rejects  {} (penalised peers: {})\n", r.join(", "), st.penalised);
    }
    if let Some(t) = &s.training {
        let target = t.target_step.map_or(String::new(), |n| format!("/{n}"));
        let bpb = t.val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
        out += &format!(
            "training step {}{target}, {:.0} tok/s, val_bpb {bpb}, manifest {}\n",
            t.step, t.tokens_per_s, t.manifest_id
        );
        out += &format!(
            "rounds   {:?} ({} merges, {} skipped, {} adopted)\n",
            t.round, t.merges, t.skipped, t.adopted
        );
        for (p, h) in t.anchor_hashes.iter().enumerate() {
            out += &format!("anchor   {p}: {h}\n");
        }
        if let Some(v) = t.final_val_bpb {
            out += &format!("final    val_bpb {v:.3} on the merged anchors\n");
        }
    }
    out += &format!("uptime   {} s\n", st.uptime_secs);
    out
}

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
