//! Partitions with real `atoll run` processes: four training peers split into
//! {0, 1} | {2, 3} that cannot reach each other. Both sides keep training and merging on
//! their own (and their anchors diverge); after the heal the peers find each other again
//! and the anchors reconcile to identical hashes.
//!
//! Two ways to cut:
//! - atoll-net's fault-injection switch (`atoll run --fault-injection`, a block list in each
//!   run dir re-read every second): works without root, on 127.0.0.1. Connections are
//!   closed and refused at the libp2p layer, so the peers see the cut at once.
//! - network namespaces (root and `ATOLL_NETNS_TEST=1`, else the test says it skips): the
//!   sides live in two namespaces joined by a veth pair, and the cut is a blackhole route
//!   each way. Packets vanish: open TCP connections stall instead of closing, as behind a
//!   pulled cable, until atoll-net's pings give up on them (about 30 s).
//!
//! Rounds to agreement are measured where two status files (rewritten every 500 ms)
//! happened to show the same fragment and round; the verdict is the final anchors.

mod common;
#[path = "partition/netns.rs"]
mod netns;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use atoll_net::{fault, PeerId};

use netns::Netns;

use common::{
    assert_same_final_anchors, serial, swarm_with, wait_all_exit, wait_for, Peer, Spec, Until,
};

/// How long each peer trains (`--duration`): the partition is healed 5–30 s after the start
/// (connections and rounds are wall-clock, whatever the step rate), and the peers must
/// still be training then.
const TRAIN: Duration = Duration::from_secs(45);
/// Rounds each side must merge on its own.
const ROUNDS_APART: u64 = 8;
/// Generous bounds: other builds and tests may share the two cores.
const CONNECT: Duration = Duration::from_secs(60);
const APART: Duration = Duration::from_secs(90);
const RECONNECT: Duration = Duration::from_secs(60);
/// How long the test watches for the two sides' lineages to meet.
const AGREE: Duration = Duration::from_secs(120);
const FINISH: Duration = Duration::from_secs(600);

/// The network-namespace variant runs only when this is set: it needs root and takes
/// about three minutes (a silent cut is noticed after about 30 s, so the peers train 4× as
/// long). Its long run also meets a failure that is not the partition's (once in six runs
/// here): the node's delta-norm guard refuses an honest delta, every other peer penalises
/// its sender for 10 min, and that peer ends with anchors of its own.
const NETNS_OPT_IN: &str = "ATOLL_NETNS_TEST";

const SIDE_A: [usize; 2] = [0, 1];
const SIDE_B: [usize; 2] = [2, 3];

#[test]
fn both_sides_of_a_block_list_partition_train_and_agree_after_the_heal() {
    let _serial = serial();
    partition_and_heal(&Cut::BlockList);
}

#[test]
fn both_sides_of_a_network_namespace_partition_train_and_agree_after_the_heal() {
    if std::env::var_os(NETNS_OPT_IN).is_none() {
        eprintln!(
            "SKIPPED both_sides_of_a_network_namespace_partition_train_and_agree_after_the_heal: \
             set {NETNS_OPT_IN}=1 to run it (root and `ip netns`; about 3 minutes). The \
             block-list test covers partitions by default."
        );
        return;
    }
    let _serial = serial();
    match Netns::setup() {
        Ok(netns) => partition_and_heal(&Cut::Netns(netns)),
        Err(why) => eprintln!(
            "SKIPPED both_sides_of_a_network_namespace_partition_train_and_agree_after_the_heal: \
             cannot set up network namespaces ({why}); the block-list test covers partitions \
             without root"
        ),
    }
}

/// How the test cuts the swarm in two.
enum Cut {
    BlockList,
    Netns(Netns),
}

impl Cut {
    /// How long each peer trains: through the partition (a silent cut takes up to 35 s to
    /// notice, so the heal comes about 30 s later than with a block list).
    fn train_for(&self) -> Until {
        match self {
            Cut::BlockList => Until::Seconds(TRAIN.as_secs()),
            Cut::Netns(_) => Until::Seconds(4 * TRAIN.as_secs()),
        }
    }

    fn spec(&self, i: usize, spec: Spec) -> Spec {
        match self {
            Cut::BlockList => spec.arg("--fault-injection"),
            Cut::Netns(n) => {
                let side = usize::from(!SIDE_A.contains(&i));
                let wrapper = ["ip", "netns", "exec", &n.names[side]];
                spec.wrapper(&wrapper).listen(&format!("/ip4/{}/tcp/0", Netns::ADDRS[side]))
            }
        }
    }

