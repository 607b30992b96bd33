//! Recipes (src/proto/evidence.rs): the table of credited voters' recipes, states
//! recomputed through a parent this peer never held, and why a state that could not be
//! recomputed was fetched.

use super::peer;
use super::states::{
    announce_with_recipe, deliver_late, fetched, merge_round, merged_round_one, recipe_of,
    vote_and_serve,
};
use crate::delta::ContentHash;
use crate::proto::*;

#[test]
fn every_credited_voter_keeps_its_latest_recipe_however_many_states_a_round_splits_into() {
    let mut p = peer(1, 0);
    p.start(0);
    let lane = &mut p.lanes[0];
    let recipe =
        |i: u64| Recipe { parent: ContentHash::of(&i.to_le_bytes()), merged: vec![i].into() };
    let state = |i: u64| ContentHash::of(format!("state {i}").as_bytes());
    // 300 voters, each on a state of its own (a table of 256 by hash refused the rest).
    for v in 100..400 {
        lane.votes.credit(PeerId(v), 1);
        lane.note_recipe(PeerId(v), state(v), 1, recipe(v));
    }
    assert_eq!(lane.recipe_for(state(399), 1), Some(&recipe(399)));
    // A voter's next recipe replaces its last, which is kept as the one before (the recipe
    // of its state's parent); a third pushes the first out, so one voter cannot fill the
    // table, and an older one does not come back.
    lane.note_recipe(PeerId(100), state(1000), 2, recipe(1000));
    assert_eq!(lane.recipe_for(state(100), 1), Some(&recipe(100)));
    lane.note_recipe(PeerId(100), state(2000), 3, recipe(2000));
    lane.note_recipe(PeerId(100), state(100), 1, recipe(100));
    assert_eq!((lane.recipes.len(), lane.recipes_before.len()), (300, 1));
    assert_eq!(lane.recipe_for(state(100), 1), None);
    assert_eq!(lane.recipe_for(state(1000), 2), Some(&recipe(1000)));
    assert_eq!(lane.recipe_for(state(2000), 3), Some(&recipe(2000)));
    // An uncredited voter's recipe is not kept.
    lane.note_recipe(PeerId(5000), state(5000), 1, recipe(5000));
    assert_eq!(lane.recipe_for(state(5000), 1), None);
}

#[test]
fn the_recipe_tried_is_the_one_most_voters_announced() {
    let mut p = peer(1, 0);
    p.start(0);
    let lane = &mut p.lanes[0];
    let state = ContentHash::of(b"the swarm's state");
    let honest = Recipe { parent: ContentHash::of(b"parent"), merged: vec![3, 7].into() };
    let lie = Recipe { parent: ContentHash::of(b"parent"), merged: vec![3].into() };
    for v in [2, 5, 6] {
        lane.votes.credit(PeerId(v), 1);
    }
    // The liar has the smallest id: alone against one honest voter it is tried (ties go
    // to the smallest id), against two it is not.
    lane.note_recipe(PeerId(2), state, 1, lie.clone());
    lane.note_recipe(PeerId(5), state, 1, honest.clone());
    assert_eq!(lane.recipe_for(state, 1), Some(&lie));
    lane.note_recipe(PeerId(6), state, 1, honest.clone());
    assert_eq!(lane.recipe_for(state, 1), Some(&honest));
    assert_eq!(lane.recipe_for(state, 2), None);
}

#[test]
fn every_state_fetch_is_counted_with_why_it_was_not_recomputed() {
    // The swarm (peer 7) merged the round-1 deltas of 2, 3 and 4; peer 1 merged 2 and 3.
    let theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]).state(0).clone();
    let honest = recipe_of(&theirs);
    let causes = |late: bool, recipe: Option<Recipe>| {
        let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
        if late {
            deliver_late(&mut p);
        }
        let out = match recipe {
            Some(r) => announce_with_recipe(&mut p, &[2, 3, 4], &theirs, r, 1200),
            None => vote_and_serve(&mut p, &[2, 3, 4], &theirs, 1200),
        };
        assert_eq!(fetched(&out), Some(theirs.hash()), "the state was not fetched");
        p.metrics().state_fetch_causes
    };
    let one = |f: fn(&mut FetchCauses) -> &mut u64| {
        let mut c = FetchCauses::default();
        *f(&mut c) = 1;
        c
    };
    assert_eq!(causes(true, None), one(|c| &mut c.no_recipe));
    let elsewhere = Recipe { parent: ContentHash::of(b"another lineage"), ..honest.clone() };
    assert_eq!(causes(true, Some(elsewhere)), one(|c| &mut c.no_parent));
    // Peer 4's delta never reached this peer.
    assert_eq!(causes(false, Some(honest.clone())), one(|c| &mut c.missing_deltas));
    let lie = Recipe { merged: honest.merged[..2].into(), ..honest };
    assert_eq!(causes(true, Some(lie)), one(|c| &mut c.recipe_failed));
}

