//! Influence by agreement at the protocol level: which merged work earns a vote, and
//! which rounds are skipped rather than merged (the rules themselves: `merge::tests`).

use super::attacks::{deliver, honest_with_own_delta};
use super::{delta_by, peer};
use crate::proto::*;

/// Votes are earned by work that went the round's way: of three well-formed deltas, only
/// the one that agrees with the round credits its author; the reversed and the zero one
/// are merged with no weight, counted, and earn nothing.
#[test]
fn only_agreeing_work_earns_a_vote() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    for (author, value) in [(2, 0.12), (3, -1.0), (4, 0.0)] {
        let (c, bytes) = delta_by(author, 1, value);
        deliver(&mut p, author, &c, bytes, t + 1);
    }
    let votes = |p: &Protocol| -> Vec<bool> {
        (2..=4).map(|a| p.lanes[0].votes.counts(&PeerId(a))).collect()
    };
    assert_eq!(votes(&p), vec![false; 3], "credited on arrival by an up-to-date peer");
    let out = p.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), t + 2);
    let report = out.iter().find_map(|o| match o {
        Output::Merged(r) => Some(r.clone()),
        _ => None,
    });
    let report = report.expect("the round did not merge");
    assert_eq!(report.contributions.len(), 4);
    assert_eq!(votes(&p), vec![true, false, false]);
    assert_eq!(p.metrics().disagreed, 2);
    // Operators see who they were.
    let owed: Vec<(u64, u64)> =
        p.metrics().refused_from.iter().map(|(peer, n)| (peer.0, *n)).collect();
    assert_eq!(owed, vec![(3, 1), (4, 1)]);
    let weighed: Vec<(u64, f64)> =
        report.contributions.iter().map(|c| (c.origin.0, c.agreement)).collect();
    assert!(weighed.contains(&(3, 0.0)) && weighed.contains(&(4, 0.0)), "{weighed:?}");
}

/// A round of two deltas pointing apart (the peer's own and a reversed one) is skipped,
/// not merged: no median can tell which is poisoned, and merging it as a no-op would throw
/// the trainers' progress away. Both stay pending for a larger set, and the round is marked
/// contested (work arrived), which a trained peer does not read as a quiet swarm.
#[test]
fn a_pair_pointing_apart_is_skipped() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    let (c, bytes) = delta_by(2, 1, -0.1);
    deliver(&mut p, 2, &c, bytes, t + 1);
    let before = p.state(0).clone();
    let out = p.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), t + 2);
    let contested = out.iter().find_map(|o| match o {
        Output::Skipped { contested, .. } => Some(*contested),
        _ => None,
    });
    assert_eq!(contested, Some(true), "{out:?}");
    assert!(!out.iter().any(|o| matches!(o, Output::Merged(_))));
    assert_eq!(p.state(0), &before);
    assert_eq!(p.metrics().merges, 0);
}
