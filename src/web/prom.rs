//! `/metrics`: the board's latest status in the OpenMetrics text format (which Prometheus
//! scrapes), encoded by prometheus-client at each scrape.
//!
//! The values are the ones `status.json` holds, read from the board when scraped (a
//! [`Collector`]), so the two never disagree and nothing is counted twice. Counters keep
//! the status file's totals; names are `atoll_*`, OpenMetrics adds `_total` to counters.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use atoll_net::{LinkKind, NetStats, Reachability};

use super::board::Board;
use crate::rundir::status::TrainingStatus;

/// The `Content-Type` of the answer.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Encodes the board's latest status.
pub fn encode(board: &Board) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("atoll");
    registry.register_collector(Box::new(Snapshot(board.clone())));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

#[derive(Debug)]
struct Snapshot(Board);

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.0.with_status(|status| {
            let Some(status) = status else { return Ok(()) };
            gauge(&mut enc, "up", "1 while the peer runs, 0 once it stopped", status.running)?;
            let info = Info::new(vec![
                ("peer_id", status.stats.peer_id.clone()),
                ("run_name", status.stats.run_name.clone()),
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ]);
            info.encode(enc.encode_descriptor("peer", "This peer", None, info.metric_type())?)?;
            network(&mut enc, &status.stats)?;
            match &status.training {
                Some(t) => training(&mut enc, t),
                None => Ok(()),
            }
        })
    }
}

/// A value that is a gauge or a counter.
trait Value {
    fn as_f64(&self) -> f64;
}
impl Value for u64 {
    fn as_f64(&self) -> f64 {
        *self as f64
    }
}
impl Value for usize {
    fn as_f64(&self) -> f64 {
        *self as f64
    }
}
impl Value for f64 {
    fn as_f64(&self) -> f64 {
        *self
    }
}
impl Value for bool {
    fn as_f64(&self) -> f64 {
        u8::from(*self).into()
    }
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: impl Value) -> Fmt {
    let g = ConstGauge::new(v.as_f64());
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> Fmt {
    let c = ConstCounter::new(v);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

/// A family of samples with one label each.
fn family<V: Value>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    label: &str,
    samples: impl IntoIterator<Item = (String, V)>,
) -> Fmt {
    let mut fam = enc.encode_descriptor(name, help, None, kind)?;
    for (value_label, v) in samples {
        let labels = [(label, value_label)];
        let m = fam.encode_family(&labels)?;
        match kind {
            MetricType::Counter => ConstCounter::new(v.as_f64()).encode(m)?,
            _ => ConstGauge::new(v.as_f64()).encode(m)?,
        }
    }
    Ok(())
}

type Fmt = Result<(), std::fmt::Error>;

fn network(enc: &mut DescriptorEncoder, s: &NetStats) -> Fmt {
    gauge(enc, "run_peers", "Connected peers of this run", s.run_peers.len())?;
    gauge(enc, "connected_peers", "Connected peers of any run", s.connected)?;
    gauge(enc, "routing_table_peers", "Peers in the Kademlia routing table", s.routing_table_size)?;
    gauge(enc, "uptime_seconds", "Seconds since the network node started", s.uptime_secs)?;
    counter(enc, "bytes_sent", "Bytes sent on all substreams", s.bytes_sent)?;
    counter(enc, "bytes_received", "Bytes received on all substreams", s.bytes_received)?;
    let sent = s.protocols.iter().map(|(p, c)| (p.clone(), c.sent));
    family(
        enc,
        "protocol_bytes_sent",
        "Bytes sent by protocol",
        MetricType::Counter,
        "protocol",
        sent,
    )?;
    let recv = s.protocols.iter().map(|(p, c)| (p.clone(), c.received));
    family(
        enc,
        "protocol_bytes_received",
        "Bytes received by protocol",
        MetricType::Counter,
        "protocol",
        recv,
    )?;
    let rejects = s.rejects.iter().map(|(r, n)| (r.clone(), *n));
    family(
        enc,
        "rejects",
        "Refused messages and connections",
        MetricType::Counter,
        "reason",
        rejects,
    )?;
    let strikes = s.strikes.iter().map(|(r, n)| (r.clone(), *n));
    family(enc, "strikes", "Strikes given to peers", MetricType::Counter, "reason", strikes)?;
    gauge(enc, "banned_peers", "Peers banned for the run", s.banned)?;
    let struck = s.struck.iter().map(|p| (p.peer.clone(), p.strikes));
    let help = format!(
        "Standing strikes of the most struck peers (banned at {})",
        atoll_net::bans::BAN_STRIKES
    );
    family(enc, "peer_strikes", &help, MetricType::Gauge, "peer", struck)?;
    let help = "1 for each of the latest peers banned, with the reason of the last strike";
    let mut fam = enc.encode_descriptor("recent_ban", help, None, MetricType::Gauge)?;
    for b in &s.recent_bans {
        let labels = [("peer", b.peer.clone()), ("reason", b.reason.clone())];
        ConstGauge::new(1.0).encode(fam.encode_family(&labels)?)?;
    }
    gauge(enc, "penalised_peers", "Peers penalised for serving bad data", s.penalised)?;
    gauge(enc, "blobs_stored", "Blobs in the local store", s.blobs_stored)?;
    gauge(enc, "store_bytes", "Bytes in the local blob store", s.store_bytes)?;
    counter(enc, "events_dropped", "Network events dropped (consumer behind)", s.events_dropped)?;
    let states = [Reachability::Public, Reachability::Private, Reachability::Unknown];
    let reach = states.map(|r| (reachability_name(r).to_owned(), s.reachability == r));
    family(
        enc,
        "reachability",
        "1 for the AutoNAT state this node is in",
        MetricType::Gauge,
        "state",
        reach,
    )?;
    let count = |k: LinkKind| s.links.iter().filter(|l| l.kind == k).count();
    let links = [
        ("direct".to_owned(), count(LinkKind::Direct)),
        ("relayed".to_owned(), count(LinkKind::Relayed)),
    ];
    family(enc, "links", "Connected run peers by link kind", MetricType::Gauge, "kind", links)?;
    let r = &s.relay;
    gauge(enc, "relay_serving", "1 if this node runs a relay server", r.serving)?;
    gauge(
        enc,
        "relay_reservations_served",
        "Reservations held on this relay",
        r.reservations_served,
    )?;
    counter(enc, "relay_circuits", "Circuits this relay accepted", r.circuits_served)?;
    let circuit = r.circuit_bytes.sent.saturating_add(r.circuit_bytes.received);
    counter(enc, "circuit_bytes", "Bytes this node sent and received through relays", circuit)?;
    gauge(
        enc,
        "relay_reservations",
        "Relays this node holds a reservation on",
        r.reservations.len(),
    )?;
    let punch = [("ok".to_owned(), r.holepunch_ok), ("failed".to_owned(), r.holepunch_failed)];
    family(
        enc,
        "holepunches",
        "Hole punching attempts by result",
        MetricType::Counter,
        "result",
        punch,
    )
}

fn reachability_name(r: Reachability) -> &'static str {
    match r {
        Reachability::Public => "public",
        Reachability::Private => "private",
        Reachability::Unknown => "unknown",
    }
}

