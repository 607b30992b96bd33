//! The peer's policies on virtual time: a late joiner's hold, re-announcements for
//! members that join, and finishing once the swarm is quiet.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;
use crate::delta::ContentHash;
use crate::fragment::{FragmentPlan, TensorSpec};
use crate::proto::{Losses, Message, PeerId, RawSettings, Settings, Timer};

const PERIOD: Millis = 1_000;

fn protocol(me: u64) -> Protocol {
    protocol_with_lag(me, RawSettings::default().merge_lag)
}

fn protocol_with_lag(me: u64, merge_lag: u64) -> Protocol {
    let t = |n: &str, len: usize, emb: bool| TensorSpec {
        name: n.into(),
        shape: vec![len],
        is_embedding: emb,
    };
    let plan =
        FragmentPlan::new(&[t("emb", 8, true), t("a", 6, false), t("b", 4, false)], 2).unwrap();
    let raw = RawSettings {
        h: 10,
        fragments: 2,
        step_ms: 100,
        grace_cap_ms: 100,
        merge_lag,
        ..RawSettings::default()
    };
    let settings = Settings::new(raw).unwrap().with_tokens_per_step(16);
    let init = plan.fragments.iter().map(|f| vec![0.5; f.numel()]).collect();
    Protocol::new(PeerId(me), settings, &plan, init, me).unwrap()
}

/// A peer training alone from `from` until `until`: timers fire in order, and every
/// snapshot is answered at once with its anchor moved a little (ten steps of progress).
/// Returns every other effect.
fn train_alone(p: &mut Peer, from: Millis, until: Millis) -> Vec<Effect> {
    let mut timers = BinaryHeap::new();
    let mut seen = Vec::new();
    let mut now = from;
    let mut pending = p.start(now);
    loop {
        for e in std::mem::take(&mut pending) {
            match e {
                Effect::Core(Output::SetTimer { at, timer }) => timers.push(Reverse((at, timer))),
                Effect::Core(Output::Snapshot { fragment, round }) => {
                    let anchor = &p.protocol().state(fragment).anchor;
                    let params = anchor.iter().map(|v| v - 0.01).collect();
                    let ev = Event::Snapshot { fragment, round, params, tokens: 160, steps: 10 };
                    pending.extend(p.handle(PeerEvent::Core(ev), now));
                }
                other => seen.push(other),
            }
        }
        if pending.is_empty() {
            match timers.pop() {
                Some(Reverse((at, timer))) if at <= until => {
                    now = at;
                    pending = p.handle(PeerEvent::Core(Event::Timer(timer)), now);
                }
                _ => break,
            }
        }
    }
    seen
}

fn releases(effects: &[Effect]) -> Vec<&Release> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Release(r) => Some(r),
            _ => None,
        })
        .collect()
}

/// A peer that joins a running swarm waits for the swarm's anchors, but not for ever:
/// when nobody answers, its wait ends after two periods and a margin.
#[test]
fn a_late_joiner_nobody_answers_is_held_then_released() {
    let joined = 10 * PERIOD;
    let mut p = Peer::new(protocol(2), PERIOD, Some(joined));
    assert!(p.holding());
    let deadline = joined + 2 * PERIOD + QUIET_MARGIN_MS;
    assert_eq!(p.next_poll(), Some(deadline));
    assert!(releases(&p.poll(deadline - 1)).is_empty(), "released before its wait ended");
    let effects = p.poll(deadline);
    let r = releases(&effects);
    assert_eq!(r.len(), 1);
    assert!(!r[0].caught_up && !r[0].heard_any, "{:?}", r[0]);
    assert!(!p.holding());
    assert!(releases(&p.poll(deadline + 1)).is_empty(), "released twice");
}

/// A joiner is released the moment it holds the swarm's state, long before its wait ends.
#[test]
fn a_late_joiner_is_released_once_it_holds_the_swarms_anchors() {
    let mut swarm = Peer::new(protocol(1), PERIOD, None);
    let joined = 6 * PERIOD;
    train_alone(&mut swarm, 0, joined);
    let mut joiner = Peer::new(protocol(2), PERIOD, Some(joined));
    let mut effects = joiner.start(joined);
    // The swarm says again where it is (its states) and what it contributed (which the
    // joiner fetches and verifies, crediting the swarm's vote); each fetch is answered.
    let said: Vec<Message> = swarm
        .protocol_mut()
        .reannounce(joined)
        .into_iter()
        .filter_map(|o| match o {
            Output::Publish { msg, .. } => Some(msg),
            _ => None,
        })
        .collect();
    assert!(said.iter().filter(|m| matches!(m, Message::State(_))).count() == 2);
    let mut queue: Vec<PeerEvent> = said
        .into_iter()
        .map(|msg| PeerEvent::Core(Event::Message { from: PeerId(1), msg }))
        .collect();
    queue.reverse();
    while let Some(ev) = queue.pop() {
        for e in joiner.handle(ev, joined + 1) {
            match e {
                Effect::Core(Output::Fetch { hash, .. }) => {
                    let bytes = swarm.payload(&hash).expect("the swarm serves it");
                    queue.push(PeerEvent::Core(Event::Fetched { from: PeerId(1), hash, bytes }));
                }
                // The trained swarm's anchors beat the joiner's initial ones.
                Effect::Core(Output::Weigh { fragment, hash, .. }) => {
                    let losses = Some(Losses { offered: 1.0, own: 2.0 });
                    queue.push(PeerEvent::Core(Event::Weighed { fragment, hash, losses }));
                }
                other => effects.push(other),
            }
        }
    }
    let r = releases(&effects);
    assert_eq!(r.len(), 1, "not released on holding the anchors");
    assert!(r[0].caught_up && r[0].heard_any, "{:?}", r[0]);
    let rounds: Vec<u64> = (0..2).map(|f| swarm.protocol().state(f).round).collect();
    assert_eq!(r[0].rounds, rounds);
}

