//! One hostile peer against a 3-peer swarm of real processes on loopback (issue "Hostile
//! peers"). The attacker is a real libp2p node in this test process that read the source:
//! it fetches honest deltas and re-announces them scaled by −10 with inflated and with
//! honest claims, equivocates, claims others' deltas, forges authors, announces fake and
//! far-future payloads, votes for states that do not exist and asks for the same chunk
//! again and again. The honest peers must finish (exit 0) with identical anchors, a final
//! `val_bpb` within 2% of unattacked runs of the same config, the attacks counted, the
//! attacker banned by every honest peer, and bounded memory. (Offences that need a fetch
//! the honest peers never make — a stolen delta they already hold — are covered by the
//! core's unit tests, src/proto/tests/attacks.rs.) A second attacker commits no provable
//! offence at all — signed, author-bound −10× deltas with legal claims — and must cost the
//! swarm no more than the first, without being banned. `HOSTILE_HONEST` and
//! `HOSTILE_IDENTITIES` change the counts for measurements (see [`counts`]),
//! `HOSTILE_CODEC=q4` the codec (see [`run_encoding`]).

#[path = "hostile/attack.rs"]
mod attack;
mod common;

use std::collections::BTreeMap;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use atoll::delta::{self, Codec, ContentHash, DeltaMeta, EncodeOptions, Limits};
use atoll::fragment::{FragmentSpec, TensorSpec};
use atoll::node::{proto_peer, wire};
use atoll::proto::{ContributionAnnounce, Message, PeerId, StateAnnounce};
use atoll_net::blob::wire::BlobRequest;
use atoll_net::{BlobHash, Multiaddr, NetClient, NetConfig, NetEvent, Node};
use attack::attacker;
use common::Peer;

const STEPS: u64 = 300;

/// Honest peers (`HOSTILE_HONEST`, default 3) and attacker identities
/// (`HOSTILE_IDENTITIES`, default 1, each its own libp2p node and key, all running the same
/// attack: colluding Sybils). The suite runs the defaults; other counts are measurements
/// (bench/RESULTS.md, e.g. 3 identities against 9 honest peers).
fn counts() -> (usize, usize) {
    let get = |name: &str, default: usize| {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(default)
    };
    (get("HOSTILE_HONEST", 3), get("HOSTILE_IDENTITIES", 1))
}
/// Peak resident memory allowed to an honest tiny-model peer under attack.
const MAX_RSS_KIB: u64 = 1 << 20;

/// What the attacker does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Every attack below, provable offences included: banned within a round.
    Everything,
    /// Only what no one can prove an offence of: one delta per fragment and round, signed
    /// by itself, its own id in the header, an honest delta's legal claims, and values of
    /// −10× that honest delta. Weighed by agreement, it pulls nothing.
    AuthorBound,
    /// Also no provable offence: once it holds two honest deltas of a fragment round, the
    /// negated sum of their directions, scaled to 1.9× their mean norm (issue 21's
    /// "direction" attack). Run instead of `AuthorBound` with `HOSTILE_ATTACK=direction`
    /// (a measurement; the suite runs `AuthorBound`).
    Direction,
    /// For each fragment round, a delta of the largest legal size with an honest delta's
    /// claims, announced again with every honest delta of that round and never served (its
    /// node answers that it has no such payload: issue 21's "stall"). Denying a delta it
    /// signed that it holds is an offence (`unserved`). Run instead of `AuthorBound` with
    /// `HOSTILE_ATTACK=stall` (a measurement).
    Stall,
    /// Connected, subscribed, and silent: what the attackers' mere presence costs (a
    /// baseline for the others, `HOSTILE_ATTACK=idle`).
    Idle,
}

/// The run's codec: the default run's (`top2`, 512 of every 4,096 values, feedback 0.8), or
/// with `HOSTILE_CODEC=q4` (a measurement) 4-bit blockwise deltas, the former default.
fn run_encoding() -> EncodeOptions {
    match std::env::var("HOSTILE_CODEC").as_deref() {
        Ok("q4") => EncodeOptions::default(),
        _ => atoll::manifest::default_encode(),
    }
}

/// What one swarm run ended with.
struct Outcome {
    val_bpb: Vec<f64>,
    rejected: BTreeMap<String, u64>,
    refusals: BTreeMap<String, u64>,
    /// Agreement factors of the attacker's merged contributions, on every honest peer.
    attacker_agreement: Vec<f64>,
    /// The honest peers that banned every attacker identity.
    banned: Vec<usize>,
    peak_rss_kib: u64,
    /// Merged and skipped rounds of each honest peer.
    merges: Vec<(u64, u64)>,
    /// Refusals each honest peer owes to the attackers (`status.json`, `refused_from`).
    refused_attacker: Vec<u64>,
}

