//! States are adopted on evidence (src/proto/evidence.rs): a state naming a parent this
//! peer holds is recomputed bit for bit, so credited voters cannot impose a forgery on a
//! peer that can check it; a state nobody here can recompute needs at least half the
//! round's counted voters, not a plurality.

use super::{credit, delta_by, offences, peer};
use crate::delta::ContentHash;
use crate::proto::*;
use bytes::Bytes;

fn fetched(out: &[Output]) -> Option<ContentHash> {
    out.iter().find_map(|o| match o {
        Output::Fetch { hash, .. } => Some(*hash),
        _ => None,
    })
}

/// `voters` vote `state` for its round and reconciliation runs; the peer fetches the state
/// if it chases it, and gets it.
fn vote_and_serve(
    p: &mut Protocol,
    voters: &[u64],
    state: &FragmentState,
    now: Millis,
) -> Vec<Output> {
    let bytes: Bytes = state.to_bytes().into();
    let hash = ContentHash::of(&bytes);
    let s = StateAnnounce {
        fragment: 0,
        round: state.round,
        hash,
        size: bytes.len() as u64,
        recipe: None,
    };
    let mut out = Vec::new();
    for &v in voters {
        out.extend(
            p.handle(Event::Message { from: PeerId(v), msg: Message::State(s.clone()) }, now),
        );
    }
    // Reconciliation runs on its timer once per round (and at once when behind).
    let reconcile = Timer::Reconcile { fragment: 0, round: state.round };
    out.extend(p.handle(Event::Timer(reconcile), now));
    if fetched(&out) == Some(hash) {
        let from = PeerId(voters[0]);
        out.extend(p.handle(Event::Fetched { from, hash, bytes }, now + 1));
    }
    out
}

/// Peer `me` with round 1 of fragment 0 merged from the round-1 deltas of `others` (which
/// credits them) and nothing of its own.
fn merged_round_one(me: u64, others: &[(u64, f32)]) -> Protocol {
    let mut p = peer(me, 0);
    p.start(0);
    p.handle(Event::Timer(Timer::Open { fragment: 0, round: 1 }), 1000);
    // Nothing trained: the peer merges the others' deltas only.
    let params = p.state(0).anchor.clone();
    p.handle(Event::Snapshot { fragment: 0, round: 1, params, tokens: 0, steps: 0 }, 1000);
    for &(author, value) in others {
        let (c, bytes) = delta_by(author, 1, value);
        let from = PeerId(author);
        p.handle(Event::Message { from, msg: Message::Contribution(c.clone()) }, 1001);
        p.handle(Event::Fetched { from, hash: c.hash, bytes }, 1001);
    }
    p.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), 1100);
    p
}

/// Peer 4's round-1 delta reaches `p` after its merge; returns its announcement.
fn deliver_late(p: &mut Protocol) -> ContributionAnnounce {
    let (c, bytes) = delta_by(4, 1, 0.3);
    p.handle(Event::Message { from: PeerId(4), msg: Message::Contribution(c.clone()) }, 1150);
    p.handle(Event::Fetched { from: PeerId(4), hash: c.hash, bytes }, 1150);
    c
}

#[test]
fn a_forged_state_is_recomputed_refused_and_its_voters_discredited() {
    let deltas = [(2, 0.1), (3, 0.2), (4, 0.3)];
    let mut p = merged_round_one(1, &deltas);
    let (ours, initial) = (p.state(0).clone(), p.state(0).parent);
    assert_eq!(ours.round, 1);
    // Three credited voters against one: the same parent and contribution set, a
    // poisoned anchor.
    let mut forged = ours.clone();
    forged.anchor.iter_mut().for_each(|a| *a *= -10.0);
    let out = vote_and_serve(&mut p, &[2, 3, 4], &forged, 1200);
    assert_eq!(offences(&out), vec![Offence::ForgedState]);
    assert_eq!(p.state(0), &ours, "the forgery was adopted");
    assert_eq!(p.metrics().forged_states, 1);
    // Its voters are discredited: their votes for a later round move nothing.
    let mut later = ours.clone();
    later.round = 2;
    assert_eq!(fetched(&vote_and_serve(&mut p, &[2, 3, 4], &later, 1300)), None);
    // The honest state of another peer with the same deltas recomputes to ours.
    let q = merged_round_one(7, &deltas);
    assert_eq!(q.state(0).parent, initial);
    assert_eq!(q.state_hash(0), p.state_hash(0), "merges of one set agree");
}

#[test]
fn an_honest_competing_state_is_verified_and_adopted() {
    // Peer 1 merged without peer 4's delta (it came late).
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    deliver_late(&mut p);
    let before = p.state(0).clone();
    // Peer 7 got all three in time and merged them.
    let q = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]);
    let theirs = q.state(0).clone();
    assert_eq!(theirs.parent, before.parent);
    assert_ne!(theirs, before);
    let out = vote_and_serve(&mut p, &[2, 3, 4], &theirs, 1200);
    assert!(offences(&out).is_empty(), "{out:?}");
    assert_eq!(p.state(0), &theirs, "the verified state was not adopted");
    assert_eq!(p.metrics().fetched_state_bytes, theirs.wire_len() as u64);
}