    fn cut(&self, peers: &[Peer], ids: &[String]) {
        match self {
            Cut::BlockList => {
                for (side, other) in [(SIDE_A, SIDE_B), (SIDE_B, SIDE_A)] {
                    for i in side {
                        block(&peers[i], other.iter().map(|&j| &ids[j]));
                    }
                }
            }
            Cut::Netns(n) => n.blackhole("add"),
        }
    }

    fn heal(&self, peers: &[Peer]) {
        match self {
            Cut::BlockList => {
                for p in peers {
                    block(p, []);
                }
            }
            Cut::Netns(n) => n.blackhole("del"),
        }
    }
}

fn partition_and_heal(how: &Cut) {
    let tmp = common::test_dir("partition-");
    let mut run = Run::start(how, tmp.path());
    let cut = run.cut(how);
    let (apart, apart_from) = run.apart(&cut);
    let heal_round = run.heal(how);
    run.finish(&cut, &apart, apart_from, heal_round);
}

/// The four peers of one test, and what their status files showed.
struct Run {
    peers: Vec<Peer>,
    ids: Vec<String>,
    seen: History,
    started: Instant,
}

impl Run {
    fn log(&self, what: String) {
        eprintln!("[{:>5.1}s] {what}", self.started.elapsed().as_secs_f64());
    }

    /// Starts the swarm and waits until all four are connected and merging.
    fn start(how: &Cut, root: &std::path::Path) -> Run {
        let started = Instant::now();
        let until = [how.train_for(); 4];
        let mut peers = swarm_with(root, "partition", &until, |i, s| how.spec(i, s));
        let ids = peer_ids(&mut peers);
        let mut seen = History::default();
        wait_for("all four connected", CONNECT, &mut peers, |p| {
            lists_exactly(p, &ids, &[0, 1, 2, 3])
        });
        wait_for("every peer merging", CONNECT, &mut peers, |p| {
            seen.observe(p);
            p.iter().all(|p| p.training().is_some_and(|t| t.merges >= 3))
        });
        let run = Run { peers, ids, seen, started };
        run.log("all four connected and merging".into());
        run
    }

    /// Cuts both directions and waits until each side lists only itself. A block list
    /// closes the connections across at once; a blackhole leaves them open but silent until
    /// pings time out (about 30 s).
    fn cut(&mut self, how: &Cut) -> Snapshot {
        let cut_at = Instant::now();
        how.cut(&self.peers, &self.ids);
        let ids = &self.ids;
        wait_for("each side to see only itself", RECONNECT, &mut self.peers, |p| {
            lists_exactly(p, ids, &SIDE_A) && lists_exactly(p, ids, &SIDE_B)
        });
        let cut = snapshot(&self.peers);
        self.log(format!(
            "partitioned at rounds {:?}; connections across closed {:.1}s after the cut",
            cut.rounds,
            cut_at.elapsed().as_secs_f64()
        ));
        cut
    }

    /// Each side trains and merges on its own, nothing crosses, and the two lineages
    /// diverge (from `apart_from`: a side's first round after the cut may still merge
    /// deltas announced before it).
    fn apart(&mut self, cut: &Snapshot) -> (Snapshot, u64) {
        let crossing_at_cut = bytes_across(&self.peers, &self.ids);
        let apart_from = cut.max_round_all() + 2;
        let seen = &mut self.seen;
        wait_for("both sides merging apart, anchors diverged", APART, &mut self.peers, |p| {
            seen.observe(p);
            let now = snapshot(p);
            (0..4).all(|i| {
                now.merges[i] >= cut.merges[i] + ROUNDS_APART
                    && now.min_round(i) >= cut.max_round(i) + ROUNDS_APART
                    && now.steps[i] > cut.steps[i]
            }) && seen.across(apart_from).1 > 0
        });
        let (same, differ) = self.seen.across(apart_from);
        assert_eq!(same, 0, "the two sides held the same state while apart ({differ} times not)");
        assert_eq!(
            bytes_across(&self.peers, &self.ids),
            crossing_at_cut,
            "payload bytes crossed the cut (per peer: bytes exchanged with the other side)"
        );
        for p in &self.peers {
            assert!(!p.training().unwrap().trained, "{} stopped training before the heal", p.name);
        }
        let apart = snapshot(&self.peers);
        self.log(format!(
            "apart: merges {:?} → {:?}, rounds {:?}",
            cut.merges, apart.merges, apart.rounds
        ));
        (apart, apart_from)
    }