#[test]
fn a_state_whose_parent_was_never_held_here_is_recomputed_through_that_parent() {
    // The swarm (peer 7) merged all three round-1 deltas, then round 2 on top. Peer 1
    // merged round 1 without peer 4's delta (it came late), heard the swarm's round-1
    // state but merged round 2 on its own lineage before reconciling.
    let mut q = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]);
    let theirs1 = q.state(0).clone();
    let round_two = [(2, 0.4), (3, 0.5)];
    merge_round(&mut q, 2, &round_two);
    let theirs2 = q.state(0).clone();
    assert_eq!(theirs2.parent, theirs1.hash());
    let announce = |p: &mut Protocol, state: &FragmentState, now: Millis| {
        let hash = state.hash();
        let size = state.wire_len() as u64;
        let recipe = Some(recipe_of(state));
        let took = Some(state.took());
        let s = StateAnnounce {
            fragment: 0,
            round: state.round,
            hash,
            size,
            took,
            recipe,
            parent: Some(state.parent),
        };
        for v in [2, 3, 4] {
            let msg = Message::State(s.clone());
            p.handle(Event::Message { from: PeerId(v), msg }, now);
        }
    };
    for keep_grandparent in [true, false] {
        let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
        deliver_late(&mut p);
        announce(&mut p, &theirs1, 1200);
        merge_round(&mut p, 2, &round_two);
        assert_ne!(p.state(0).parent, theirs1.hash());
        if !keep_grandparent {
            p.lanes[0].prior_before = None;
        }
        announce(&mut p, &theirs2, 2200);
        let reconcile = Timer::Reconcile { fragment: 0, round: 2 };
        let out = p.handle(Event::Timer(reconcile), 2200);
        if keep_grandparent {
            assert_eq!(fetched(&out), None, "fetched a state it could recompute");
            assert_eq!(p.state(0), &theirs2, "the recomputed state was not adopted");
            assert_eq!(p.metrics().recomputed, 1);
        } else {
            // Without the state before its parent, it is fetched, and counted as such.
            assert_eq!(fetched(&out), Some(theirs2.hash()));
            assert_eq!(p.metrics().state_fetch_causes.no_parent, 1);
        }
    }
}

#[test]
fn the_state_before_the_prior_is_dropped_once_the_swarm_holds_this_peers_state() {
    let round_two = [(2, 0.4), (3, 0.5)];
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    merge_round(&mut p, 2, &round_two);
    assert!(p.lanes[0].prior_before.is_some());
    // The voters hold this peer's round-2 state: nothing descends from another lineage.
    let mine = p.state(0).clone();
    announce_with_recipe(&mut p, &[2, 3], &mine, recipe_of(&mine), 2200);
    assert!(p.lanes[0].prior_before.is_none(), "kept a grandparent nobody needs");
}

#[test]
fn a_state_fetched_again_after_a_failed_fetch_is_counted_as_a_retry() {
    let theirs = merged_round_one(7, &[(2, 0.1), (3, 0.2), (4, 0.3)]).state(0).clone();
    let mut p = merged_round_one(1, &[(2, 0.1), (3, 0.2)]);
    let out = announce_with_recipe(&mut p, &[2, 3, 4], &theirs, recipe_of(&theirs), 1200);
    assert_eq!(fetched(&out), Some(theirs.hash()));
    let failed =
        Event::FetchFailed { from: PeerId(2), hash: theirs.hash(), denied: vec![], silent: vec![] };
    p.handle(failed, 1300);
    // A state whose fetch failed is not chased again for two periods.
    let later = 1300 + 2 * p.settings().period_ms() + 1;
    let reconcile = Timer::Reconcile { fragment: 0, round: 1 };
    let out = p.handle(Event::Timer(reconcile), later);
    assert_eq!(fetched(&out), Some(theirs.hash()), "the state was not fetched again");
    let c = p.metrics().state_fetch_causes;
    assert_eq!((c.missing_deltas, c.retry, c.no_recipe), (1, 1, 0));
}