fn training(enc: &mut DescriptorEncoder, t: &TrainingStatus) -> Fmt {
    gauge(enc, "step", "Inner steps taken", t.step)?;
    counter(enc, "tokens", "Tokens trained on", t.tokens)?;
    gauge(enc, "tokens_per_second", "Training throughput", t.tokens_per_s)?;
    if let Some(loss) = t.loss {
        gauge(enc, "loss", "Training loss of the latest step (nats per byte)", f64::from(loss))?;
    }
    if let Some(v) = t.val_bpb {
        gauge(enc, "val_bpb", "Validation bits per byte of the latest pass", v)?;
    }
    counter(enc, "merges", "Rounds merged", t.merges)?;
    counter(enc, "skipped_rounds", "Rounds skipped", t.skipped)?;
    counter(enc, "adopted", "States adopted from the swarm", t.adopted)?;
    let help = "States no majority held, weighed on the validation data before adoption";
    counter(enc, "states_weighed", help, t.weighed)?;
    counter(enc, "foreign_messages", "Messages of another run manifest", t.foreign_messages)?;
    let rounds = t.round.iter().enumerate().map(|(i, r)| (i.to_string(), *r));
    family(
        enc,
        "fragment_round",
        "Round of each fragment's state",
        MetricType::Gauge,
        "fragment",
        rounds,
    )?;
    let offences = t.rejected.iter().map(|(k, n)| (k.clone(), *n));
    family(enc, "offences", "Protocol offences by kind", MetricType::Counter, "kind", offences)?;
    let refusals = t.refusals.iter().map(|(k, n)| (k.clone(), *n));
    let help = "Payloads not taken, by cause (stalls, a full budget, forged or unbacked states)";
    family(enc, "refusals", help, MetricType::Counter, "cause", refusals)?;
    let from = t.refused_from.iter().map(|(p, n)| (p.clone(), *n));
    let help = "Refusals owed to each of the most refused peers (stalls, forgeries, no weight)";
    family(enc, "refused_from", help, MetricType::Counter, "peer", from)?;
    let payloads = t.payload_bytes.iter().map(|(k, n)| (k.clone(), *n));
    let help = "Payload bytes: own deltas published, deltas and states fetched";
    family(enc, "payload_bytes", help, MetricType::Counter, "kind", payloads)?;
    let periods = t.period.iter().enumerate().map(|(i, k)| (i.to_string(), u64::from(*k)));
    let help = "Rounds between two contributions of this peer to each fragment (1: every round)";
    family(enc, "contribution_period", help, MetricType::Gauge, "fragment", periods)?;
    counter(enc, "banked_snapshots", "Snapshots banked for this peer's next slot", t.banked)?;
    counter(enc, "unsent_snapshots", "Snapshots too long before a slot to be sent", t.unsent)?;
    gauge(enc, "trained", "1 once the step target is reached", t.trained)?;
    gauge(enc, "parameters", "Parameters of the model", t.param_count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use atoll_net::{ByteCount, PeerLink};

    #[test]
    fn the_text_names_every_figure_of_the_status() {
        let board = Board::new();
        assert_eq!(encode(&board).unwrap().trim(), "# EOF");
        let mut stats =
            NetStats { bytes_sent: 12, run_peers: vec!["a".into()], ..Default::default() };
        stats.protocols.insert("blob".into(), ByteCount { sent: 3, received: 4 });
        stats.rejects.insert("malformed".into(), 2);
        stats.links.push(PeerLink { kind: LinkKind::Relayed, ..Default::default() });
        stats.reachability = Reachability::Private;
        stats.struck = vec![atoll_net::StruckPeer { peer: "12D3KooWs".into(), strikes: 2.5 }];
        stats.recent_bans = vec![atoll_net::BannedPeer {
            peer: "12D3KooWb".into(),
            reason: "unserved".into(),
            at_secs: 9,
        }];
        let mut t =
            TrainingStatus { step: 9, round: vec![4, 5], loss: Some(2.5), ..Default::default() };
        t.refusals.insert("fetch_failed".into(), 3);
        t.refused_from.insert("12D3KooWr".into(), 4);
        t.payload_bytes.insert("state_fetched".into(), 7);
        (t.period, t.banked, t.unsent) = (vec![1, 4], 6, 2);
        t.weighed = 5;
        board.set_status(true, stats, Some(t));
        let text = encode(&board).unwrap();
        for line in [
            "atoll_step 9",
            "atoll_loss 2.5",
            "atoll_run_peers 1",
            "atoll_bytes_sent_total 12",
            "atoll_protocol_bytes_received_total{protocol=\"blob\"} 4",
            "atoll_rejects_total{reason=\"malformed\"} 2",
            "atoll_fragment_round{fragment=\"1\"} 5",
            "atoll_refusals_total{cause=\"fetch_failed\"} 3",
            "atoll_payload_bytes_total{kind=\"state_fetched\"} 7",
            "atoll_contribution_period{fragment=\"1\"} 4",
            "atoll_banked_snapshots_total 6",
            "atoll_unsent_snapshots_total 2",
            "atoll_states_weighed_total 5",
            "atoll_reachability{state=\"private\"} 1",
            "atoll_reachability{state=\"public\"} 0",
            "atoll_links{kind=\"relayed\"} 1",
            "atoll_peer_strikes{peer=\"12D3KooWs\"} 2.5",
            "atoll_recent_ban{peer=\"12D3KooWb\",reason=\"unserved\"} 1",
            "atoll_refused_from_total{peer=\"12D3KooWr\"} 4",
        ] {
            assert!(text.lines().any(|l| l.starts_with(line)), "no `{line}` in\n{text}");
        }
        assert!(!text.contains("atoll_val_bpb"), "no validation yet:\n{text}");
    }
}