#[test]
fn one_hostile_peer_cannot_crash_steer_or_take_over_a_swarm() {
    let _serial = common::serial();
    let tmp = common::test_dir("hostile-");
    // Unattacked runs of the same config differ by up to ~4% on their own (which deltas
    // make which round depends on timing: 3.73–3.87 measured), so the attacked run is held
    // against the worse of two: an attack may not cost more than 8% beyond what timing
    // alone does (an attack that steers the swarm costs +54%). The attacker is a fourth
    // process on two cores, so the attacked run is also the slowest: with the attacker
    // banned by all three it ended 3.2% (3.876 vs 3.755) and 5.1% (4.106 vs 3.906) above
    // the worse clean run in CI, 0.0–1.9% above in six local runs; clean runs of one
    // binary spread 3.853–4.024 (4.4%).
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let clean_runs: Vec<Outcome> =
        (0..2).map(|i| run(&tmp.path().join(format!("clean-{i}")), None)).collect();
    let clean: Vec<f64> = clean_runs.iter().map(|o| mean(&o.val_bpb)).collect();
    let c = clean.iter().copied().fold(0.0, f64::max);
    // Other counts measure the careful attack only (the provable offences are the suite's).
    if counts() == (3, 1) {
        let attacked = run(&tmp.path().join("attacked"), Some(Mode::Everything));
        let a = mean(&attacked.val_bpb);
        eprintln!(
            "val_bpb clean {clean:?} attacked {:?}; rejected {:?}; banned by {:?}; peak RSS {} KiB",
            attacked.val_bpb, attacked.rejected, attacked.banned, attacked.peak_rss_kib
        );
        assert!(a <= 1.08 * c, "attacked {a:.3} vs clean {c:.3}");
        for offence in ["inflated_claim", "equivocation", "forged_author"] {
            let seen = attacked.rejected.get(offence).copied().unwrap_or(0);
            assert!(seen > 0, "{offence} not seen");
        }
        assert_eq!(attacked.banned.len(), 3, "every honest peer bans the attacker");
        assert!(attacked.peak_rss_kib < MAX_RSS_KIB, "peak RSS {} KiB", attacked.peak_rss_kib);
    }
    eprintln!("val_bpb clean {clean:?}");
    // The careful attacker: nothing to ban, its poison merged with no weight (−10× deltas
    // cost a swarm +54% before agreement weights; SECURITY.md).
    let careful_mode = match std::env::var("HOSTILE_ATTACK").as_deref() {
        Ok("direction") => Mode::Direction,
        Ok("stall") => Mode::Stall,
        Ok("idle") => Mode::Idle,
        _ => Mode::AuthorBound,
    };
    let careful = run(&tmp.path().join("author-bound"), Some(careful_mode));
    let a = mean(&careful.val_bpb);
    if careful_mode == Mode::Idle {
        eprintln!(
            "idle attackers: val_bpb {:?}; merges and skipped rounds {:?} (clean: {:?})",
            careful.val_bpb,
            careful.merges,
            clean_runs.iter().map(|o| &o.merges).collect::<Vec<_>>()
        );
        assert!(careful.attacker_agreement.is_empty(), "a silent attacker's delta merged");
        return;
    }
    if careful_mode == Mode::Stall {
        eprintln!(
            "stalling attacker: val_bpb {:?}; refusals {:?}; refused from it {:?}; merges and \
             skipped rounds {:?} (clean: {:?}); banned by {:?}",
            careful.val_bpb,
            careful.refusals,
            careful.refused_attacker,
            careful.merges,
            clean_runs.iter().map(|o| &o.merges).collect::<Vec<_>>(),
            careful.banned
        );
        assert!(careful.refused_attacker.iter().all(|&n| n > 0), "{:?}", careful.refused_attacker);
        assert!(a <= 1.03 * c, "stall: {a:.3} vs clean {c:.3}");
        // Denying what it signed that it holds is an offence: strikes add up to a ban.
        assert!(
            careful.rejected.get("unserved").copied().unwrap_or(0) > 0,
            "{:?}",
            careful.rejected
        );
        assert_eq!(careful.banned.len(), counts().0, "every honest peer bans the staller");
        return;
    }
    let zero = careful.attacker_agreement.iter().filter(|&&x| x == 0.0).count();
    let merged = careful.attacker_agreement.len();
    eprintln!(
        "author-bound attacker: val_bpb {:?}; refusals {:?}; refused from it {:?}; banned by \
         {:?}; weightless in {zero} of its {merged} merged contributions; merges and skipped \
         rounds {:?} (clean: {:?}, refusals {:?})",
        careful.val_bpb,
        careful.refusals,
        careful.refused_attacker,
        careful.banned,
        careful.merges,
        clean_runs.iter().map(|o| &o.merges).collect::<Vec<_>>(),
        clean_runs.iter().map(|o| &o.refusals).collect::<Vec<_>>()
    );
    // Its deltas weigh nothing in most merges (a set of two pointing apart is skipped; in
    // a set of three the others' median points against a reversed copy; alone or in a
    // pair, the state's momentum does, and what it lets through is capped at the
    // momentum's norm), and the swarm is not steered: −0.7%, −0.3% and (beside two busy
    // loops) +0.8% against the worse clean run (+54% before agreement weights; 6.34 and
    // 5.03 against 3.74 on CI before the small-set rules, 5.96 against 4.08 locally before
    // the cap), hence a bound with room for timing's spread.
    assert!(merged > 0 && 4 * zero >= 3 * merged, "weightless in {zero} of {merged} merges");
    assert!(a <= 1.12 * c, "author-bound attack: {a:.3} vs clean {c:.3}");
    assert!(careful.banned.is_empty(), "it commits no provable offence");
    assert!(careful.refusals.get("disagreed").copied().unwrap_or(0) > 0, "{:?}", careful.refusals);
}

