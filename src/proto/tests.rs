//! The state machine driven by hand: one round end to end, and hostile inputs.
//! (The simulator drives swarms; these pin down single transitions.)

use super::*;
use crate::delta::ContentHash;
use crate::fragment::{FragmentPlan, TensorSpec};
use bytes::Bytes;

fn plan() -> FragmentPlan {
    let t = |n: &str, len: usize, emb: bool| TensorSpec {
        name: n.into(),
        shape: vec![len],
        is_embedding: emb,
    };
    FragmentPlan::new(&[t("emb", 8, true), t("a", 6, false), t("b", 4, false)], 2).unwrap()
}

fn settings(lag: u64) -> Settings {
    Settings::new(RawSettings {
        h: 10,
        fragments: 2,
        step_ms: 100,
        grace_cap_ms: 100,
        merge_lag: lag,
        ..RawSettings::default()
    })
    .unwrap()
    .with_tokens_per_step(16)
}

fn peer(me: u64, lag: u64) -> Protocol {
    let plan = plan();
    let init = plan.fragments.iter().map(|f| vec![0.5; f.numel()]).collect();
    Protocol::new(PeerId(me), settings(lag), &plan, init, me).unwrap()
}

fn timers(out: &[Output]) -> Vec<(Millis, Timer)> {
    out.iter()
        .filter_map(|o| match o {
            Output::SetTimer { at, timer } => Some((*at, *timer)),
            _ => None,
        })
        .collect()
}

#[test]
fn one_round_alone_publishes_merges_and_applies() {
    let mut p = peer(1, 0);
    let out = p.start(0);
    // Round 1 of fragment 0 opens at T = 1000 ms, fragment 1 at T + T/2.
    assert_eq!(timers(&out)[0], (1000, Timer::Open { fragment: 0, round: 1 }));
    assert_eq!(timers(&out)[1], (1500, Timer::Open { fragment: 1, round: 1 }));
    let out = p.handle(Event::Timer(Timer::Open { fragment: 0, round: 1 }), 1000);
    assert!(out.iter().any(|o| matches!(o, Output::Snapshot { fragment: 0, round: 1 })));
    let params = vec![0.25; 8];
    let ev = Event::Snapshot { fragment: 0, round: 1, params, tokens: 100, steps: 10 };
    let out = p.handle(ev, 1001);
    let announce = out.iter().find_map(|o| match o {
        Output::Publish { msg: Message::Contribution(c), payload } => Some((c.clone(), payload)),
        _ => None,
    });
    let (announce, payload) = announce.expect("a contribution is announced");
    assert_eq!(ContentHash::of(payload), announce.hash, "the payload is the announced delta");
    // K = 1: the own delta is the quorum; the close timer is within the cap.
    let (at, close) = timers(&out)[0];
    assert!(matches!(close, Timer::Close { fragment: 0, round: 1 }) && at <= 1101);
    let out = p.handle(Event::Timer(close), at);
    let report = out.iter().find_map(|o| match o {
        Output::Merged(r) => Some(r.clone()),
        _ => None,
    });
    let report = report.expect("merged");
    assert_eq!(report.merged, vec![announce.hash]);
    let own = crate::proto::Contribution { origin: PeerId(1), tokens: 100, agreement: 1.0 };
    assert_eq!(report.contributions, vec![own]);
    assert_eq!(report.state_hash, p.state_hash(0));
    let apply = out.iter().find_map(|o| match o {
        Output::Apply(a) => Some(a.clone()),
        _ => None,
    });
    // One delta of 0.25 (4-bit exact here), outer lr 0.7, μ 0.9: 0.5 − 0.7·(0.25 + 0.225).
    let a = apply.expect("anchor applied");
    assert!((a.anchor[0] - (0.5 - 0.7 * 0.475)).abs() < 1e-6, "{}", a.anchor[0]);
    let state = out.iter().find_map(|o| match o {
        Output::Publish { msg: Message::State(s), payload } if s.round == 1 => Some((s, payload)),
        _ => None,
    });
    // The state is announced with its payload, for reconciliation, and decodes to itself.
    let (state, bytes) = state.expect("the new state is announced");
    assert_eq!((state.hash, ContentHash::of(bytes)), (p.state_hash(0), p.state_hash(0)));
    assert_eq!(p.state_payload(0), bytes);
    let back = FragmentState::from_bytes(bytes, &plan().fragments[0]).unwrap();
    assert_eq!(&back, p.state(0));
}

