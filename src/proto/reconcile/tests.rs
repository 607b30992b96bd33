//! The votes: majorities, ties, claims, credit and its lapse.

use super::*;

#[test]
fn majority_then_smallest_hash_wins() {
    let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
    let mut v = Votes::new(PeerId(0), 10);
    (1..=3).for_each(|p| v.credit(PeerId(p), 5));
    v.record(PeerId(1), 5, b);
    v.record(PeerId(2), 5, a);
    assert_eq!(v.leader(5).unwrap().hash, a);
    v.record(PeerId(3), 5, b);
    let l = v.leader(5).unwrap();
    assert_eq!((l.hash, l.holders.clone(), l.voters), (b, vec![PeerId(1), PeerId(3)], 3));
    // A newer announcement replaces an older one; an older one is ignored.
    v.record(PeerId(3), 6, a);
    v.record(PeerId(3), 4, b);
    assert_eq!(v.leader(5).unwrap().hash, a);
    assert_eq!(v.latest_round(100), Some(6));
    assert_eq!(v.latest_round(5), Some(5));
    v.prune(6, 0, 1);
    assert!(v.leader(5).is_none());
}

/// The state to follow is picked within the lineage most of the round's voters claim:
/// two colluders on one state of a made-up parent lead a plain plurality over honest
/// votes spread one to a state, not the pick; a refused state leaves the pick to the next;
/// a lineage, a false parent claim and the parent's voters are counted as claimed.
#[test]
fn the_pick_stays_within_the_majority_lineage() {
    let hash = |i: u8| ContentHash([i; 32]);
    let (honest, made_up) = (hash(100), hash(200));
    let mut v = Votes::new(PeerId(0), 10);
    (1..=5).for_each(|p| v.credit(PeerId(p), 5));
    v.set_mine(5, hash(3), 2, honest);
    for (p, h) in [(1, 1), (2, 2)] {
        v.record(PeerId(p), 5, hash(h));
        v.claim(PeerId(p), 5, hash(h), Some(2), Some(honest));
    }
    for p in [4, 5] {
        v.record(PeerId(p), 5, hash(9));
        v.claim(PeerId(p), 5, hash(9), Some(2), Some(made_up));
    }
    assert_eq!(v.leader(5).unwrap().hash, hash(9), "two holders lead a plain plurality");
    let pick = v.leader_where(5, |_| false).unwrap();
    assert_eq!((pick.hash, pick.voters), (hash(1), 5), "the pick left the majority lineage");
    let next = v.leader_where(5, |h| *h == hash(1)).unwrap();
    assert_eq!(next.hash, hash(2), "a refused state did not leave the pick to the next");
    assert_eq!(v.lineage(5, honest), (3, 5));
    assert_eq!(v.lineage(5, made_up), (2, 5));
    assert_eq!(v.kin(5, made_up), vec![PeerId(4), PeerId(5)]);
    assert_eq!(v.misparented(5, hash(9), honest), vec![PeerId(4), PeerId(5)]);
    assert_eq!(v.misparented(5, hash(9), made_up), vec![]);
    // Without a lineage of most voters, the pick is the plurality's.
    v.record(PeerId(1), 5, hash(9));
    v.claim(PeerId(1), 5, hash(9), Some(2), Some(made_up));
    assert_eq!(v.leader_where(5, |_| false).unwrap().hash, hash(9));
}

