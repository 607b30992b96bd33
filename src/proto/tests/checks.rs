//! Strict states (src/proto/check.rs): a state nothing here recomputes yet is checked by
//! fetching the deltas its log lists, through its parent when that parent is a sibling
//! of a state held here, and a backed state whose check failed is still followed.

use super::states::{merge_round, vote_and_serve};
use super::{delta_by, offences};
use crate::delta::ContentHash;
use crate::proto::evidence::Evidence;
use crate::proto::*;
use bytes::Bytes;

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

/// Announces that `voter` holds `state` of its round, merged on `parent` (claims included).
fn claim(p: &mut Protocol, voter: u64, hash: ContentHash, state: &FragmentState, now: Millis) {
    let size = state.to_bytes().len() as u64;
    let mut s = super::vote(state.round, hash, size);
    (s.took, s.parent) = (Some(state.took()), Some(state.parent));
    p.handle(Event::Message { from: PeerId(voter), msg: Message::State(s) }, now);
}

/// Reconciles fragment 0 at `now` and serves the state fetched, if it is `state`; what
/// serving it gave.
fn reconcile_serving(p: &mut Protocol, state: &FragmentState, now: Millis) -> Vec<Output> {
    let bytes: Bytes = state.to_bytes().into();
    let hash = ContentHash::of(&bytes);
    let out = p.handle(Event::Timer(Timer::Reconcile { fragment: 0, round: state.round }), now);
    if out.iter().any(|o| matches!(o, Output::Fetch { hash: h, .. } if *h == hash)) {
        return p.handle(Event::Fetched { from: PeerId(2), hash, bytes }, now + 1);
    }
    Vec::new()
}

/// Peer 1 after two rounds on the lineage that missed peer 4's round-one delta, with its
/// state; the other lineage's round-two state and its hash; and a state of a third lineage.
struct Split {
    p: Protocol,
    mine: FragmentState,
    theirs: FragmentState,
    their_hash: ContentHash,
    alone: FragmentState,
}

fn split() -> Split {
    let p = two_rounds(strict_peer(1), &ROUND_ONE[..2]);
    let mine = p.state(0).clone();
    let theirs = two_rounds(strict_peer(7), &ROUND_ONE).state(0).clone();
    let their_hash = ContentHash::of(&theirs.to_bytes());
    let mut alone = mine.clone();
    alone.parent = ContentHash([0xaa; 32]);
    Split { p, mine, theirs, their_hash, alone }
}

#[test]
fn a_split_swarm_follows_the_ruling_settled_lineage_and_only_it() {
    // Peer 1 merged round one without peer 4's delta; peers 2 and 3 hold the round-two state
    // of the lineage that took it, which peer 1 cannot recompute (the delta is nobody's to
    // serve). Peer 6 holds peer 1's state, peers 5 and 8 states of a third lineage: no
    // lineage holds most of the six voters, nor half of them one state.
    let Split { mut p, mine, theirs, their_hash, alone } = split();
    let now = 2_200;
    super::credit(&mut p, 8, 2, now);
    claim(&mut p, 6, ContentHash::of(&mine.to_bytes()), &mine, now);
    claim(&mut p, 5, ContentHash([0xbb; 32]), &alone, now);
    claim(&mut p, 8, ContentHash([0xbc; 32]), &alone, now);
    for v in [2, 3] {
        claim(&mut p, v, their_hash, &theirs, now);
    }
    reconcile_serving(&mut p, &theirs, now);
    // It is checked first: peer 4's delta is asked for, and cannot be had.
    let (late, _) = delta_by(4, 1, 0.3);
    let failed = |from| Event::FetchFailed {
        from: PeerId(from),
        hash: late.hash,
        denied: vec![PeerId(from)],
        silent: Vec::new(),
    };
    p.handle(failed(2), now + 10);
    assert_eq!(p.state(0), &mine, "left its lineage for one that does not rule");
    // Peer 4 takes the other lineage's state too: three of seven voters, against two.
    let later = now + 2 * p.settings.period_ms();
    claim(&mut p, 4, their_hash, &theirs, later);
    reconcile_serving(&mut p, &theirs, later);
    assert_eq!(p.state(0), &theirs, "stayed apart from a larger settled lineage");
}

#[test]
fn a_lineage_that_did_not_settle_on_a_state_takes_nobody_over() {
    // The other lineage is the largest of eight voters (four of them, against one and
    // three), but they hold three states: its leader is held by two, not most of it
    // (colluders voting one made-up state on an honest parent lead a lineage so).
    let Split { mut p, mine, theirs, their_hash, alone } = split();
    let now = 2_200;
    for v in [8, 9] {
        super::credit(&mut p, v, 2, now);
    }
    claim(&mut p, 2, their_hash, &theirs, now);
    claim(&mut p, 3, their_hash, &theirs, now);
    for v in [4, 5] {
        claim(&mut p, v, ContentHash([0xf0 + v as u8; 32]), &theirs, now);
    }
    for v in [6, 8, 9] {
        claim(&mut p, v, ContentHash([0xe0 + v as u8; 32]), &alone, now);
    }
    reconcile_serving(&mut p, &theirs, now);
    assert_eq!(p.state(0), &mine, "followed a lineage's leader that most of it does not hold");
}