    /// Heals and waits until all four are connected again: nobody re-dials on the heal,
    /// discovery must find the other side. Then watches for the two sides' lineages to
    /// meet: a peer of each side shows the same state for the same round. That is only
    /// seen where two status files happened to show the same round, so it is watched, not
    /// required: the final anchors decide. Returns the round of the heal.
    fn heal(&mut self, how: &Cut) -> u64 {
        how.heal(&self.peers);
        let healed = Instant::now();
        let heal_round = snapshot(&self.peers).max_round_all();
        let ids = &self.ids;
        wait_for("all four connected again", RECONNECT, &mut self.peers, |p| {
            lists_exactly(p, ids, &[0, 1, 2, 3])
        });
        self.log(format!(
            "healed at round {heal_round}; all connected {:.1}s later, by round {}",
            healed.elapsed().as_secs_f64(),
            snapshot(&self.peers).max_round_all()
        ));
        let mut met: Vec<Option<u64>> = vec![None; 4];
        let watch_until = Instant::now() + AGREE;
        while met.iter().any(Option::is_none)
            && Instant::now() < watch_until
            && self.peers.iter_mut().all(|p| p.poll_exit().is_none())
        {
            self.seen.observe(&self.peers);
            met = (0..4).map(|f| self.seen.met_by(f, heal_round)).collect();
            std::thread::sleep(common::POLL);
        }
        let training = self.peers.iter().filter(|p| p.training().is_some_and(|t| !t.trained));
        self.log(format!(
            "the sides' lineages met at rounds {met:?} (per fragment; None = not seen before \
             the peers finished), {:.1}s after the heal; {} of 4 still training",
            healed.elapsed().as_secs_f64(),
            training.count()
        ));
        heal_round
    }

    /// Waits for every peer to finish and checks that all four end with the same anchors.
    fn finish(mut self, cut: &Snapshot, apart: &Snapshot, apart_from: u64, heal_round: u64) {
        wait_all_exit(&mut self.peers, FINISH);
        assert_same_final_anchors(&self.peers);
        let end = snapshot(&self.peers);
        let all = |_: usize, _: usize| true;
        let same_side = |i: usize, j: usize| SIDE_A.contains(&i) == SIDE_A.contains(&j);
        self.log(format!(
            "all four ended with identical anchors at rounds {:?}; adoptions at the cut {:?}, \
             before the heal {:?}, at the end {:?}; two peers that showed the same round held \
             different states: before the cut {}, apart within a side {}, after the heal {}",
            end.rounds[0],
            cut.adopted,
            apart.adopted,
            end.adopted,
            self.seen.disagreement(0, cut.max_round_all(), all),
            self.seen.disagreement(apart_from, heal_round, same_side),
            self.seen.disagreement(heal_round + 1, u64::MAX, all),
        ));
    }
}

/// Replaces a peer's block list (an empty list heals).
fn block<'a>(peer: &Peer, ids: impl IntoIterator<Item = &'a String>) {
    let ids: Vec<PeerId> = ids.into_iter().map(|s| s.parse().unwrap()).collect();
    fault::write(&peer.spec.dir.join(fault::FILE_NAME), &ids).unwrap();
}

/// The peer ids of all peers, once every status file names one.
fn peer_ids(peers: &mut [Peer]) -> Vec<String> {
    let mut ids = Vec::new();
    wait_for("every peer id", CONNECT, peers, |ps| {
        ids = ps.iter().filter_map(Peer::peer_id).collect();
        ids.len() == ps.len()
    });
    ids
}

/// True when each peer of `group` lists exactly the others of `group` as run peers.
fn lists_exactly(peers: &[Peer], ids: &[String], group: &[usize]) -> bool {
    group.iter().all(|&i| {
        let want: BTreeSet<&String> = group.iter().filter(|&&j| j != i).map(|&j| &ids[j]).collect();
        let listed = peers[i].run_peers();
        listed.iter().collect::<BTreeSet<_>>() == want
    })
}

/// Payload bytes (announcements and blobs, both directions) each peer exchanged with the
/// other side of the cut.
fn bytes_across(peers: &[Peer], ids: &[String]) -> Vec<u64> {
    let other = |i: usize| if SIDE_A.contains(&i) { SIDE_B } else { SIDE_A };
    (0..peers.len())
        .map(|i| {
            let stats = peers[i].status().unwrap().stats;
            other(i)
                .iter()
                .filter_map(|&j| stats.peers.get(&ids[j]))
                .map(|b| b.sent + b.received)
                .sum()
        })
        .collect()
}