#[test]
fn identical_inputs_give_identical_states_on_two_peers() {
    // Two peers merge the same two deltas received in opposite orders: same bits.
    let (mut a, mut b) = (peer(1, 0), peer(2, 0));
    let (mut announces, mut bytes): (_, Vec<Bytes>) = (Vec::new(), Vec::new());
    for (p, v) in [(&mut a, 0.1f32), (&mut b, 0.3f32)] {
        p.start(0);
        p.handle(Event::Timer(Timer::Open { fragment: 0, round: 1 }), 1000);
        let ev =
            Event::Snapshot { fragment: 0, round: 1, params: vec![v; 8], tokens: 50, steps: 5 };
        for o in p.handle(ev, 1000) {
            if let Output::Publish { msg: Message::Contribution(c), payload } = o {
                announces.push(c);
                bytes.push(payload);
            }
        }
    }
    for (me, other, idx) in [(&mut a, PeerId(2), 1), (&mut b, PeerId(1), 0)] {
        let msg = Message::Contribution(announces[idx].clone());
        let out = me.handle(Event::Message { from: other, msg }, 1010);
        assert!(out.iter().any(|o| matches!(o, Output::Fetch { .. })));
        let ev =
            Event::Fetched { from: other, hash: announces[idx].hash, bytes: bytes[idx].clone() };
        me.handle(ev, 1020);
        me.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), 1100);
    }
    assert_eq!(a.state_hash(0), b.state_hash(0));
    assert_eq!(a.state(0).log.back().map(|(_, ids)| ids.len()), Some(2));
}

#[test]
fn hostile_inputs_are_refused_without_panicking() {
    let mut p = peer(1, 1);
    p.start(0);
    let bad = Message::State(StateAnnounce {
        fragment: 9,
        round: 1,
        hash: ContentHash::default(),
        size: 1,
        took: None,
        recipe: None,
        parent: None,
    });
    let out = p.handle(Event::Message { from: PeerId(7), msg: bad }, 10);
    assert!(matches!(out.as_slice(), [Output::Misbehaved { peer: PeerId(7), .. }]));
    // Unsolicited payloads are ignored.
    let out = p.handle(
        Event::Fetched {
            from: PeerId(7),
            hash: ContentHash::of(b"x"),
            bytes: Bytes::from_static(b"x"),
        },
        20,
    );
    assert!(out.is_empty());
    // A payload that does not match its announced hash is refused.
    let c = ContributionAnnounce {
        fragment: 0,
        round: 0,
        hash: ContentHash::of(b"real"),
        size: 64,
        tokens: 1,
        steps: 1,
        origin: PeerId(7),
        base: ContentHash::default(),
        base_round: 0,
    };
    let out =
        p.handle(Event::Message { from: PeerId(7), msg: Message::Contribution(c.clone()) }, 30);
    assert!(out.iter().any(|o| matches!(o, Output::Fetch { .. })));
    let out = p.handle(
        Event::Fetched { from: PeerId(7), hash: c.hash, bytes: Bytes::from_static(b"fake") },
        40,
    );
    assert!(out.iter().any(|o| matches!(o, Output::Misbehaved { .. })));
    // Oversize announcements are refused before fetching.
    let huge = ContributionAnnounce { hash: ContentHash::of(b"h"), size: u64::MAX, ..c };
    let out = p.handle(Event::Message { from: PeerId(7), msg: Message::Contribution(huge) }, 50);
    assert!(out.iter().all(|o| !matches!(o, Output::Fetch { .. })));
    assert_eq!(p.pending(), 0);
}

