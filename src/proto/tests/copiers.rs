//! Copiers: peers that announce an honest author's delta as their own, first, and then
//! serve it, stall or serve other bytes; the author's delta must still be merged (issue 21).

use super::{delta_by, offences, peer};
use crate::proto::*;

/// Copiers that announce an honest author's delta before it (as their own, each signing)
/// fill the fetch's claim list; the author's announcement, coming while the fetch runs,
/// still counts: the delta is held, and every copier is caught by the header.
#[test]
fn an_author_gets_its_delta_in_however_many_copiers_announced_first() {
    let mut p = peer(1, 0);
    p.start(0);
    p.handle(Event::Timer(Timer::Open { fragment: 0, round: 1 }), 1_000);
    let (c, bytes) = delta_by(7, 1, 0.05);
    let fetches = |out: &[Output]| out.iter().filter(|o| matches!(o, Output::Fetch { .. })).count();
    let mut asked = 0;
    for copier in 100..112u64 {
        let copy = ContributionAnnounce { origin: PeerId(copier), ..c.clone() };
        let msg = Message::Contribution(copy);
        asked += fetches(&p.handle(Event::Message { from: PeerId(copier), msg }, 1_005));
    }
    assert_eq!(asked, 1, "one fetch per payload");
    let msg = Message::Contribution(c.clone());
    assert_eq!(fetches(&p.handle(Event::Message { from: PeerId(7), msg }, 1_006)), 0);
    let out = p.handle(Event::Fetched { from: PeerId(100), hash: c.hash, bytes }, 1_010);
    assert_eq!(p.pending(), 1, "the author's delta was dropped");
    let caught = offences(&out).iter().filter(|o| **o == Offence::ClaimMismatch).count();
    assert_eq!(caught, 8, "every copier whose claim was checked is caught");
}

/// A copier that announces an honest delta first, as its own, and then never serves it
/// does not keep the author's delta out: the failed fetch goes on from the author, who
/// announced the delta meanwhile. Once every announcer was asked, the hash is given up as
/// before, and a re-announcement starts nothing.
#[test]
fn a_copier_that_announced_first_and_stalls_does_not_keep_the_authors_delta_out() {
    let mut p = peer(1, 0);
    p.start(0);
    p.handle(Event::Timer(Timer::Open { fragment: 0, round: 1 }), 1_000);
    let asked = |out: &[Output]| -> Vec<Vec<PeerId>> {
        let holders = |o: &Output| match o {
            Output::Fetch { holders, .. } => Some(holders.clone()),
            _ => None,
        };
        out.iter().filter_map(holders).collect()
    };
    let announce = |p: &mut Protocol, by: u64, c: &ContributionAnnounce, at: Millis| {
        let msg = Message::Contribution(ContributionAnnounce { origin: PeerId(by), ..c.clone() });
        p.handle(Event::Message { from: PeerId(by), msg }, at)
    };
    let (c, bytes) = delta_by(7, 1, 0.05);
    assert_eq!(asked(&announce(&mut p, 100, &c, 1_005)), vec![vec![PeerId(100)]]);
    assert!(asked(&announce(&mut p, 7, &c, 1_006)).is_empty(), "one fetch at a time");
    let failed =
        Event::FetchFailed { from: PeerId(100), hash: c.hash, denied: vec![], silent: vec![] };
    assert_eq!(asked(&p.handle(failed, 1_500)), vec![vec![PeerId(7)]], "the author not asked");
    let out = p.handle(Event::Fetched { from: PeerId(7), hash: c.hash, bytes }, 1_510);
    assert_eq!(p.pending(), 1, "the author's delta was kept out");
    assert!(offences(&out).contains(&Offence::ClaimMismatch), "the copier's claim stood");
    // Both announcers of another delta stall: given up after both were asked.
    let (d, _) = delta_by(8, 1, 0.05);
    announce(&mut p, 101, &d, 1_600);
    announce(&mut p, 8, &d, 1_601);
    let failed = |from| Event::FetchFailed {
        from: PeerId(from),
        hash: d.hash,
        denied: vec![],
        silent: vec![],
    };
    assert_eq!(asked(&p.handle(failed(101), 1_700)), vec![vec![PeerId(8)]]);
    assert!(asked(&p.handle(failed(8), 1_800)).is_empty(), "asked again after everyone");
    assert!(asked(&announce(&mut p, 8, &d, 1_900)).is_empty(), "fetched again when re-announced");
    assert_eq!(p.metrics().fetch_failures, 3);
}
