//! States are adopted on evidence (src/proto/evidence.rs): a state naming a parent this
//! peer holds is recomputed bit for bit, so credited voters cannot impose a forgery on a
//! peer that can check it; a state nobody here can recompute needs at least half the
//! round's counted voters, not a plurality. A state fetched instead of recomputed is
//! counted with the reason.

use super::{credit, delta_by, offences, peer, timers};
use crate::delta::ContentHash;
use crate::proto::*;
use bytes::Bytes;

pub(super) fn fetched(out: &[Output]) -> Option<ContentHash> {
    out.iter().find_map(|o| match o {
        Output::Fetch { hash, .. } => Some(*hash),
        _ => None,
    })
}

/// `voters` vote `state` for its round and reconciliation runs; the peer fetches the state
/// if it chases it, and gets it.
pub(super) fn vote_and_serve(
    p: &mut Protocol,
    voters: &[u64],
    state: &FragmentState,
    now: Millis,
) -> Vec<Output> {
    let bytes: Bytes = state.to_bytes().into();
    let hash = ContentHash::of(&bytes);
    let s = super::vote(state.round, hash, bytes.len() as u64);
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
pub(super) fn merged_round_one(me: u64, others: &[(u64, f32)]) -> Protocol {
    let mut p = peer(me, 0);
    p.start(0);
    merge_round(&mut p, 1, others);
    p
}

/// `p` merges round `round` of fragment 0 (open at `round` s) from that round's deltas of
/// `others`; nothing trained, so nothing of its own.
pub(super) fn merge_round(p: &mut Protocol, round: u64, others: &[(u64, f32)]) {
    let t = round * 1000;
    p.handle(Event::Timer(Timer::Open { fragment: 0, round }), t);
    let params = p.state(0).anchor.clone();
    p.handle(Event::Snapshot { fragment: 0, round, params, tokens: 0, steps: 0 }, t);
    for &(author, value) in others {
        let (c, bytes) = delta_by(author, round, value);
        let from = PeerId(author);
        p.handle(Event::Message { from, msg: Message::Contribution(c.clone()) }, t + 1);
        p.handle(Event::Fetched { from, hash: c.hash, bytes }, t + 1);
    }
    p.handle(Event::Timer(Timer::Close { fragment: 0, round }), t + 100);
}

/// The recipe a peer holding `state` announces with it.
pub(super) fn recipe_of(state: &FragmentState) -> Recipe {
    let (_, ids) = state.log.back().unwrap();
    let mut merged: Vec<u64> = ids.iter().map(ContentHash::short).collect();
    merged.sort_unstable();
    Recipe { parent: state.parent, merged: merged.into() }
}

/// Peer 4's round-1 delta reaches `p` after its merge; returns its announcement.
pub(super) fn deliver_late(p: &mut Protocol) -> ContributionAnnounce {
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
    // Each voter is named among the refused, not only the one that served it.
    let named: Vec<u64> = p.metrics().refused_from.keys().map(|v| v.0).collect();
    assert_eq!(named, vec![2, 3, 4]);
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
pub(super) fn announce_with_recipe(
    p: &mut Protocol,
    voters: &[u64],
    state: &FragmentState,
    recipe: Recipe,
    now: Millis,
) -> Vec<Output> {
    let mut out = announce_state(p, voters, state, recipe, now);
    let reconcile = Timer::Reconcile { fragment: 0, round: state.round };
    out.extend(p.handle(Event::Timer(reconcile), now));
    out
}

/// `voters` announce `state` with `recipe` (its count too). Returns what `p` output.
fn announce_state(
    p: &mut Protocol,
    voters: &[u64],
    state: &FragmentState,
    recipe: Recipe,
    now: Millis,
) -> Vec<Output> {
    let hash = state.hash();
    let size = state.wire_len() as u64;
    let took = Some(state.took());
    let s = StateAnnounce {
        fragment: 0,
        round: state.round,
        hash,
        size,
        took,
        recipe: Some(recipe),
        parent: Some(state.parent),
    };
    let mut out = Vec::new();
    for &v in voters {
        let msg = Message::State(s.clone());
        out.extend(p.handle(Event::Message { from: PeerId(v), msg }, now));
    }
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
    let honest = Recipe { parent: theirs.parent, merged: ids.clone().into() };
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
    let lie = Recipe { parent: theirs.parent, merged: ids[..2].into() };
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
fn a_state_the_others_take_after_the_first_look_is_followed_at_the_second() {
    // Peer 1 merged round 1 without peer 4's late delta, peer 7 all three. Round 2 opens;
    // at its first look no other state is heard, so peer 1 keeps its own. Then peers 2, 3
    // and 4 announce peer 7's state (their adoptions), and the round looks again before
    // the next one opens.
    let theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]).state(0).clone();
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    deliver_late(&mut p);
    let out = p.handle(Event::Timer(Timer::Open { fragment: 0, round: 2 }), 2000);
    let mut looks: Vec<Millis> = timers(&out)
        .into_iter()
        .filter(|(_, t)| matches!(t, Timer::Reconcile { fragment: 0, round: 2 }))
        .map(|(at, _)| at)
        .collect();
    looks.sort_unstable();
    let [first, second] = looks[..] else { panic!("{looks:?}: not two looks a round") };
    assert!(first < second && second < 3000, "{looks:?}");
    let reconcile = Event::Timer(Timer::Reconcile { fragment: 0, round: 2 });
    p.handle(reconcile.clone(), first);
    assert_ne!(p.state(0), &theirs, "nothing else was heard at the first look");
    announce_state(&mut p, &[2, 3, 4], &theirs, recipe_of(&theirs), first + 10);
    assert_ne!(p.state(0), &theirs, "a vote of the same round is not acted on at once");
    p.handle(reconcile, second);
    assert_eq!(p.state(0), &theirs, "the others' state was not followed");
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
        let s = super::vote(1, hash, bytes.len() as u64);
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

#[test]
fn a_recipe_short_of_a_delta_in_flight_waits_for_it_instead_of_fetching_the_state() {
    let theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]).state(0).clone();
    for lands in [true, false] {
        let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
        // Peer 4's delta is announced after the merge and still on its way when
        // reconciliation finds the swarm's state lists it.
        let (c, bytes) = delta_by(4, 1, 0.3);
        let msg = Message::Contribution(c.clone());
        let out = p.handle(Event::Message { from: PeerId(4), msg }, 1150);
        assert_eq!(fetched(&out), Some(c.hash));
        let out = announce_with_recipe(&mut p, &[2, 3, 4], &theirs, recipe_of(&theirs), 1200);
        assert_eq!(fetched(&out), None, "fetched the state while the delta was on its way");
        let from = PeerId(4);
        let out = if lands {
            p.handle(Event::Fetched { from, hash: c.hash, bytes }, 1250)
        } else {
            p.handle(
                Event::FetchFailed { from, hash: c.hash, denied: vec![], silent: vec![] },
                1250,
            )
        };
        if lands {
            assert_eq!(fetched(&out), None);
            assert_eq!(p.state(0), &theirs, "the recomputed state was not adopted");
            assert_eq!((p.metrics().recomputed, p.metrics().adoptions), (1, 1));
        } else {
            // The delta will not come: the state is fetched after all.
            assert_eq!(fetched(&out), Some(theirs.hash()));
            assert_eq!(p.metrics().adoptions, 0);
        }
    }
}

