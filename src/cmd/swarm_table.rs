//! `atoll status --swarm` as a table: every known peer of the run, from one peer's heartbeat
//! table (`swarm.json`, read by `atoll status`).

use atoll::heartbeat::table::SwarmView;
use atoll::heartbeat::{short_peer, Heartbeat};
use atoll_net::Reachability;

/// One row per peer: this peer first, then the others by peer id; `now` in unix ms.
pub fn table(v: &SwarmView, now: u64) -> String {
    let age = now.saturating_sub(v.updated_unix_ms);
    let mut out = format!(
        "{} peers known to {} (heard by heartbeat in the last minute; table written {} ago)\n",
        v.peers.len() + usize::from(v.own.is_some()),
        short_peer(&v.peer_id),
        seconds(age)
    );
    let header =
        ["peer", "step", "tok/s", "val_bpb", "rounds", "reach", "version", "heard", "clock"];
    let mut rows: Vec<[String; 9]> = vec![header.map(str::to_owned)];
    if let Some(own) = &v.own {
        let mut row = cells(&v.peer_id, own);
        row[0].push_str(" *");
        row[7] = "(self)".into();
        row[8] = "-".into();
        rows.push(row);
    }
    for p in &v.peers {
        let mut row = cells(&p.peer, &p.heartbeat);
        row[7] = format!("{} ago", seconds(now.saturating_sub(p.received_unix_ms)));
        row[8] = format!("{:+} ms", p.clock_offset_ms);
        rows.push(row);
    }
    let widths: Vec<usize> =
        (0..9).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    for r in &rows {
        let line: Vec<String> =
            r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out += line.join("  ").trim_end();
        out.push('\n');
    }
    out += "* this peer; clock: the peer's clock minus ours when its heartbeat arrived\n";
    if v.evicted > 0 || !v.refused.is_empty() {
        let refused: Vec<String> = v.refused.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out += &format!(
            "table: {} evicted (full); heartbeats refused: {}\n",
            v.evicted,
            if refused.is_empty() { "none".into() } else { refused.join(", ") }
        );
    }
    out
}

fn cells(peer: &str, h: &Heartbeat) -> [String; 9] {
    let bpb = h.val_bpb.map_or("-".into(), |b| format!("{b:.3}"));
    let (step, tps) = if h.trains {
        (h.step.to_string(), format!("{:.0}", h.tokens_per_s))
    } else {
        ("no-train".into(), "-".into())
    };
    let reach = match h.reachability {
        Reachability::Unknown => "unknown",
        Reachability::Public => "public",
        Reachability::Private => "private",
    };
    [
        short_peer(peer),
        step,
        tps,
        bpb,
        rounds(&h.rounds),
        reach.into(),
        h.version.clone(),
        String::new(),
        String::new(),
    ]
}

/// `12 12 11 11`, or `min–max` for many fragments.
fn rounds(r: &[u64]) -> String {
    match (r.iter().min(), r.iter().max()) {
        (Some(lo), Some(hi)) if r.len() > 6 => format!("{lo}–{hi} ({} fragments)", r.len()),
        (Some(_), Some(_)) => r.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
        _ => "-".into(),
    }
}

fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}