/// A fresh peer of a new swarm (not late) is never held.
#[test]
fn a_peer_on_time_is_not_held() {
    let mut p = Peer::new(protocol(1), PERIOD, None);
    assert!(!p.holding());
    assert!(releases(&train_alone(&mut p, 0, 3 * PERIOD)).is_empty());
}

/// A member that joins hears our states again soon, and once more a little later.
#[test]
fn members_that_join_hear_our_states_again() {
    let mut p = Peer::new(protocol(1), PERIOD, None);
    let t = 5 * PERIOD;
    train_alone(&mut p, 0, t);
    assert!(p.handle(PeerEvent::RunPeerJoined, t).is_empty());
    // A second member joining at once adds no third announcement.
    p.handle(PeerEvent::RunPeerJoined, t + 10);
    let states = |e: &[Effect]| {
        e.iter()
            .filter(|e| matches!(e, Effect::Core(Output::Publish { msg: Message::State(_), .. })))
            .count()
    };
    assert_eq!(p.next_poll(), Some(t + REANNOUNCE_SOON_MS));
    assert_eq!(states(&p.poll(t + REANNOUNCE_SOON_MS - 1)), 0);
    assert_eq!(states(&p.poll(t + REANNOUNCE_SOON_MS)), 2);
    assert_eq!(p.next_poll(), Some(t + REANNOUNCE_LATE_MS));
    assert_eq!(states(&p.poll(t + REANNOUNCE_LATE_MS)), 2);
    assert_eq!(p.next_poll(), None);
    assert_eq!(states(&p.poll(t + 10 * PERIOD)), 0);
}

/// What a peer offers to fetchers is its state of each fragment and its latest own deltas,
/// each offered before the announcement that names it; older ones are withdrawn.
#[test]
fn a_peer_offers_its_states_and_latest_deltas() {
    let mut p = Peer::new(protocol(1), PERIOD, None);
    let effects = train_alone(&mut p, 0, 12 * PERIOD);
    let mut offered: Vec<(ContentHash, bool)> = Vec::new();
    let mut own = Vec::new();
    for e in &effects {
        match e {
            Effect::Offer { hash, payload, pinned } => {
                assert_eq!(ContentHash::of(payload), *hash);
                offered.push((*hash, *pinned));
            }
            Effect::Withdraw { hash } => offered.retain(|(h, _)| h != hash),
            Effect::Core(Output::Publish { msg, .. }) => {
                let hash = msg.payload_hash();
                assert!(offered.iter().any(|(h, _)| *h == hash), "announced before offered");
                if let Message::Contribution(c) = msg {
                    own.push(c.hash);
                }
            }
            _ => {}
        }
    }
    // Two fragments × (max_lateness 3 + 2) own deltas stay, pinned, and both states.
    let pinned: Vec<_> = offered.iter().filter(|(_, pinned)| *pinned).map(|(h, _)| *h).collect();
    assert_eq!(pinned.len(), 10, "{} own deltas made", own.len());
    assert!(own.len() > 12, "{} own deltas made", own.len());
    assert_eq!(pinned[..], own[own.len() - 10..]);
    assert!(p.payload(&own[0]).is_none(), "the oldest delta was let go");
    assert!(own[own.len() - 10..].iter().all(|h| p.payload(h).is_some()));
    for f in 0..2 {
        let hash = p.protocol().state_hash(f);
        assert!(p.protocol().state(f).round > 0);
        assert_eq!(p.payload(&hash).map(|b| ContentHash::of(&b)), Some(hash));
        assert!(offered.contains(&(hash, false)));
    }
    assert_eq!(offered.len(), 12, "nothing else stays offered");
}