#[test]
fn a_state_fetched_too_late_to_adopt_is_the_parent_the_next_one_is_recomputed_from() {
    // The swarm (peer 7) merged all three round-1 deltas; peer 1 merged two and fetches
    // the swarm's state, which arrives only after it merged round 2 on its own lineage.
    let mut q = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]);
    let theirs1 = q.state(0).clone();
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    let out = announce_with_recipe(&mut p, &[2, 3, 4], &theirs1, recipe_of(&theirs1), 1200);
    assert_eq!(fetched(&out), Some(theirs1.hash()), "the state could not be recomputed");
    let round_two = [(2, 0.4), (3, 0.5)];
    merge_round(&mut p, 2, &round_two);
    merge_round(&mut q, 2, &round_two);
    assert_eq!(p.state(0).round, 2);
    let (from, hash, bytes) = (PeerId(2), theirs1.hash(), theirs1.to_bytes().into());
    p.handle(Event::Fetched { from, hash, bytes }, 2150);
    assert_eq!(p.metrics().adoptions, 0, "a state older than its own was adopted");

    // The swarm's round-2 state names the late one as its parent: recomputed, not fetched.
    let theirs2 = q.state(0).clone();
    assert_eq!(theirs2.parent, theirs1.hash());
    let out = announce_with_recipe(&mut p, &[2, 3, 4], &theirs2, recipe_of(&theirs2), 2200);
    assert_eq!(fetched(&out), None, "the state was fetched though its parent arrived");
    assert_eq!(p.state(0), &theirs2);
    assert_eq!((p.metrics().recomputed, p.metrics().adoptions), (1, 1));
}