/// A well-formed delta of fragment 0 by `author` for `round`, with the announcement its
/// author would sign.
pub(crate) fn delta_by(author: u64, round: u64, value: f32) -> (ContributionAnnounce, Bytes) {
    let spec = &plan().fragments[0];
    let meta = crate::delta::DeltaMeta { author, fragment: 0, round, tokens: 64, steps: 4 };
    let enc =
        crate::delta::encode(meta, &vec![value; spec.numel()], None, &Default::default()).unwrap();
    let c = ContributionAnnounce {
        fragment: 0,
        round,
        hash: enc.hash,
        size: enc.bytes.len() as u64,
        tokens: 64,
        steps: 4,
        origin: PeerId(author),
        base: ContentHash::default(),
        base_round: 0,
    };
    (c, enc.bytes)
}

/// The offences reported in `out`, in order.
/// A vote: an announcement of fragment 0's state of `round`, with no count and no recipe.
fn vote(round: u64, hash: ContentHash, size: u64) -> StateAnnounce {
    StateAnnounce { fragment: 0, round, hash, size, took: None, recipe: None, parent: None }
}

fn offences(out: &[Output]) -> Vec<Offence> {
    out.iter()
        .filter_map(|o| match o {
            Output::Misbehaved { offence, .. } => Some(*offence),
            _ => None,
        })
        .collect()
}

/// Delivers a delta of `author` for `round` and credits its author's votes, as a merge in
/// which it agreed with its round would (up-to-date peers credit at merge time).
fn credit(p: &mut Protocol, author: u64, round: u64, now: Millis) {
    let (c, bytes) = delta_by(author, round, 0.01);
    let from = PeerId(author);
    p.handle(Event::Message { from, msg: Message::Contribution(c.clone()) }, now);
    p.handle(Event::Fetched { from, hash: c.hash, bytes }, now);
    p.lanes[c.fragment as usize].votes.credit(from, round);
}

#[test]
fn a_state_nobody_can_serve_is_not_chased_round_after_round() {
    let mut p = peer(1, 0);
    p.start(0);
    credit(&mut p, 9, 5, 5_500);
    let x = ContentHash::of(b"a state only a stalled peer holds");
    let vote = |round| {
        let s = vote(round, x, 100);
        Event::Message { from: PeerId(9), msg: Message::State(s) }
    };
    let fetches = |out: &[Output]| out.iter().filter(|o| matches!(o, Output::Fetch { .. })).count();
    // Five rounds ahead of us: we are behind and fetch it.
    let out = p.handle(vote(5), 5_500);
    assert_eq!(fetches(&out), 1);
    // Every attempt fails (the holder is stopped); after the last one it is given up.
    let mut t = 5_600;
    for _ in 0..10 {
        p.handle(
            Event::FetchFailed { from: PeerId(9), hash: x, denied: vec![], silent: vec![] },
            t,
        );
        t += 100;
    }
    // The same vote again within two periods: not chased.
    assert_eq!(fetches(&p.handle(vote(5), t)), 0, "chased an unreachable state again");
    // Two periods later it may be reachable again.
    assert_eq!(fetches(&p.handle(vote(6), t + 2_100)), 1);
}

/// A joiner hears the swarm's states before it has credited any voter; once it accepts a
/// voter's contribution it catches up at once, not at that voter's next announcement.
#[test]
fn crediting_a_voter_catches_up_at_once() {
    let mut p = peer(1, 0);
    p.start(0);
    let x = ContentHash::of(b"the swarm's state");
    let fetches_x =
        |out: &[Output]| out.iter().any(|o| matches!(o, Output::Fetch { hash, .. } if *hash == x));
    let s = vote(5, x, 100);
    let out = p.handle(Event::Message { from: PeerId(9), msg: Message::State(s) }, 5_500);
    assert!(!fetches_x(&out), "a vote of a peer with no verified work made us fetch");
    let (c, bytes) = delta_by(9, 5, 0.01);
    p.handle(Event::Message { from: PeerId(9), msg: Message::Contribution(c.clone()) }, 5_500);
    let out = p.handle(Event::Fetched { from: PeerId(9), hash: c.hash, bytes }, 5_500);
    assert!(fetches_x(&out), "the voter is credited but its state was not fetched");
}

