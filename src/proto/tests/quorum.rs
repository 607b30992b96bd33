//! When a round's set may close at merge lag 0 (`OpenRound::wide_at`): a set narrower than
//! half of what a round brings waits the whole grace cap, so colluders who arrive first
//! cannot be most of it; a wide one closes one adaptive window later.

use super::{delta_by, timers};
use crate::proto::*;

/// The test peer's settings with room for the cap to differ from the adaptive window
/// (0.5 × (τ 2 × 100 ms − the quorum's wait): at most 100 ms).
fn peer(me: u64, lag: u64) -> Protocol {
    let settings = Settings::new(RawSettings {
        h: 10,
        fragments: 2,
        step_ms: 100,
        grace_cap_ms: 250,
        merge_lag: lag,
        ..RawSettings::default()
    })
    .unwrap()
    .with_tokens_per_step(16);
    let plan = super::plan();
    let init = plan.fragments.iter().map(|f| vec![0.5; f.numel()]).collect();
    Protocol::new(PeerId(me), settings, &plan, init, me).unwrap()
}

/// Delivers `author`'s delta for `round` at `now`; returns the close timers it set.
fn arrive(p: &mut Protocol, author: u64, round: u64, now: Millis) -> Vec<Millis> {
    let (c, bytes) = delta_by(author, round, 0.1);
    let from = PeerId(author);
    let mut out = p.handle(Event::Message { from, msg: Message::Contribution(c.clone()) }, now);
    out.extend(p.handle(Event::Fetched { from, hash: c.hash, bytes }, now));
    timers(&out)
        .into_iter()
        .filter(|(_, t)| matches!(t, Timer::Close { fragment: 0, .. }))
        .map(|(at, _)| at)
        .collect()
}

/// Opens `round` of fragment 0 at `round` s with nothing trained (no own delta).
fn open(p: &mut Protocol, round: u64) {
    let t = round * 1000;
    p.handle(Event::Timer(Timer::Open { fragment: 0, round }), t);
    let params = p.state(0).anchor.clone();
    p.handle(Event::Snapshot { fragment: 0, round, params, tokens: 0, steps: 0 }, t);
}

#[test]
fn a_narrow_set_waits_the_cap_and_a_wide_one_the_window() {
    let mut p = peer(1, 0);
    p.start(0);
    // A fragment's first merge waits the whole cap however many deltas come.
    open(&mut p, 1);
    assert_eq!(arrive(&mut p, 2, 1, 1001), vec![1251]);
    for author in 3..=7 {
        assert_eq!(
            arrive(&mut p, author, 1, 1002),
            Vec::<Millis>::new(),
            "the first merge was cut short"
        );
    }
    p.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), 1251);
    assert_eq!(p.state(0).took(), 6);
    // Six peers contributed, agreed and were credited: a round brings about seven deltas,
    // so four make the set wide. Three wait the cap; the fourth cuts it to the window.
    open(&mut p, 2);
    assert_eq!(arrive(&mut p, 2, 2, 2001), vec![2251]);
    assert_eq!(arrive(&mut p, 3, 2, 2002), Vec::<Millis>::new());
    assert_eq!(arrive(&mut p, 4, 2, 2003), Vec::<Millis>::new());
    let cut = arrive(&mut p, 5, 2, 2004);
    assert!(matches!(cut[..], [at] if (2004..=2104).contains(&at)), "{cut:?}");
    assert_eq!(arrive(&mut p, 6, 2, 2005), Vec::<Millis>::new(), "cut twice");
    // With lag 1 the set is the previous round's, complete: the quorum opens the window.
    let mut q = peer(1, 1);
    q.start(0);
    open(&mut q, 2);
    let at = arrive(&mut q, 2, 1, 2001);
    assert!(matches!(at[..], [at] if (2001..=2101).contains(&at)), "{at:?}");
}

/// Only contributions of peers whose votes count widen a set: colluders whose work never
/// had weight (or newcomers) are merged if they arrive in time, but however many arrive
/// first they cannot close the round on fewer honest deltas. Counted, four refused
/// colluders of 16 cost an honest swarm 5–9% at lag 0 with no weight at all (simulator).
#[test]
fn uncredited_contributions_do_not_widen_a_set() {
    let mut p = peer(1, 0);
    p.start(0);
    open(&mut p, 1);
    arrive(&mut p, 2, 1, 1001);
    for author in 3..=7 {
        arrive(&mut p, author, 1, 1002);
    }
    p.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), 1251);
    // Four make the set wide (as above); three credited deltas and any number of others
    // keep waiting the cap.
    open(&mut p, 2);
    assert_eq!(arrive(&mut p, 2, 2, 2001), vec![2251]);
    assert_eq!(arrive(&mut p, 3, 2, 2002), Vec::<Millis>::new());
    for stranger in 20..24 {
        assert_eq!(arrive(&mut p, stranger, 2, 2003), Vec::<Millis>::new(), "{stranger}");
    }
    assert_eq!(arrive(&mut p, 4, 2, 2004), Vec::<Millis>::new());
    let cut = arrive(&mut p, 5, 2, 2005);
    assert!(matches!(cut[..], [at] if (2005..=2105).contains(&at)), "{cut:?}");
}