/// `mine` as if merged on `parent`, a state nobody holds, with its hash; `parent` must sort
/// before `mine`'s (`low`) or after it (ties between lineages go to the smaller parent).
fn on_parent(mine: &FragmentState, parent: [u8; 32], low: bool) -> (FragmentState, ContentHash) {
    let mut other = mine.clone();
    other.parent = ContentHash(parent);
    assert_eq!(other.parent < mine.parent, low, "the test needs another parent");
    let hash = ContentHash::of(&other.to_bytes());
    (other, hash)
}

fn low_lineage(mine: &FragmentState) -> (FragmentState, ContentHash) {
    on_parent(mine, [0x01; 32], true)
}

/// Peer 1 and peer 6 on peer 1's lineage, peers 2 and 3 settled on `other` (hash
/// `other_hash`), peers 5 and 8 on lineages of one voter each: no lineage holds most of the
/// six voters, two lineages of two tie.
fn two_against_two(
    p: &mut Protocol,
    mine: &FragmentState,
    other: &FragmentState,
    alone: &FragmentState,
) -> Vec<Output> {
    let now = 2_200;
    super::credit(p, 8, 2, now);
    claim(p, 6, ContentHash([0xcc; 32]), mine, now);
    claim(p, 5, ContentHash([0xbb; 32]), alone, now);
    let mut apart = alone.clone();
    apart.parent = ContentHash([0xab; 32]);
    claim(p, 8, ContentHash([0xbd; 32]), &apart, now);
    let other_hash = ContentHash::of(&other.to_bytes());
    for v in [2, 3] {
        claim(p, v, other_hash, other, now);
    }
    reconcile_serving(p, other, now)
}

/// The [`Output::Weigh`] in `out`: the state's hash and the anchors to weigh.
fn weighs(out: &[Output]) -> Option<(ContentHash, &[f32], &[f32])> {
    out.iter().find_map(|o| match o {
        Output::Weigh { fragment: 0, hash, anchor, own, .. } => {
            Some((*hash, &anchor[..], &own[..]))
        }
        _ => None,
    })
}

#[test]
fn a_state_that_wins_a_tie_between_lineages_is_weighed_before_it_is_adopted() {
    // Two colluders vote one made-up state on a made-up parent that sorts first: their
    // lineage ties with peer 1's and wins the tie (`lineages_as_large_as_each_other_...`).
    // With an executor that weighs states, the trainer is asked first; a state far worse
    // than peer 1's own is refused, one about as good is taken, and so is one that could
    // not be weighed (a trainer that stopped).
    for (losses, taken) in [
        (Some(Losses { offered: 9.0, own: 2.0 }), false),
        (Some(Losses { offered: f64::NAN, own: 2.0 }), false),
        (Some(Losses { offered: 2.0 * (1.0 + WORSE_MARGIN / 2.0), own: 2.0 }), true),
        (None, true),
    ] {
        let Split { mut p, mine, alone, .. } = split();
        p.set_weighing(true);
        let (mut low, _) = low_lineage(&mine);
        low.anchor.iter_mut().for_each(|x| *x = -40.0);
        let low_hash = ContentHash::of(&low.to_bytes());
        let out = two_against_two(&mut p, &mine, &low, &alone);
        let (hash, anchor, own) = weighs(&out).expect("the state is weighed");
        assert_eq!((hash, anchor, own), (low_hash, &low.anchor[..], &mine.anchor[..]));
        assert_eq!(p.state(0), &mine, "adopted before the trainer answered");
        let out = p.handle(Event::Weighed { fragment: 0, hash, losses }, 2_300);
        let adopted =
            out.iter().any(|o| matches!(o, Output::Adopted { hash: h, .. } if *h == hash));
        let want = if taken { &low } else { &mine };
        assert_eq!((p.state(0), adopted), (want, taken), "{losses:?}");
        assert_eq!(p.metrics().worse_states, u64::from(!taken), "{losses:?}");
        // A refused state is not fetched again for a period, nor weighed again.
        let again = p.handle(Event::Timer(Timer::Reconcile { fragment: 0, round: 2 }), 2_400);
        assert!(
            taken
                || !again.iter().any(|o| matches!(o, Output::Fetch { hash: h, .. } if *h == hash))
        );
    }
}

#[test]
fn a_weighing_never_answered_frees_the_lane_a_period_on() {
    let Split { mut p, mine, alone, .. } = split();
    p.set_weighing(true);
    let (low, low_hash) = low_lineage(&mine);
    assert!(weighs(&two_against_two(&mut p, &mine, &low, &alone)).is_some());
    // Meanwhile the state is not fetched again.
    let soon = p.handle(Event::Timer(Timer::Reconcile { fragment: 0, round: 2 }), 2_400);
    assert!(!asks(&soon, low_hash), "fetched a state being weighed");
    let later = 2_300 + p.settings.period_ms();
    let out = p.handle(Event::Timer(Timer::Reconcile { fragment: 0, round: 2 }), later);
    assert!(asks(&out, low_hash), "the lane stayed on a weighing nobody answers");
    // The late answer of the first weighing finds no weighing and changes nothing.
    p.handle(Event::Weighed { fragment: 0, hash: low_hash, losses: None }, later + 1);
    assert_eq!(p.state(0), &mine);
}

