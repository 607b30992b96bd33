//! Strict states (src/proto/check.rs): a state nothing here recomputes yet is checked by
//! fetching the deltas its log lists, through its parent when that parent is a sibling
//! of a state held here, and a backed state whose check failed is still followed.

use super::states::{merge_round, vote_and_serve};
use super::{delta_by, offences};
use crate::delta::ContentHash;
use crate::proto::evidence::Evidence;
use crate::proto::*;

fn strict_peer(me: u64) -> Protocol {
    let plan = super::plan();
    let raw = RawSettings { strict_states: true, ..super::settings(0).raw().clone() };
    let settings = Settings::new(raw).unwrap().with_tokens_per_step(16);
    let init = plan.fragments.iter().map(|f| vec![0.5; f.numel()]).collect();
    Protocol::new(PeerId(me), settings, &plan, init, me).unwrap()
}

const ROUND_ONE: [(u64, f32); 3] = [(2, 0.1), (3, 0.2), (4, 0.3)];
const ROUND_TWO: [(u64, f32); 5] = [(2, 0.4), (3, 0.5), (4, 0.6), (5, 0.7), (6, 0.8)];

/// Peer `me` after rounds one (from `one`) and two (from [`ROUND_TWO`]).
fn two_rounds(mut p: Protocol, one: &[(u64, f32)]) -> Protocol {
    p.start(0);
    merge_round(&mut p, 1, one);
    merge_round(&mut p, 2, &ROUND_TWO);
    p
}

fn asks(out: &[Output], delta: ContentHash) -> bool {
    out.iter().any(|o| matches!(o, Output::Fetch { hash, .. } if *hash == delta))
}

fn evidence(p: &Protocol, state: &FragmentState) -> Evidence {
    let hash = ContentHash::of(&state.to_bytes());
    p.lanes[0].evidence(state, hash, &p.settings, &p.limits)
}

#[test]
fn a_sibling_lineage_s_state_is_recomputed_through_its_parent() {
    // Peer 1 merged round one without peer 4's delta, which came late; peer 7 with it.
    // Both merged round two from the same five deltas, each on its own round-one state.
    let mut p = strict_peer(1);
    p.start(0);
    merge_round(&mut p, 1, &ROUND_ONE[..2]);
    let (c, bytes) = delta_by(4, 1, 0.3);
    p.handle(Event::Message { from: PeerId(4), msg: Message::Contribution(c.clone()) }, 1150);
    p.handle(Event::Fetched { from: PeerId(4), hash: c.hash, bytes }, 1150);
    merge_round(&mut p, 2, &ROUND_TWO);
    let theirs = two_rounds(strict_peer(7), &ROUND_ONE).state(0).clone();
    assert!(!p.lanes[0].holds(theirs.parent), "peer 1 holds the other lineage's parent");
    assert_eq!(evidence(&p, &theirs), Evidence::Verified);
    let mut forged = theirs.clone();
    forged.anchor.iter_mut().for_each(|a| *a *= -10.0);
    assert!(matches!(evidence(&p, &forged), Evidence::Forged(_)));
    // Without the late delta, nothing here gives the parent.
    let without = two_rounds(strict_peer(8), &ROUND_ONE[..2]);
    assert_eq!(evidence(&without, &theirs), Evidence::Unverifiable);
}

#[test]
fn an_unbacked_state_of_a_sibling_lineage_is_checked_and_adopted() {
    let mut p = two_rounds(strict_peer(1), &ROUND_ONE[..2]);
    let mine = p.state(0).clone();
    let theirs = two_rounds(strict_peer(7), &ROUND_ONE).state(0).clone();
    // Two of the five credited voters hold it (no majority, no majority lineage); the
    // others vote states of their own.
    let now = 2_200;
    for v in [4, 5] {
        let mut s = mine.clone();
        s.parent = ContentHash::of(&[v as u8]);
        let bytes = s.to_bytes();
        let vote = super::vote(2, ContentHash::of(&bytes), bytes.len() as u64);
        p.handle(Event::Message { from: PeerId(v), msg: Message::State(vote) }, now);
    }
    let out = vote_and_serve(&mut p, &[2, 3], &theirs, now);
    assert!(offences(&out).is_empty(), "{out:?}");
    // Its parent merged peer 4's round-one delta, which peer 1 never got: fetched.
    let (late, bytes) = delta_by(4, 1, 0.3);
    assert!(asks(&out, late.hash), "the check did not ask for the delta: {out:?}");
    assert_eq!(p.state(0), &mine);
    p.handle(Event::Fetched { from: PeerId(2), hash: late.hash, bytes }, now + 10);
    assert_eq!(p.state(0), &theirs, "the checked state was not adopted");
    assert_eq!(p.metrics().state_checks, 1);
}

#[test]
fn a_backed_state_whose_check_failed_is_still_followed() {
    // Peer 1 merged round one without peer 4's delta; the three others hold the state
    // that took it. The delta cannot be had (its holders are gone): the state is taken
    // on its votes, as most of the round's voters hold it.
    let mut p = strict_peer(1);
    p.start(0);
    merge_round(&mut p, 1, &ROUND_ONE[..2]);
    let mine = p.state(0).clone();
    let mut q = strict_peer(7);
    q.start(0);
    merge_round(&mut q, 1, &ROUND_ONE);
    let theirs = q.state(0).clone();
    let out = vote_and_serve(&mut p, &[2, 3, 4], &theirs, 1_200);
    let (late, _) = delta_by(4, 1, 0.3);
    assert!(asks(&out, late.hash), "the check did not ask for the delta: {out:?}");
    assert_eq!(p.state(0), &mine, "adopted before its check");
    let failed = Event::FetchFailed {
        from: PeerId(2),
        hash: late.hash,
        denied: vec![PeerId(2)],
        silent: Vec::new(),
    };
    p.handle(failed, 1_300);
    assert_eq!(p.state(0), &theirs, "a backed state was refused after a failed check");
}
