//! `atoll status`: print the status a running (or stopped) peer keeps in its run dir;
//! `--swarm`: every peer of its run, as their heartbeats describe them.

use std::path::{Path, PathBuf};

use anyhow::Context;

use atoll::heartbeat::table::SwarmView;
use atoll::rundir::status::{unix_ms, StatusFile, FILE_NAME as STATUS_FILE};
use atoll::rundir::swarm;

/// A status older than this while "running" means the peer probably died.
const STALE_MS: u64 = 5_000;

/// Arguments of `atoll status`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run dir of the peer (as given to `atoll run --run-dir`).
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Print the status file as JSON, for scripts (with --swarm: the swarm table).
    #[arg(long)]
    pub json: bool,
    /// Every known peer of the run, from this peer's heartbeat table (`swarm.json`).
    #[arg(long)]
    pub swarm: bool,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    if args.swarm {
        let view = read_swarm(&args.run_dir)?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&view)?);
        } else {
            print!("{}", super::swarm_table::table(&view, unix_ms()));
        }
        return Ok(());
    }
    let status = read_status(&args.run_dir)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", human(&status));
        let swarm = read_swarm(&args.run_dir).ok();
        let findings = atoll::doctor::diagnose(&status, swarm.as_ref(), unix_ms());
        println!("health   {}", atoll::doctor::summary(&findings));
    }
    Ok(())
}

/// The peer's `status.json`, with an error that says what to check.
pub fn read_status(run_dir: &Path) -> anyhow::Result<StatusFile> {
    let path = run_dir.join(STATUS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read {} (is a peer running with --run-dir {}?)",
            path.display(),
            run_dir.display()
        )
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid status file", path.display()))
}

/// The peer's `swarm.json` (written by peers that publish heartbeats).
pub fn read_swarm(run_dir: &Path) -> anyhow::Result<SwarmView> {
    let path = run_dir.join(swarm::FILE_NAME);
    swarm::read(&path).with_context(|| {
        format!(
            "cannot read {} (it is written by a running peer of this version, once a second)",
            path.display()
        )
    })
}

/// Whether others can dial this peer, and its relay side.
fn reachability(st: &atoll_net::NetStats) -> String {
    let r = &st.relay;
    let how = match st.reachability {
        atoll_net::Reachability::Public => "public (others can dial it)",
        atoll_net::Reachability::Private => "private (behind NAT: reachable through relays)",
        atoll_net::Reachability::Unknown => "unknown (not probed yet)",
    };
    let mut out = format!("reach    {how}; relay slots held {}", r.reservations.len());
    if r.serving {
        out += &format!(
            "; relaying for {} peers, {} circuits so far",
            r.reservations_served, r.circuits_served
        );
    }
    if r.holepunch_ok + r.holepunch_failed > 0 {
        out += &format!("; hole punches {} ok, {} failed", r.holepunch_ok, r.holepunch_failed);
    }
    out + "\n"
}