/// Between states with as many holders, the one whose holders claim the wider merge
/// wins (the least claim of its holders counts, so a liar cannot raise an honest
/// state's), then the smallest hash; a holder whose claim the state's log does not
/// bear out is named, and a vote that came without a claim is never named.
#[test]
fn a_tie_goes_to_the_wider_merge_and_a_false_claim_is_named() {
    let (a, b, c) = (ContentHash([1; 32]), ContentHash([2; 32]), ContentHash([3; 32]));
    let mut v = Votes::new(PeerId(0), 10);
    (1..=5).for_each(|p| v.credit(PeerId(p), 5));
    v.set_mine(5, a, 3, ContentHash::default());
    v.record(PeerId(1), 5, b);
    v.claim(PeerId(1), 5, b, Some(9), None);
    v.record(PeerId(2), 5, c);
    assert_eq!(v.leader(5).unwrap().hash, b, "9 contributions beat 3 and none");
    v.record(PeerId(3), 5, c);
    assert_eq!(v.leader(5).unwrap().hash, c, "two holders beat a wider merge");
    v.record(PeerId(4), 5, a);
    v.claim(PeerId(4), 5, a, Some(12), None);
    v.claim(PeerId(2), 5, c, Some(5), None);
    assert_eq!(v.leader(5).unwrap().hash, c, "a holder's larger claim raised mine");
    v.claim(PeerId(2), 5, c, Some(2), None);
    assert_eq!(v.leader(5).unwrap().hash, a, "3 beats 2 at two holders each");
    assert_eq!(v.misclaimed(5, a, 3), vec![PeerId(4)], "this peer's own claim is not checked");
    assert_eq!(v.misclaimed(5, a, 12), vec![]);
    assert_eq!(v.misclaimed(5, c, 2), vec![], "peer 3's vote claimed nothing");
    // A new vote drops the claim made for the old one; a claim for another vote than
    // the latest is not kept.
    v.record(PeerId(1), 6, b);
    v.claim(PeerId(1), 6, b, Some(4), None);
    assert_eq!(v.misclaimed(6, b, 0), vec![PeerId(1)]);
    v.record(PeerId(1), 6, c);
    v.claim(PeerId(1), 6, b, Some(4), None);
    assert_eq!(v.misclaimed(6, c, 0), vec![]);
}

#[test]
fn capacity_bounds_memory() {
    let mut v = Votes::new(PeerId(0), 2);
    for i in 0..10 {
        v.credit(PeerId(i), 1);
        v.record(PeerId(i), 1, ContentHash([0; 32]));
    }
    assert_eq!(v.leader(1).unwrap().voters, 2);
}

/// Credit is earned again or it lapses: a voter credited once and never again stops
/// counting once others have earned credit `lapse` rounds newer; earning again
/// restores it. Where nobody earns (a stopped swarm), nobody lapses.
#[test]
fn a_credit_not_earned_again_lapses() {
    let a = ContentHash([1; 32]);
    let mut v = Votes::new(PeerId(0), 100);
    v.prune(0, 0, 1);
    let lapse = v.lapse();
    assert_eq!(lapse, CREDIT_LAPSE + 4);
    v.credit(PeerId(1), 3);
    v.credit(PeerId(2), 3);
    // Rounds go by with votes and no new credit: both still count.
    v.record(PeerId(1), 3 + 10 * lapse, a);
    v.record(PeerId(2), 3 + 10 * lapse, a);
    assert_eq!(v.leader(3 + 10 * lapse).unwrap().voters, 2, "a stopped swarm lapsed");
    // Peer 2 keeps contributing; peer 1 does not.
    v.credit(PeerId(2), 3 + lapse);
    assert!(v.counts(&PeerId(1)), "lapse rounds behind the newest: still current");
    v.credit(PeerId(2), 4 + lapse);
    assert!(!v.counts(&PeerId(1)) && v.counts(&PeerId(2)));
    assert_eq!(v.leader(3 + 10 * lapse).unwrap().holders, vec![PeerId(2)]);
    // Work again, a vote again.
    v.credit(PeerId(1), 5 + lapse);
    assert!(v.counts(&PeerId(1)));
    // A longer period lengthens the lapse: a sampled peer contributes once a period.
    v.prune(0, 0, 16);
    assert_eq!(v.lapse(), CREDIT_LAPSE + 64);
}