/// Voter `from` announces `state` claiming its merge took `took` contributions, and
/// reconciliation runs; the peer gets the state if it chases it.
fn announce_took(
    p: &mut Protocol,
    from: u64,
    state: &FragmentState,
    took: u32,
    now: Millis,
) -> Vec<Output> {
    let bytes: Bytes = state.to_bytes().into();
    let (hash, size) = (ContentHash::of(&bytes), bytes.len() as u64);
    let s = StateAnnounce {
        fragment: 0,
        round: 1,
        hash,
        size,
        took: Some(took),
        recipe: None,
        parent: None,
    };
    let from = PeerId(from);
    let mut out = p.handle(Event::Message { from, msg: Message::State(s) }, now);
    out.extend(p.handle(Event::Timer(Timer::Reconcile { fragment: 0, round: 1 }), now));
    if fetched(&out) == Some(hash) {
        out.extend(p.handle(Event::Fetched { from, hash, bytes }, now + 1));
    }
    out
}

/// Where two states have one holder each, the one merged from more contributions wins, by
/// what its holders claim; a claim the state's log does not bear out costs the claimant
/// its vote and a report, and the state is not adopted on it. The true count wins the tie.
#[test]
fn a_false_count_does_not_win_a_tie() {
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    let mine = p.state(0).clone();
    let theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (5, 0.3)]).state(0).clone();
    assert_eq!((mine.took(), theirs.took()), (2, 3));
    let lie = announce_took(&mut p, 2, &theirs, 9, 1200);
    assert_eq!(fetched(&lie), Some(theirs.hash()), "a wider claim did not win the tie");
    assert_eq!(offences(&lie), vec![Offence::ForgedState]);
    assert_eq!(p.state(0), &mine, "adopted on a false count");
    let out = announce_took(&mut p, 2, &theirs, 3, 1300);
    assert_eq!(fetched(&out), None, "a discredited voter's claim still counted");
    let out = announce_took(&mut p, 3, &theirs, 3, 1400);
    assert!(offences(&out).is_empty(), "{out:?}");
    assert_eq!(p.state(0), &theirs, "the wider merge did not win the tie");
}

/// A holder that names another parent than the fetched state's own loses its vote and is
/// reported, as one that claims another count does: a false parent would lend the state a
/// lineage it does not have.
#[test]
fn a_false_parent_claim_costs_the_vote() {
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    let mine = p.state(0).clone();
    let theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (5, 0.3)]).state(0).clone();
    let bytes: Bytes = theirs.to_bytes().into();
    let (hash, size) = (ContentHash::of(&bytes), bytes.len() as u64);
    let elsewhere = Some(ContentHash::of(b"elsewhere"));
    let took = Some(theirs.took());
    let s =
        StateAnnounce { fragment: 0, round: 1, hash, size, took, recipe: None, parent: elsewhere };
    let from = PeerId(2);
    let mut out = p.handle(Event::Message { from, msg: Message::State(s) }, 1200);
    out.extend(p.handle(Event::Timer(Timer::Reconcile { fragment: 0, round: 1 }), 1200));
    assert_eq!(fetched(&out), Some(hash), "the wider merge did not lead");
    let out = p.handle(Event::Fetched { from, hash, bytes }, 1201);
    assert_eq!(offences(&out), vec![Offence::ForgedState]);
    assert_eq!(p.state(0), &mine, "adopted on a false parent");
    assert!(!p.lanes[0].votes.counts(&from), "the false claim kept its vote");
}