fn human(s: &StatusFile) -> String {
    let now = unix_ms();
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
    let links: std::collections::HashMap<&str, &atoll_net::PeerLink> =
        st.links.iter().map(|l| (l.peer.as_str(), l)).collect();
    for p in &st.run_peers {
        let link = match links.get(p.as_str()).map(|l| l.kind) {
            Some(atoll_net::LinkKind::Direct) => " (direct)",
            Some(atoll_net::LinkKind::Relayed) => " (relayed)",
            None => "",
        };
        out += &format!("         {p}{link}\n");
    }
    out += &reachability(st);
    out += &format!(
        "traffic  {} sent, {} received (blob {} / {}, announce {} / {})\n",
        bytes(st.bytes_sent),
        bytes(st.bytes_received),
        bytes(st.protocols.get("blob").map_or(0, |b| b.sent)),
        bytes(st.protocols.get("blob").map_or(0, |b| b.received)),
        bytes(st.protocols.get("announce").map_or(0, |b| b.sent)),
        bytes(st.protocols.get("announce").map_or(0, |b| b.received)),
    );
    out += &wire(st);
    out += &format!("store    {} blobs, {}\n", st.blobs_stored, bytes(st.store_bytes));
    if !st.rejects.is_empty() || st.penalised > 0 {
        let r: Vec<String> = st.rejects.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out += &format!("rejects  {} (penalised peers: {})\n", r.join(", "), st.penalised);
    }
    out += &suspects(st);
    if let Some(t) = &s.training {
        let target = t.target_step.map_or(String::new(), |n| format!("/{n}"));
        let bpb = t.val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
        out += &format!(
            "training step {}{target}, {:.0} tok/s, val_bpb {bpb}, run {}\n",
            t.step, t.tokens_per_s, t.run_id
        );
        out += &format!(
            "rounds   {:?} ({} merges, {} skipped, {} adopted)\n",
            t.round, t.merges, t.skipped, t.adopted
        );
        if t.period.iter().any(|&k| k > 1) {
            out += &format!(
                "sampled  period {:?} ({} snapshots banked, {} unsent)\n",
                t.period, t.banked, t.unsent
            );
        }
        out += &refused(t);
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

/// Every byte on the wire by protocol, the busiest first; empty for a status without them.
fn wire(st: &atoll_net::NetStats) -> String {
    let mut streams: Vec<(&str, &atoll_net::ByteCount)> =
        st.protocols.iter().filter_map(|(k, c)| Some((k.strip_prefix("stream/")?, c))).collect();
    if streams.is_empty() {
        return String::new();
    }
    streams.sort_by_key(|&(k, c)| (std::cmp::Reverse(c.sent + c.received), k));
    let parts: Vec<String> = streams
        .iter()
        .map(|(k, c)| format!("{k} {} / {}", bytes(c.sent), bytes(c.received)))
        .collect();
    format!("wire     {} (sent / received)\n", parts.join(", "))
}

/// The peers with standing strikes and the latest bans, by id; empty when there are none.
fn suspects(st: &atoll_net::NetStats) -> String {
    let mut out = String::new();
    if !st.struck.is_empty() {
        let s: Vec<String> =
            st.struck.iter().map(|p| format!("{} ({:.1})", p.peer, p.strikes)).collect();
        out += &format!("strikes  {}\n", s.join(", "));
    }
    if st.banned > 0 {
        let b: Vec<String> = st
            .recent_bans
            .iter()
            .rev()
            .map(|b| format!("{} ({} at {} s)", b.peer, b.reason, b.at_secs))
            .collect();
        let latest =
            if b.is_empty() { String::new() } else { format!(", latest {}", b.join(", ")) };
        out += &format!("banned   {} peers{latest}\n", st.banned);
    }
    out
}

/// What the peer refused, by cause, and the peers most refusals were owed to; empty when
/// it refused nothing.
fn refused(t: &atoll::rundir::status::TrainingStatus) -> String {
    let causes: Vec<String> =
        t.refusals.iter().filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k} {n}")).collect();
    if causes.is_empty() {
        return String::new();
    }
    let mut from: Vec<(&String, &u64)> = t.refused_from.iter().collect();
    from.sort_by_key(|&(p, n)| (std::cmp::Reverse(*n), p));
    let from: Vec<String> = from.iter().take(3).map(|(p, n)| format!("{p} ({n})")).collect();
    let from =
        if from.is_empty() { String::new() } else { format!("; most from {}", from.join(", ")) };
    format!("refused  {}{from}\n", causes.join(", "))
}

pub fn bytes(n: u64) -> String {
    atoll::doctor::human_bytes(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use atoll::rundir::status::TrainingStatus;

    fn status(period: Vec<u32>) -> StatusFile {
        let t = TrainingStatus { period, banked: 12, unsent: 3, ..Default::default() };
        StatusFile {
            running: true,
            pid: 1,
            updated_unix_ms: unix_ms(),
            stats: Default::default(),
            training: Some(t),
            endpoints: Default::default(),
        }
    }

    #[test]
    fn a_sampled_peer_shows_its_period_and_what_it_banked() {
        let text = human(&status(vec![1, 4]));
        assert!(text.contains("sampled  period [1, 4] (12 snapshots banked, 3 unsent)"), "{text}");
        // A peer contributing every round is not told about sampling.
        assert!(!human(&status(vec![1, 1])).contains("sampled"));
    }

    #[test]
    fn the_wire_line_puts_the_busiest_protocol_first() {
        let mut s = status(vec![1]);
        assert!(!human(&s).contains("wire"), "no stream counts, no line");
        let count = |sent, received| atoll_net::ByteCount { sent, received };
        s.stats.protocols = [
            ("transport", count(12_000_000, 12_000_000)),
            ("stream/kad", count(700_000, 700_000)),
            ("stream/gossipsub", count(9_000_000, 9_100_000)),
            ("stream/blob", count(1_200_000, 1_000_000)),
        ]
        .map(|(k, c)| (k.to_owned(), c))
        .into();
        let text = human(&s);
        let line = text.lines().find(|l| l.starts_with("wire")).expect("a wire line");
        let order: Vec<usize> =
            ["gossipsub", "blob", "kad"].iter().map(|k| line.find(k).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{line}");
        assert!(!line.contains("transport"), "{line}");
    }

    #[test]
    fn struck_and_banned_peers_are_named() {
        let mut s = status(vec![1]);
        let text = human(&s);
        assert!(!text.contains("strikes") && !text.contains("banned"), "{text}");
        s.stats.struck = vec![atoll_net::StruckPeer { peer: "12D3KooWs".into(), strikes: 2.5 }];
        s.stats.banned = 3;
        s.stats.recent_bans = ["12D3KooWa", "12D3KooWb"]
            .map(|p| atoll_net::BannedPeer {
                peer: p.into(),
                reason: "unserved".into(),
                at_secs: 9,
            })
            .into();
        let text = human(&s);
        assert!(text.contains("strikes  12D3KooWs (2.5)\n"), "{text}");
        assert!(
            text.contains("banned   3 peers, latest 12D3KooWb (unserved at 9 s), 12D3KooWa"),
            "{text}"
        );
    }

    #[test]
    fn refusals_name_the_peers_they_were_owed_to() {
        let mut s = status(vec![1]);
        assert!(!human(&s).contains("refused"), "nothing refused, nothing said");
        let t = s.training.as_mut().unwrap();
        t.refusals = [("disagreed", 5), ("fetch_failed", 2), ("off_slot", 0)]
            .map(|(k, n)| (k.to_owned(), n))
            .into();
        t.refused_from = [("12D3KooWa", 1), ("12D3KooWb", 4), ("00000000000000c7", 2)]
            .map(|(k, n)| (k.to_owned(), n))
            .into();
        let text = human(&s);
        assert!(
            text.contains(
                "refused  disagreed 5, fetch_failed 2; most from 12D3KooWb (4), \
                 00000000000000c7 (2), 12D3KooWa (1)"
            ),
            "{text}"
        );
    }
}