/// A full map of lapsed credits (Sybils that earned once and went idle) makes room
/// for a peer that works now; a full map of current credits does not.
#[test]
fn lapsed_credits_make_room_for_new_work() {
    let mut v = Votes::new(PeerId(0), 4);
    for i in 10..14 {
        v.credit(PeerId(i), 1);
    }
    v.credit(PeerId(20), 2);
    assert!(!v.counts(&PeerId(20)), "full of current credits: the newcomer waits");
    let late = 2 + v.lapse();
    v.credit(PeerId(21), late);
    assert!(v.counts(&PeerId(21)), "a lapsed credit made room");
    assert_eq!(v.credits.len(), 4);
    // The one evicted is the stalest, smallest id first: every peer evicts alike.
    assert!(!v.credits.contains_key(&PeerId(10)));
}

/// Votes are forgotten by their distance from the newest counted one: while nobody
/// merges (the end of a run) the clock moving on forgets nothing.
#[test]
fn an_idle_swarm_keeps_its_last_votes() {
    let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
    let mut v = Votes::new(PeerId(0), 100);
    v.credit(PeerId(1), 10);
    v.record(PeerId(0), 10, a);
    v.record(PeerId(1), 10, b);
    v.prune(40, 3, 1);
    assert_eq!(v.leader(10).unwrap().voters, 2, "the clock alone forgot the last votes");
    v.record(PeerId(1), 40, b);
    v.prune(40, 3, 1);
    assert_eq!(v.leader(10), None);
    assert_eq!(v.latest_round(40), Some(40));
    // Without a counted vote, the clock decides: uncounted votes do not pile up.
    let mut w = Votes::new(PeerId(0), 100);
    w.record(PeerId(5), 10, a);
    w.prune(40, 3, 1);
    w.credit(PeerId(5), 10);
    assert_eq!(w.leader(10), None);
}

/// Our own vote counts until we earned credit and let it lapse, as the others see us;
/// then we follow their state, and our vote is what we hold now, even an older round.
#[test]
fn our_own_vote_lapses_with_our_credit() {
    let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
    let me = PeerId(0);
    let mut v = Votes::new(me, 100);
    v.prune(0, 0, 1);
    v.record(me, 9, a);
    assert!(v.counts(&me), "a peer that never contributed keeps its vote");
    v.credit(me, 3);
    v.credit(PeerId(1), 3);
    v.record(PeerId(1), 8, b);
    assert_eq!(v.leader(9).unwrap().hash, a);
    // Peer 1 goes on earning credit; we stopped contributing at round 3.
    v.credit(PeerId(1), 4 + v.lapse());
    assert!(!v.counts(&me) && v.counts(&PeerId(1)));
    assert_eq!(v.leader(9), None, "a lapsed peer's own state leads nobody");
    assert_eq!(v.latest_round(100), Some(8));
    // A replay of an older announcement of ours changes nothing; going back to the
    // swarm's older state replaces our newer vote.
    v.record(me, 8, b);
    assert!(v.latest[&me].is(9, a));
    v.set_mine(8, b, 0, ContentHash::default());
    v.credit(me, 4 + v.lapse());
    assert_eq!(v.leader(8).unwrap().holders, vec![me, PeerId(1)]);
}

#[test]
fn only_credited_voters_count() {
    let (a, b) = (ContentHash([1; 32]), ContentHash([2; 32]));
    let mut v = Votes::new(PeerId(0), 100);
    v.record(PeerId(0), 5, a);
    // Fifty fresh identities vote for a later round and another state: nothing moves.
    for i in 100..150 {
        v.record(PeerId(i), 9, b);
    }
    assert_eq!(v.max_round(), 5);
    assert_eq!(v.leader(9), None);
    assert_eq!(v.leader(5).unwrap().hash, a);
    // Verified work credits a voter, and its standing vote counts at once.
    v.credit(PeerId(100), 8);
    assert_eq!(v.max_round(), 9);
    assert_eq!(v.leader(9).unwrap().holders, vec![PeerId(100)]);
    // Pruning forgets old votes, not credits.
    v.prune(0, 0, 1);
    assert_eq!(v.max_round(), 9);
}

