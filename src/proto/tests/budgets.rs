//! Intake budgets against well-formed floods (issue 21): held bytes, fetch slots and claims
//! are bounded, authors without a current vote credit fill only half of each, and a size
//! no delta of the fragment can have is refused before anything is fetched.

use super::attacks::{fetches, numel};
use super::{delta_by, offences, peer, plan};
use crate::delta::{self, ContentHash};
use crate::fragment::{FragmentPlan, TensorSpec};
use crate::proto::*;

/// Attack 4: held deltas stay encoded, and one byte budget bounds them all.
#[test]
fn held_payloads_are_bounded_by_one_byte_budget() {
    // Fragments of 16k values: a delta of one is at most 64 KiB (and a header).
    let t =
        |n: &str, emb: bool| TensorSpec { name: n.into(), shape: vec![1 << 14], is_embedding: emb };
    let plan = FragmentPlan::new(&[t("emb", true), t("a", false)], 2).unwrap();
    let size = delta::largest_payload(1 << 14);
    let s = Settings::new(RawSettings {
        h: 10,
        fragments: 2,
        step_ms: 100,
        grace_cap_ms: 100,
        max_held_bytes: 1 << 20,
        ..RawSettings::default()
    })
    .unwrap();
    let init = plan.fragments.iter().map(|f| vec![0.5; f.numel()]).collect();
    let mut p = Protocol::new(PeerId(1), s, &plan, init, 1).unwrap();
    p.start(0);
    // A thousand strangers each announce a delta of the largest legal size.
    let mut fetched = 0;
    for author in 100..1100u64 {
        let (mut c, _) = delta_by(author, 1, 0.1);
        c.hash = ContentHash::of(&author.to_le_bytes());
        c.size = size;
        let out =
            p.handle(Event::Message { from: PeerId(author), msg: Message::Contribution(c) }, 900);
        fetched += fetches(&out);
    }
    // In flight counts against the budget as announced: at most 16 fit, and strangers
    // get half of it.
    assert!(fetched <= 8, "{fetched} fetches by strangers for a 1 MiB budget");
    assert!(p.metrics().refused_full >= 992);
    // A member whose recent work earned it a vote still gets its delta in (before the
    // half kept for credited authors, the flood kept it out: refused as budget_full).
    let member = PeerId(7);
    p.lanes[0].votes.credit(member, 1);
    let (mut c, _) = delta_by(7, 1, 0.1);
    c.size = size;
    let out = p.handle(Event::Message { from: member, msg: Message::Contribution(c) }, 901);
    assert_eq!(fetches(&out), 1, "the credited member's delta was refused");
}

/// Copiers fill no slot a credited author needs: free identities that announce a delta
/// already in flight as theirs each add a claim to the lane's claim map, which bounds the
/// fresh announcements it takes. They get half of it, like every other budget.
#[test]
fn copied_claims_keep_room_for_credited_authors() {
    let raw = RawSettings { max_held: 64, ..super::settings(0).raw().clone() };
    let s = Settings::new(raw).unwrap().with_tokens_per_step(16);
    let init = plan().fragments.iter().map(|f| vec![0.5; f.numel()]).collect();
    let mut p = Protocol::new(PeerId(1), s, &plan(), init, 1).unwrap();
    p.start(0);
    let (c, _) = delta_by(2, 1, 0.1);
    let out =
        p.handle(Event::Message { from: PeerId(2), msg: Message::Contribution(c.clone()) }, 900);
    assert_eq!(fetches(&out), 1);
    // A thousand Sybils announce the same bytes, each signing as itself.
    for sybil in 100..1100u64 {
        let copy = ContributionAnnounce { origin: PeerId(sybil), ..c.clone() };
        let msg = Message::Contribution(copy);
        assert!(offences(&p.handle(Event::Message { from: PeerId(sybil), msg }, 901)).is_empty());
    }
    assert!(p.lanes[0].claims.len() <= 32, "{} claims by copiers", p.lanes[0].claims.len());
    // A member whose recent work earned it a vote still gets its delta in (before, the
    // copiers' claims filled the map and it was refused as budget_full).
    let member = PeerId(7);
    p.lanes[0].votes.credit(member, 1);
    let (c, _) = delta_by(7, 1, 0.2);
    let out = p.handle(Event::Message { from: member, msg: Message::Contribution(c) }, 902);
    assert_eq!(fetches(&out), 1, "the credited member's delta was refused");
}

/// A stall that reserves the byte budget with a huge announced size (every peer would hold
/// it for the fetch's deadline) is a lie the size proves: no delta of the fragment can be
/// that large. Refused as oversized, nothing fetched; the largest legal size is fetched.
#[test]
fn a_delta_announced_larger_than_its_fragment_allows_is_refused() {
    let mut p = peer(1, 0);
    p.start(0);
    let most = delta::largest_payload(numel());
    let (mut c, _) = delta_by(7, 1, 0.1);
    c.size = most + 1;
    let msg = Message::Contribution(c.clone());
    let out = p.handle(Event::Message { from: PeerId(7), msg }, 1_000);
    assert_eq!(fetches(&out), 0);
    assert_eq!(offences(&out), vec![Offence::Oversized]);
    c.size = most;
    let out = p.handle(Event::Message { from: PeerId(8), msg: Message::Contribution(c) }, 1_000);
    assert!(offences(&out).contains(&Offence::ForgedAuthor), "origin 7 sent by 8");
    let (c, _) = delta_by(9, 1, 0.1);
    let c = ContributionAnnounce { size: most, ..c };
    let out = p.handle(Event::Message { from: PeerId(9), msg: Message::Contribution(c) }, 1_000);
    assert_eq!(fetches(&out), 1, "the largest legal size is fetched");
}