/// A swarm of [`counts`] honest peers to the end, with or without the attackers.
fn run(root: &Path, attack: Option<Mode>) -> Outcome {
    std::fs::create_dir_all(root).unwrap();
    let (honest, identities) = counts();
    let manifest = common::swarm_manifest(root, "hostile");
    let mut m = atoll::manifest::Manifest::load(&manifest).unwrap();
    m.protocol.encode = run_encoding();
    common::write_manifest(manifest.clone(), &m);
    let until = vec![common::Until::Steps(STEPS); honest];
    let mut peers = common::swarm_of(root, &manifest, &until, |_, s| s);
    let addrs: Vec<Multiaddr> =
        peers.iter_mut().map(|p| p.listen_addr(Duration::from_secs(30)).parse().unwrap()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    // Colluders know each other: none attacks another's deltas or states.
    let keys: Vec<_> = (0..identities).map(|k| root.join(format!("attacker_key_{k}"))).collect();
    let crew: Arc<HashSet<atoll_net::PeerId>> = Arc::new(
        keys.iter()
            .map(|k| atoll_net::identity::load_or_create(k).unwrap().public().to_peer_id())
            .collect(),
    );
    let attackers: Vec<_> = attack
        .into_iter()
        .flat_map(|mode| keys.clone().into_iter().map(move |k| (mode, k)))
        .map(|(mode, key)| {
            let (stop, run_id, addrs, crew) =
                (stop.clone(), run_id(root), addrs.clone(), crew.clone());
            std::thread::spawn(move || attacker(addrs, run_id, key, crew, stop, mode))
        })
        .collect();
    let mut peak_rss_kib = 0;
    common::wait_for("the swarm to finish training", Duration::from_secs(240), &mut peers, |ps| {
        peak_rss_kib = peak_rss_kib.max(ps.iter().map(peak_rss).max().unwrap_or(0));
        ps.iter().all(|p| p.training().is_some_and(|t| t.trained))
    });
    stop.store(true, Ordering::Relaxed);
    let attacker_ids: Vec<String> = attackers.into_iter().map(|a| a.join().unwrap()).collect();
    common::wait_all_exit(&mut peers, Duration::from_secs(180));
    common::assert_same_final_anchors(&peers);
    let mut rejected = BTreeMap::new();
    let mut refusals = BTreeMap::new();
    let mut attacker_agreement = Vec::new();
    let mut banned = Vec::new();
    let mut val_bpb = Vec::new();
    let mut merges = Vec::new();
    let mut refused_attacker = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        let t = p.training().unwrap();
        val_bpb.push(t.final_val_bpb.unwrap());
        merges.push((t.merges, t.skipped));
        if !attacker_ids.is_empty() {
            let owed = attacker_ids.iter().map(|id| t.refused_from.get(id).copied().unwrap_or(0));
            refused_attacker.push(owed.sum());
        }
        for (k, v) in t.rejected {
            *rejected.entry(k).or_insert(0) += v;
        }
        for (k, v) in t.refusals {
            *refusals.entry(k).or_insert(0) += v;
        }
        let ledger = atoll::rundir::ledger::read(&p.spec.dir).unwrap();
        for id in &attacker_ids {
            let hex = atoll::rundir::ledger::peer_hex(proto_peer(&id.parse().unwrap()));
            let theirs = ledger.iter().flat_map(|m| &m.contributions).filter(|c| c.peer == hex);
            attacker_agreement.extend(theirs.map(|c| c.agreement));
        }
        let bans = std::fs::read_to_string(p.spec.dir.join("banned_peers")).unwrap_or_default();
        let bans_all = attacker_ids.iter().all(|id| bans.lines().any(|l| l.trim() == id));
        if !attacker_ids.is_empty() && bans_all {
            banned.push(i);
        }
    }
    Outcome {
        val_bpb,
        rejected,
        refusals,
        attacker_agreement,
        banned,
        peak_rss_kib,
        merges,
        refused_attacker,
    }
}

fn run_id(root: &Path) -> [u8; 32] {
    atoll::manifest::Manifest::load(&root.join("manifest-in.json")).unwrap().run_id().0
}

/// Peak resident set of a live peer process, in KiB (0 once it exited).
fn peak_rss(p: &Peer) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