/// Counters of all peers at one moment.
struct Snapshot {
    merges: Vec<u64>,
    adopted: Vec<u64>,
    steps: Vec<u64>,
    rounds: Vec<Vec<u64>>,
}

impl Snapshot {
    fn min_round(&self, i: usize) -> u64 {
        self.rounds[i].iter().copied().min().unwrap_or(0)
    }
    fn max_round(&self, i: usize) -> u64 {
        self.rounds[i].iter().copied().max().unwrap_or(0)
    }
    fn max_round_all(&self) -> u64 {
        (0..self.rounds.len()).map(|i| self.max_round(i)).max().unwrap_or(0)
    }
}

fn snapshot(peers: &[Peer]) -> Snapshot {
    let t: Vec<_> = peers.iter().map(|p| p.training().unwrap_or_default()).collect();
    Snapshot {
        merges: t.iter().map(|t| t.merges).collect(),
        adopted: t.iter().map(|t| t.adopted).collect(),
        steps: t.iter().map(|t| t.step).collect(),
        rounds: t.iter().map(|t| t.round.clone()).collect(),
    }
}

/// Every state hash seen in the peers' status files, by fragment, round and peer (the
/// latest one where a round's state changed, e.g. by an adoption). Status files are
/// rewritten every 500 ms and rounds last 200 ms, so each peer shows only some rounds;
/// peers are compared where they showed the same one.
#[derive(Default)]
struct History {
    seen: BTreeMap<(usize, u64), BTreeMap<usize, String>>,
}

/// Two peers that showed the same fragment and round: did they hold the same state?
struct Comparison {
    fragment: usize,
    round: u64,
    peers: (usize, usize),
    same: bool,
}

impl History {
    fn observe(&mut self, peers: &[Peer]) {
        for (i, p) in peers.iter().enumerate() {
            let Some(t) = p.training() else { continue };
            for (f, (round, hash)) in t.round.iter().zip(&t.anchor_hashes).enumerate() {
                self.seen.entry((f, *round)).or_default().insert(i, hash.clone());
            }
        }
    }

    /// Every comparison at rounds in `from..=to`, by fragment and round.
    fn comparisons(&self, from: u64, to: u64) -> Vec<Comparison> {
        let mut out = Vec::new();
        for (&(fragment, round), by_peer) in &self.seen {
            if round < from || round > to {
                continue;
            }
            let shown: Vec<(&usize, &String)> = by_peer.iter().collect();
            for (k, (i, x)) in shown.iter().enumerate() {
                for (j, y) in &shown[k + 1..] {
                    out.push(Comparison { fragment, round, peers: (**i, **j), same: x == y });
                }
            }
        }
        out
    }

    /// The comparisons between a peer of side A and one of side B from round `from` on:
    /// (how many agreed, how many differed).
    fn across(&self, from: u64) -> (usize, usize) {
        let across = |c: &Comparison| SIDE_A.contains(&c.peers.0) != SIDE_A.contains(&c.peers.1);
        let cs: Vec<Comparison> =
            self.comparisons(from, u64::MAX).into_iter().filter(across).collect();
        (cs.iter().filter(|c| c.same).count(), cs.iter().filter(|c| !c.same).count())
    }

    /// The share of comparisons at rounds `from..=to` in which two peers held different
    /// states (before the cut, this is how often peers of a calm swarm disagree when a
    /// status file is written between a merge and the reconciliation that repairs it).
    fn disagreement(&self, from: u64, to: u64, pair: impl Fn(usize, usize) -> bool) -> String {
        let cs: Vec<Comparison> =
            self.comparisons(from, to).into_iter().filter(|c| pair(c.peers.0, c.peers.1)).collect();
        let differ = cs.iter().filter(|c| !c.same).count();
        format!("{differ}/{}", cs.len())
    }

    /// The first round after `after` at which a peer of each side showed the same state
    /// of fragment `f`.
    fn met_by(&self, f: usize, after: u64) -> Option<u64> {
        self.comparisons(after + 1, u64::MAX).into_iter().find_map(|c| {
            let across = SIDE_A.contains(&c.peers.0) != SIDE_A.contains(&c.peers.1);
            (c.fragment == f && c.same && across).then_some(c.round)
        })
    }
}