/// A trained peer merges on until nothing changed for the quiet time, then finishes once,
/// applying its final anchors; a merge or an adoption restarts the quiet time.
#[test]
fn a_trained_peer_finishes_once_the_swarm_is_quiet() {
    let mut p = Peer::new(protocol(1), PERIOD, None);
    let t = 4 * PERIOD;
    let merged = train_alone(&mut p, 0, t)
        .iter()
        .filter_map(|e| match e {
            Effect::Core(Output::Merged(r)) => Some(r.round),
            _ => None,
        })
        .count();
    assert!(merged > 0, "training alone merged nothing");
    p.handle(PeerEvent::Trained, t);
    let quiet = p.quiet_ms();
    assert_eq!(quiet, QUIET_MIN_MS, "period 1 s + grace 0.1 s + margin is under the minimum");
    assert_eq!(p.next_poll(), Some(t + quiet + 1));
    let finishes = |e: &[Effect]| {
        e.iter()
            .filter_map(|e| match e {
                Effect::Finish { anchors } => Some(anchors.len()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert!(finishes(&p.poll(t + quiet)).is_empty(), "finished before the swarm was quiet");
    // Training advanced (a step report): the quiet time starts again.
    p.handle(PeerEvent::Stepped, t + quiet);
    assert!(finishes(&p.poll(t + quiet + 1)).is_empty());
    assert_eq!(finishes(&p.poll(t + 2 * quiet + 1)), vec![2]);
    assert!(p.finishing());
    assert!(finishes(&p.poll(t + 3 * quiet)).is_empty(), "finished twice");
    assert!(finishes(&p.handle(PeerEvent::Stop, t + 3 * quiet)).is_empty());
}

/// A contested round (contributions arrived, none agreed: here the peer's own delta and one
/// pointing the other way) is the swarm at work, not a quiet swarm: a trained peer's quiet
/// time starts again, as after a merge, so it does not leave with a stale anchor while
/// others still contend.
#[test]
fn a_contested_round_restarts_the_quiet_time() {
    let mut p = Peer::new(protocol_with_lag(1, 0), PERIOD, None);
    p.start(0);
    p.handle(PeerEvent::Trained, 0);
    let quiet = p.quiet_ms();
    let open = Event::Timer(Timer::Open { fragment: 0, round: 1 });
    p.handle(PeerEvent::Core(open), PERIOD);
    let numel = p.protocol().state(0).anchor.len();
    let params = vec![0.4; numel];
    let own = Event::Snapshot { fragment: 0, round: 1, params, tokens: 64, steps: 4 };
    let effects = p.handle(PeerEvent::Core(own), PERIOD);
    let close = effects.iter().find_map(|e| match e {
        Effect::Core(Output::SetTimer { at, timer: t @ Timer::Close { .. } }) => Some((*at, *t)),
        _ => None,
    });
    let (at, close) = close.expect("the own delta is the quorum: the round's close is set");
    // Another author's delta of the round, pointing against this peer's (same plan).
    let (c, bytes) = crate::proto::tests::delta_by(2, 1, -0.1);
    let hash = c.hash;
    let from = PeerId(2);
    p.handle(PeerEvent::Core(Event::Message { from, msg: Message::Contribution(c) }), PERIOD);
    let fetched = Event::Fetched { from, hash, bytes };
    p.handle(PeerEvent::Core(fetched), PERIOD);
    let effects = p.handle(PeerEvent::Core(Event::Timer(close)), at);
    let skipped =
        effects.iter().any(|e| matches!(e, Effect::Core(Output::Skipped { contested: true, .. })));
    assert!(skipped, "{effects:?}");
    assert_eq!(p.next_poll(), Some(at + quiet + 1), "the quiet time starts at the contest");
    assert!(p.poll(quiet + 1).iter().all(|e| !matches!(e, Effect::Finish { .. })));
    assert!(!p.finishing());
}

/// Stopped before its target, a peer finishes at once with no anchors to apply; from then
/// on the trainer gets no anchors and snapshots are answered with the anchor itself.
#[test]
fn a_stopped_peer_finishes_at_once_and_trains_no_more() {
    let mut p = Peer::new(protocol(1), PERIOD, None);
    let out = p.start(0);
    let effects = p.handle(PeerEvent::Stop, 10);
    assert!(matches!(&effects[..], [Effect::Finish { anchors }] if anchors.is_empty()));
    // The first round opens: no snapshot goes to the trainer, no anchor comes back to it.
    let open = out
        .iter()
        .find_map(|e| match e {
            Effect::Core(Output::SetTimer { at, timer }) => Some((*at, *timer)),
            _ => None,
        })
        .unwrap();
    let effects = p.handle(PeerEvent::Core(Event::Timer(open.1)), open.0);
    let to_trainer = effects
        .iter()
        .filter(|e| matches!(e, Effect::Core(Output::Snapshot { .. } | Output::Apply(_))))
        .count();
    assert_eq!(to_trainer, 0, "{effects:?}");
}

/// The clock is the run's timeline (wall time minus the manifest's epoch): a far-future
/// time (a manifest's epoch of 0 and a skewed clock, or a jump) panics nothing.
#[test]
fn the_clock_at_its_end_panics_nothing() {
    let end = Millis::MAX - 10;
    let mut p = Peer::new(protocol(1), PERIOD, Some(end));
    let _ = p.start(end);
    for ev in [PeerEvent::RunPeerJoined, PeerEvent::Stepped, PeerEvent::Trained] {
        let _ = p.handle(ev, end);
        let _ = p.next_poll();
        let _ = p.poll(Millis::MAX);
    }
    assert!(!p.holding(), "a wait that ends at the end of time ends");
}