#[test]
fn lineages_as_large_as_each_other_all_follow_the_smaller_parent() {
    // The other lineage's parent sorts first: peer 1 leaves its own for it (as a 2 | 2
    // partition heals); one whose parent sorts last it does not leave its own for.
    let Split { mut p, mine, alone, .. } = split();
    let (low, _) = low_lineage(&mine);
    two_against_two(&mut p, &mine, &low, &alone);
    assert_eq!(p.state(0), &low, "kept its lineage against one as large that wins the tie");
    let Split { mut p, mine, alone, .. } = split();
    let (high, _) = on_parent(&mine, [0xff; 32], false);
    two_against_two(&mut p, &mine, &high, &alone);
    assert_eq!(p.state(0), &mine, "left its lineage for one as large that loses the tie");
}

#[test]
fn a_majority_lineage_is_followed_once_it_settled_on_a_state() {
    // Five of six voters claim states merged on a parent peer 1 never held, but only two
    // of them hold the state that leads among them: with strict states that is not the
    // lineage's state yet (colluders voting one made-up state on an honest lineage's parent
    // lead it so). Once most of the lineage holds it, it is.
    let Split { mut p, mine, .. } = split();
    let (low, low_hash) = low_lineage(&mine);
    let now = 2_200;
    for v in [2, 3] {
        claim(&mut p, v, low_hash, &low, now);
    }
    for v in [4, 5, 6] {
        claim(&mut p, v, ContentHash([0xd0 + v as u8; 32]), &low, now);
    }
    reconcile_serving(&mut p, &low, now);
    assert_eq!(p.state(0), &mine, "followed a lineage that had not settled");
    let later = now + 2 * p.settings.period_ms();
    for v in [4, 5] {
        claim(&mut p, v, low_hash, &low, later);
    }
    reconcile_serving(&mut p, &low, later);
    assert_eq!(p.state(0), &low, "did not follow its settled majority lineage");
}

#[test]
fn a_state_most_voters_hold_is_refused_only_when_far_worse() {
    // The settled majority lineage's state of `a_majority_lineage_is_followed_...`: with
    // an executor that weighs, a peer with a trained state weighs it against the loose
    // margin (a peer counting few voters can count more colluders than honest peers).
    for (offered, taken) in [(9.0, false), (2.0 * (1.0 + POISON_MARGIN) + 0.1, false), (5.0, true)]
    {
        let Split { mut p, mine, .. } = split();
        p.set_weighing(true);
        let (low, low_hash) = low_lineage(&mine);
        for v in [2, 3, 4, 5] {
            claim(&mut p, v, low_hash, &low, 2_200);
        }
        let out = reconcile_serving(&mut p, &low, 2_200);
        let margin = out.iter().find_map(|o| match o {
            Output::Weigh { hash, margin, .. } if *hash == low_hash => Some(*margin),
            _ => None,
        });
        assert_eq!(margin, Some(POISON_MARGIN), "a majority's state was not weighed loosely");
        let losses = Some(Losses { offered, own: 2.0 });
        p.handle(Event::Weighed { fragment: 0, hash: low_hash, losses }, 2_300);
        assert_eq!(p.state(0), if taken { &low } else { &mine }, "offered {offered}");
    }
}

#[test]
fn a_state_half_of_a_round_s_votes_hold_needs_most_of_every_voter() {
    // Thirteen counted voters: peer 1 and peers 2–6 on peer 1's lineage, each with its own
    // state; peer 7, whose vote for the round is still on its way; peers 8–13 holding one
    // state nobody can check. Six of the round's twelve votes hold it: half the round's votes
    // in, which colluders reach first, not most of every voter. (Their lineage is as large
    // as peer 1's and loses the tie, so only the votes could take it.)
    let Split { mut p, mine, .. } = split();
    let (forged, forged_hash) = on_parent(&mine, [0xff; 32], false);
    let now = 2_200;
    for v in 7..=13 {
        super::credit(&mut p, v, 2, now);
    }
    let mut earlier = mine.clone();
    earlier.round = 1;
    claim(&mut p, 7, ContentHash([0x77; 32]), &earlier, now);
    for v in 2..=6 {
        claim(&mut p, v, ContentHash([0xd0 + v as u8; 32]), &mine, now);
    }
    for v in 8..=13 {
        claim(&mut p, v, forged_hash, &forged, now);
    }
    reconcile_serving(&mut p, &forged, now);
    assert_eq!(p.state(0), &mine, "took a state half of the round's votes so far hold");
    let later = now + 2 * p.settings.period_ms();
    claim(&mut p, 7, forged_hash, &forged, later);
    reconcile_serving(&mut p, &forged, later);
    assert_eq!(p.state(0), &forged, "refused a state most of every counted voter holds");
}