#[test]
fn a_listed_delta_that_shares_a_held_one_s_short_id_is_unverifiable_not_forged() {
    // Peer 1 merged 2 and 3 and holds 4's delta; peer 7 merged 2, 3 and 5. An attacker
    // who ground two payloads to one 8-byte id could make 7's log name a delta whose id
    // is that of one peer 1 holds: recomputing with the held one would call 7's honest
    // state a forgery and discredit its voters. With whole hashes in the log, peer 1 sees
    // that it lacks the listed delta.
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    let c = deliver_late(&mut p);
    let mut theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (5, 0.3)]).state(0).clone();
    let (round, mut ids) = theirs.log.pop_back().unwrap();
    let five = delta_by(5, 1, 0.3).0.hash;
    let mut twin = five;
    twin.0[..8].copy_from_slice(&c.hash.0[..8]);
    assert_eq!(twin.short(), c.hash.short());
    ids.iter_mut().filter(|h| **h == five).for_each(|h| *h = twin);
    theirs.record(round, ids, 4);
    let out = vote_and_serve(&mut p, &[2, 3, 5], &theirs, 1200);
    assert!(offences(&out).is_empty(), "{out:?}");
    assert_eq!(p.metrics().forged_states, 0);
}

/// `voters` announce `state` with `recipe`; reconciliation runs. Returns what it output.
fn announce_with_recipe(
    p: &mut Protocol,
    voters: &[u64],
    state: &FragmentState,
    recipe: Recipe,
    now: Millis,
) -> Vec<Output> {
    let hash = state.hash();
    let size = state.wire_len() as u64;
    let s = StateAnnounce { fragment: 0, round: state.round, hash, size, recipe: Some(recipe) };
    let mut out = Vec::new();
    for &v in voters {
        let msg = Message::State(s.clone());
        out.extend(p.handle(Event::Message { from: PeerId(v), msg }, now));
    }
    let reconcile = Timer::Reconcile { fragment: 0, round: state.round };
    out.extend(p.handle(Event::Timer(reconcile), now));
    out
}

#[test]
fn a_competing_state_is_recomputed_from_its_recipe_not_fetched() {
    // Peer 1 merged without peer 4's delta, which came late; peer 7 merged all three.
    let q = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]);
    let theirs = q.state(0).clone();
    let (_, ids) = theirs.log.back().unwrap().clone();
    let mut ids: Vec<u64> = ids.iter().map(ContentHash::short).collect();
    ids.sort_unstable();
    let honest = Recipe { parent: theirs.parent, merged: ids.clone() };
    assert_eq!(q.state(0).log.back().map(|(r, _)| *r), Some(1));

    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    deliver_late(&mut p);
    let out = announce_with_recipe(&mut p, &[2, 3, 4], &theirs, honest.clone(), 1200);
    assert_eq!(fetched(&out), None, "the state was fetched though it could be recomputed");
    assert_eq!(p.state(0), &theirs, "the recomputed state was not adopted");
    assert_eq!((p.metrics().recomputed, p.metrics().adoptions), (1, 1));
    // What it now announces carries the same recipe, so others can do the same.
    let announced = out.iter().find_map(|o| match o {
        Output::Publish { msg: Message::State(s), .. } => Some(s.clone()),
        _ => None,
    });
    assert_eq!(announced.and_then(|s| s.recipe), Some(honest.clone()));

    // A false recipe (one delta left out) recomputes to another hash: the state is
    // fetched as before, and nothing is adopted on the recipe's word.
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    deliver_late(&mut p);
    let lie = Recipe { parent: theirs.parent, merged: ids[..2].to_vec() };
    let out = announce_with_recipe(&mut p, &[2, 3, 4], &theirs, lie, 1200);
    assert_eq!(fetched(&out), Some(theirs.hash()));
    assert_eq!(p.metrics().recomputed, 0);

    // A recipe from voters this peer has not credited is not kept.
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    deliver_late(&mut p);
    let out = announce_with_recipe(&mut p, &[8, 9], &theirs, honest, 1200);
    assert_eq!(p.metrics().recomputed, 0, "{out:?}");
}

#[test]
fn a_state_nobody_can_recompute_needs_half_the_voters() {
    let mut p = peer(1, 0);
    p.start(0);
    for v in 2..=6 {
        credit(&mut p, v, 1, 1001);
    }
    // A state of another lineage (a parent nobody here holds), voted by two of the five
    // credited voters; the other three vote three other states: a plurality, no majority.
    let numel = p.state(0).anchor.len();
    let other = |seed: f32| {
        let mut s = FragmentState::initial(0, vec![seed; numel]);
        s.parent = ContentHash::of(&seed.to_le_bytes());
        s.record(1, vec![ContentHash::of(&seed.to_bits().to_le_bytes())], 2);
        s.round = 1;
        s
    };
    let x = other(0.25);
    let now = 1_200;
    let announce = |p: &mut Protocol, voter: u64, state: &FragmentState| {
        let bytes = state.to_bytes();
        let hash = ContentHash::of(&bytes);
        let s =
            StateAnnounce { fragment: 0, round: 1, hash, size: bytes.len() as u64, recipe: None };
        p.handle(Event::Message { from: PeerId(voter), msg: Message::State(s) }, now);
    };
    for (v, seed) in [(4, 0.5), (5, 0.75), (6, 1.0)] {
        announce(&mut p, v, &other(seed));
    }
    announce(&mut p, 2, &x);
    let out = vote_and_serve(&mut p, &[3], &x, now);
    assert!(offences(&out).is_empty());
    assert_eq!(p.state(0).round, 0, "adopted on a plurality");
    assert_eq!(p.metrics().unbacked_states, 1);
    // A third voter makes it three of five; the state is chased again a period later.
    let out = vote_and_serve(&mut p, &[4], &x, now + 1_100);
    assert!(offences(&out).is_empty());
    assert_eq!(p.state(0), &x, "a backed state was not adopted");
}