/// Every way a credit or a vote changes keeps the copy of each voter's credit in its vote
/// equal to the credit itself (the tallies read the copy), with the map full or not.
mod mirrored_credits {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Record(u64, u64, u8),
        Claim(u64, u64, u8, u32),
        Credit(u64, u64),
        Discredit(u64),
        Mine(u64, u8),
        Prune(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        let (peer, round, hash) = (0u64..6, 0u64..200, 0u8..3);
        prop_oneof![
            (peer.clone(), round.clone(), hash.clone()).prop_map(|(p, r, h)| Op::Record(p, r, h)),
            (peer.clone(), round.clone(), hash.clone(), 0u32..4)
                .prop_map(|(p, r, h, t)| Op::Claim(p, r, h, t)),
            (peer.clone(), round.clone()).prop_map(|(p, r)| Op::Credit(p, r)),
            peer.prop_map(Op::Discredit),
            (round.clone(), hash).prop_map(|(r, h)| Op::Mine(r, h)),
            (round, 0u64..8).prop_map(|(r, k)| Op::Prune(r, k)),
        ]
    }

    proptest! {
        #[test]
        fn the_copy_in_each_vote_is_the_credit(ops in prop::collection::vec(op(), 1..60)) {
            let hash = |h: u8| ContentHash([h; 32]);
            // Room for three voters: credits evict, new votes are refused.
            let mut v = Votes::new(PeerId(0), 3);
            for op in ops {
                match op {
                    Op::Record(p, r, h) => v.record(PeerId(p), r, hash(h)),
                    Op::Claim(p, r, h, t) => v.claim(PeerId(p), r, hash(h), Some(t), None),
                    Op::Credit(p, r) => v.credit(PeerId(p), r),
                    Op::Discredit(p) => v.discredit(PeerId(p)),
                    Op::Mine(r, h) => v.set_mine(r, hash(h), 1, ContentHash::default()),
                    Op::Prune(r, k) => v.prune(r, k, 1),
                }
                for (p, vote) in &v.latest {
                    prop_assert_eq!(vote.credit, v.credits.get(p).copied(), "voter {:?}", p);
                    prop_assert_eq!(v.counts_with(p, vote.credit), v.counts(p));
                }
            }
        }
    }
}

/// The lineage to follow: the parent most of the round's voters claim (a majority), else
/// the one the most claim, ties to the smaller hash; and whether the round's votes are in.
#[test]
fn the_ruling_lineage_is_the_largest_and_ties_go_to_the_smaller_parent() {
    let hash = |i: u8| ContentHash([i; 32]);
    let mut v = Votes::new(PeerId(0), 10);
    (1..=6).for_each(|p| v.credit(PeerId(p), 5));
    let vote = |v: &mut Votes, p: u64, state: u8, parent: u8| {
        v.record(PeerId(p), 5, hash(state));
        v.claim(PeerId(p), 5, hash(state), Some(1), Some(hash(parent)));
    };
    // Every voter's latest vote is of round 4 at first.
    (1..=6).for_each(|p| v.record(PeerId(p), 4, hash(50)));
    assert_eq!(v.ruling_lineage(5), None, "no vote of the round");
    vote(&mut v, 1, 1, 200);
    vote(&mut v, 2, 2, 100);
    assert!(!v.round_is_in(5), "two of six voters were taken for the round's votes");
    let tie = v.ruling_lineage(5).unwrap();
    assert_eq!((tie.parent, tie.majority), (hash(100), false), "a tie went to the larger hash");
    vote(&mut v, 3, 3, 200);
    vote(&mut v, 4, 4, 150);
    assert!(v.round_is_in(5));
    let most = v.ruling_lineage(5).unwrap();
    assert_eq!((most.parent, most.majority), (hash(200), false));
    vote(&mut v, 5, 1, 200);
    let majority = v.ruling_lineage(5).unwrap();
    assert_eq!((majority.parent, majority.majority), (hash(200), true));
}
