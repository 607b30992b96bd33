//! Sampled contributions (src/proto/sampling.rs) through the core: outside its slot a peer
//! banks its work and publishes nothing; in its slot the delta carries the banked work and
//! claims its tokens and steps; announcements outside their author's slot are not fetched.

use super::{delta_by, plan};
use crate::delta::ContentHash;
use crate::proto::sampling::Sampling;
use crate::proto::*;

/// Peer `me` of a run wanting one contribution a round, whose states say every peer
/// contributes every `period` rounds.
fn sampled_peer(me: u64, period: u32) -> Protocol {
    let plan = plan();
    let settings = Settings::new(RawSettings {
        h: 10,
        fragments: 2,
        step_ms: 100,
        grace_cap_ms: 100,
        merge_lag: 0,
        contributors: 1,
        ..RawSettings::default()
    })
    .unwrap()
    .with_tokens_per_step(16);
    let states = plan
        .fragments
        .iter()
        .map(|f| {
            let mut s = FragmentState::initial(f.id as u32, vec![0.5; f.numel()]);
            s.sampling = Sampling { swarm: period, period, prev_period: period };
            s
        })
        .collect();
    Protocol::restore(PeerId(me), settings, &plan, states, me).unwrap()
}

fn snapshot(p: &mut Protocol, round: u64, value: f32, now: Millis) -> Vec<Output> {
    p.handle(Event::Timer(Timer::Open { fragment: 0, round }), now);
    let params = vec![value; plan().fragments[0].numel()];
    p.handle(Event::Snapshot { fragment: 0, round, params, tokens: 100, steps: 10 }, now + 1)
}

fn published(out: &[Output]) -> Option<ContributionAnnounce> {
    out.iter().find_map(|o| match o {
        Output::Publish { msg: Message::Contribution(c), .. } => Some(c.clone()),
        _ => None,
    })
}

#[test]
fn outside_its_slot_a_peer_banks_its_work_and_sends_it_whole_in_the_next() {
    let mut p = sampled_peer(3, 2);
    let s = p.state(0).sampling;
    let off = (1..10).find(|&r| !s.publishes(PeerId(3), 0, r)).unwrap();
    // Outside the slot: nothing published, the delta (0.5 − 0.25) waits in the residual.
    let out = snapshot(&mut p, off, 0.25, off * 1000);
    assert!(published(&out).is_none());
    assert_eq!(p.metrics().banked, 1);
    // The node keeps the residual on disk when told, so a restart sends the work.
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::Banked { fragment: 0, round } if *round == off)));
    assert!(p.residual(0).iter().all(|&r| r == 0.25), "{:?}", p.residual(0));
    // The next round is its slot: the delta holds both rounds' work (0.25 + 0.125) and
    // claims both rounds' tokens and steps; what is left is the codec's rounding only.
    let on = off + 1;
    let out = snapshot(&mut p, on, 0.375, on * 1000);
    let c = published(&out).expect("published in its slot");
    assert_eq!((c.round, c.tokens, c.steps), (on, 200, 20));
    assert!(p.residual(0).iter().all(|r| r.abs() < 0.01), "{:?}", p.residual(0));
}

#[test]
fn work_long_before_a_peers_slot_is_not_banked() {
    // Period 20: a delta holds at most MAX_BANKED_ROUNDS (16) rounds, those just before the
    // slot; earlier work would reach the anchor too late.
    let mut p = sampled_peer(3, 20);
    let s = p.state(0).sampling;
    let slot = (1..40).find(|&r| s.publishes(PeerId(3), 0, r)).unwrap() + 20;
    let early = slot - 17;
    let out = snapshot(&mut p, early, 0.25, early * 1000);
    assert!(published(&out).is_none());
    assert_eq!((p.metrics().unsent, p.metrics().banked), (1, 0));
    assert!(p.residual(0).iter().all(|&r| r == 0.0), "{:?}", p.residual(0));
    // Sixteen rounds before it, banked.
    let late = slot - 15;
    snapshot(&mut p, late, 0.25, late * 1000);
    assert_eq!((p.metrics().unsent, p.metrics().banked), (1, 1));
    assert!(p.residual(0).iter().all(|&r| r == 0.25), "{:?}", p.residual(0));
}