/// The core asks for a payload once, with every holder and a deadline; it never asks
/// again while the fetch runs (retries are the transport's), and cancels it at the
/// deadline.
#[test]
fn a_payload_is_fetched_once_and_cancelled_at_its_deadline() {
    let mut p = peer(1, 0);
    p.start(0);
    let (c, _) = delta_by(7, 1, 0.1);
    let mut out =
        p.handle(Event::Message { from: PeerId(7), msg: Message::Contribution(c.clone()) }, 1_000);
    let asked: Vec<(Vec<PeerId>, Millis)> = out
        .iter()
        .filter_map(|o| match o {
            Output::Fetch { hash, holders, deadline, .. } if *hash == c.hash => {
                Some((holders.clone(), *deadline))
            }
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 1);
    let (holders, deadline) = asked[0].clone();
    assert_eq!(holders, vec![PeerId(7)]);
    let r = settings(0).raw().clone();
    assert_eq!(deadline, 1_000 + r.fetch_timeout_ms * u64::from(r.fetch_attempts));
    // Fire every timer the core sets until well past the deadline: no second Fetch.
    let mut cancelled = false;
    for _ in 0..10_000 {
        let next = timers(&out).into_iter().filter(|(at, _)| *at <= deadline + 1_000).min();
        let Some((at, t)) = next else { break };
        out.retain(|o| !matches!(o, Output::SetTimer { at: a, timer } if (*a, *timer) == (at, t)));
        let more = p.handle(Event::Timer(t), at);
        assert!(
            !more.iter().any(|o| matches!(o, Output::Fetch { hash, .. } if *hash == c.hash)),
            "asked for {} again at {at}",
            c.hash
        );
        cancelled |=
            more.iter().any(|o| matches!(o, Output::CancelFetch { hash } if *hash == c.hash));
        out.extend(more);
    }
    assert!(cancelled, "the fetch was not cancelled at its deadline");
    assert_eq!(p.metrics().fetch_failures, 1);
}

/// An author that announces a delta and never serves it (a stall) gets one fetch: its
/// re-announcements of the same bytes start none, so it cannot hold a fetch and its
/// announced share of the byte budget, again and again.
#[test]
fn a_delta_given_up_is_not_fetched_again_when_re_announced() {
    let mut p = peer(1, 0);
    p.start(0);
    let (c, _) = delta_by(7, 1, 0.1);
    let announce = |p: &mut Protocol, at: Millis| {
        let msg = Message::Contribution(c.clone());
        let out = p.handle(Event::Message { from: PeerId(7), msg }, at);
        out.iter().filter(|o| matches!(o, Output::Fetch { .. })).count()
    };
    assert_eq!(announce(&mut p, 1_000), 1);
    assert_eq!(announce(&mut p, 1_100), 0, "fetched twice at once");
    p.handle(
        Event::FetchFailed { from: PeerId(7), hash: c.hash, denied: vec![], silent: vec![] },
        1_500,
    );
    for at in [1_600, 1_800] {
        assert_eq!(announce(&mut p, at), 0, "a given-up delta was fetched again at {at}");
    }
    assert_eq!(p.metrics().fetches, 1);
    assert_eq!(p.metrics().fetch_failures, 1);
    assert_eq!(p.metrics().refused_from.get(&PeerId(7)), Some(&1), "the holder is named");
}

/// An author that answers "not here" for a delta it announced is reported, once per
/// failed fetch; a holder that did not answer at all (gone, paused, or a silent stall) is
/// not, only named among the refused, and neither is a peer named as denying that never
/// claimed the delta.
#[test]
fn an_author_denying_its_own_announced_delta_is_reported() {
    let unserved = |out: &[Output]| -> Vec<PeerId> {
        out.iter()
            .filter_map(|o| match o {
                Output::Misbehaved { peer, offence: Offence::Unserved, .. } => Some(*peer),
                _ => None,
            })
            .collect()
    };
    let ids = |v: &[u64]| v.iter().map(|&i| PeerId(i)).collect::<Vec<_>>();
    // (denied, silent, reported, named among the refused)
    type Case<'a> = (&'a [u64], &'a [u64], &'a [u64], &'a [u64]);
    let cases: [Case; 5] = [
        (&[7], &[], &[7], &[7]),
        (&[], &[], &[], &[7]),
        (&[8], &[], &[], &[7]),
        (&[], &[7], &[], &[7]),
        (&[], &[8, 9], &[], &[8, 9]),
    ];
    for (denied, silent, reported, named) in cases {
        let mut p = peer(1, 0);
        p.start(0);
        let (c, _) = delta_by(7, 1, 0.1);
        let out = p.handle(
            Event::Message { from: PeerId(7), msg: Message::Contribution(c.clone()) },
            1_000,
        );
        assert!(out.iter().any(|o| matches!(o, Output::Fetch { .. })));
        let (denied, silent) = (ids(denied), ids(silent));
        let failed = |denied: &Vec<PeerId>| Event::FetchFailed {
            from: PeerId(7),
            hash: c.hash,
            denied: denied.clone(),
            silent: silent.clone(),
        };
        let out = p.handle(failed(&denied), 1_500);
        let case = format!("denied by {denied:?}, silent {silent:?}");
        assert_eq!(unserved(&out), ids(reported), "{case}");
        let refused: Vec<PeerId> = p.metrics().refused_from.keys().copied().collect();
        assert_eq!(refused, ids(named), "{case}");
        assert!(p.metrics().refused_from.values().all(|&n| n == 1), "{case}");
        assert_eq!(p.metrics().silent_holders, silent.len() as u64, "{case}");
        // The same failure reported twice (a late answer) is not a second offence.
        let out = p.handle(failed(&denied), 1_600);
        assert!(unserved(&out).is_empty());
        assert_eq!(p.metrics().silent_holders, silent.len() as u64, "{case}");
    }
}

/// The peers refusals are owed to are bounded, and one that keeps being refused stays
/// named however many fresh ids come and go.
#[test]
fn refusals_by_peer_are_bounded_and_keep_the_repeat_offender() {
    let mut m = Metrics::default();
    for _ in 0..5 {
        m.refused(PeerId(1));
    }
    for id in 100..100 + 10 * MAX_REFUSED_FROM as u64 {
        m.refused(PeerId(id));
    }
    assert_eq!(m.refused_from.len(), MAX_REFUSED_FROM);
    assert_eq!(m.most_refused(1), vec![(PeerId(1), 5)]);
    m.refused(PeerId(2));
    m.refused(PeerId(2));
    assert_eq!(m.most_refused(2), vec![(PeerId(1), 5), (PeerId(2), 2)]);
}

#[test]
fn fetched_payload_bytes_are_counted_by_kind_once_they_check_out() {
    let mut p = peer(1, 0);
    p.start(0);
    let (bad, _) = delta_by(7, 1, 0.1);
    let (good, bytes) = delta_by(8, 1, 0.2);
    for c in [&bad, &good] {
        let msg = Message::Contribution(c.clone());
        p.handle(Event::Message { from: PeerId(c.origin.0), msg }, 1_000);
    }
    let fake = Bytes::from_static(b"not the announced bytes");
    p.handle(Event::Fetched { from: PeerId(7), hash: bad.hash, bytes: fake }, 1_010);
    assert_eq!(p.metrics().fetched_delta_bytes, 0, "bytes that failed their hash counted");
    p.handle(Event::Fetched { from: PeerId(8), hash: good.hash, bytes: bytes.clone() }, 1_020);
    let m = p.metrics();
    assert_eq!((m.fetched_delta_bytes, m.fetched_state_bytes), (bytes.len() as u64, 0));
    assert_eq!(m.payload_bytes()[1], ("delta_fetched", bytes.len() as u64));
}

mod agreement;
mod attacks;
mod budgets;
mod checks;
mod copiers;
mod quorum;
mod recipes;
mod sampling;
mod states;