#[test]
fn an_announcement_outside_its_author_s_slot_is_not_fetched() {
    let mut p = sampled_peer(1, 2);
    let s = p.state(0).sampling;
    let round = 2;
    let outside = (10..100).find(|&a| !s.in_slot(PeerId(a), 0, round)).unwrap();
    let inside = (10..100).find(|&a| s.in_slot(PeerId(a), 0, round)).unwrap();
    let fetches = |out: &[Output]| out.iter().filter(|o| matches!(o, Output::Fetch { .. })).count();
    let (c, _) = delta_by(outside, round, 0.1);
    let out =
        p.handle(Event::Message { from: PeerId(outside), msg: Message::Contribution(c) }, 2000);
    assert_eq!((fetches(&out), p.metrics().off_slot), (0, 1));
    assert_eq!(p.metrics().refused_from.get(&PeerId(outside)), Some(&1));
    // Not an offence: a peer on another state may see other slots.
    assert!(!out.iter().any(|o| matches!(o, Output::Misbehaved { .. })));
    let (c, _) = delta_by(inside, round, 0.1);
    let out =
        p.handle(Event::Message { from: PeerId(inside), msg: Message::Contribution(c) }, 2000);
    assert_eq!(fetches(&out), 1);
}

/// Peer 3 of a swarm of period `period`, moved to the swarm's state of round 5 (as if it had
/// merged the round with another set and adopted), having published a vote of round
/// `announced`; returns whether the adoption was announced.
fn adopt_round_five(p: &mut Protocol, announced: u64) -> bool {
    let mut swarm = p.state(0).clone();
    swarm.round = 5;
    swarm.anchor[0] = 0.25;
    let bytes: bytes::Bytes = swarm.to_bytes().into();
    let (me, settings) = (p.me, p.settings.clone());
    p.lanes[0].announced_round = announced;
    let hash = ContentHash::of(&bytes);
    let out = p.lanes[0].adopt(me, swarm, hash, bytes, &settings, &mut p.metrics);
    assert_eq!(p.state(0).hash(), hash);
    announces_state(&out)
}

fn announces_state(out: &[Output]) -> bool {
    out.iter().any(|o| matches!(o, Output::Publish { msg: Message::State(_), .. }))
}

#[test]
fn in_a_sampled_swarm_an_adoption_is_announced_only_over_a_vote_others_count() {
    // It merged round 5 silently (not its slot): nobody counts a vote of its for round 5,
    // so following the swarm is silent.
    assert!(!adopt_round_five(&mut sampled_peer(3, 4), 4));
    // It announced a state (or a delta on a base) of round 5: others count that vote until
    // a newer one replaces it, so the adoption is announced.
    assert!(adopt_round_five(&mut sampled_peer(3, 4), 5));
    assert!(adopt_round_five(&mut sampled_peer(3, 4), 6));
    // Without sampling every merge is announced, and so is every adoption.
    assert!(adopt_round_five(&mut sampled_peer(3, 1), 0));
}

#[test]
fn a_silent_state_nobody_holds_is_announced_only_where_it_leads() {
    let now = 5 * 1000 + 500;
    // Nobody else announced a state of round 5: this peer's is the only one heard of, and
    // it is announced so the swarm can reconcile with it.
    let mut p = sampled_peer(3, 4);
    adopt_round_five(&mut p, 4);
    let mut out = Vec::new();
    p.reconcile(0, now, &mut out);
    assert!(announces_state(&out), "{out:?}");
    // Two credited voters hold another state of round 5: it leads, this peer follows it
    // (here: fetches it) and announces nothing of its own.
    let mut p = sampled_peer(3, 4);
    adopt_round_five(&mut p, 4);
    let theirs = ContentHash::of(b"the swarm's state of round 5");
    for v in [7, 8] {
        p.lanes[0].votes.credit(PeerId(v), 5);
        p.lanes[0].votes.record(PeerId(v), 5, theirs);
    }
    let mut out = Vec::new();
    p.reconcile(0, now, &mut out);
    assert!(!announces_state(&out), "{out:?}");
    assert!(
        out.iter().any(|o| matches!(o, Output::Fetch { hash, .. } if *hash == theirs)),
        "{out:?}"
    );
}
