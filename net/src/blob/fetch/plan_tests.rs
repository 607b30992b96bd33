use super::*;

fn peers(n: usize) -> Vec<PeerId> {
    (0..n).map(|_| PeerId::random()).collect()
}

const PRIOR: Duration = Duration::from_millis(250);

#[test]
fn spreads_chunks_round_robin_and_finishes() {
    let p = peers(2);
    let mut plan = ChunkPlan::new(6, &p, PRIOR);
    let t0 = Instant::now();
    let issues = plan.poll(t0);
    assert_eq!(issues.len(), 6);
    assert_eq!(issues.iter().filter(|i| i.peer == p[0]).count(), 3);
    for i in &issues {
        assert!(plan.on_answer(i.id, Outcome::Verified, t0 + Duration::from_millis(10)));
    }
    assert!(plan.is_done());
    assert!(plan.take_notes().is_empty());
}

#[test]
fn one_chunk_is_hedged_to_a_second_holder_and_the_first_answer_wins() {
    let p = peers(2);
    let mut plan = ChunkPlan::new(1, &p, PRIOR);
    let t0 = Instant::now();
    let first = plan.poll(t0);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].peer, p[0]);
    let wake = plan.next_wake(t0).unwrap();
    assert_eq!(wake, t0 + plan.hedge_delay());
    assert!(plan.poll(wake - Duration::from_millis(1)).is_empty());
    let hedge = plan.poll(wake);
    assert_eq!(hedge.len(), 1);
    assert_eq!((hedge[0].peer, hedge[0].chunk), (p[1], 0));
    assert_eq!(plan.take_notes(), vec![Note::Hedged(p[1])]);
    assert!(plan.on_answer(hedge[0].id, Outcome::Verified, wake + Duration::from_millis(5)));
    assert!(plan.is_done());
    // The stalled first holder lost the race: slow for the reputation book.
    let reports = plan.reports();
    assert!(reports.iter().any(|r| r.peer == p[0] && r.slow));
    assert!(reports.iter().any(|r| r.peer == p[1] && !r.slow));
    // A late duplicate is not stored twice.
    assert!(!plan.on_answer(first[0].id, Outcome::Verified, wake + Duration::from_secs(1)));
}

/// Drives a plan where `stalled` never answers and every other source answers each
/// request `latency` after it was sent; returns when all is done and the notes.
fn drive(plan: &mut ChunkPlan, stalled: PeerId, latency: Duration) -> (Duration, Vec<Note>) {
    let t0 = Instant::now();
    let mut t = t0;
    let mut outstanding: Vec<(Issue, Instant)> = Vec::new();
    let mut notes = Vec::new();
    while !plan.is_done() {
        assert!(t - t0 < Duration::from_secs(60), "fetch held");
        outstanding.extend(plan.poll(t).into_iter().map(|i| (i, t)));
        notes.extend(plan.take_notes());
        t += Duration::from_millis(50);
        outstanding.retain(|(i, sent)| {
            if i.peer == stalled || t - *sent < latency {
                return true;
            }
            plan.on_answer(i.id, Outcome::Verified, t);
            false
        });
    }
    (t - t0, notes)
}

#[test]
fn a_stalled_holder_is_hedged_in_the_tail() {
    let p = peers(2);
    let mut plan = ChunkPlan::new(6, &p, PRIOR);
    let (took, notes) = drive(&mut plan, p[0], Duration::from_millis(100));
    // The healthy source does its share, then takes copies of the stalled one's chunks.
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(notes.iter().filter(|n| **n == Note::Hedged(p[1])).count() >= 3, "{notes:?}");
    assert!(plan.reports().iter().any(|r| r.peer == p[0] && r.slow));
}

#[test]
fn a_stalled_holder_is_demoted_at_the_deadline_and_its_chunks_reissued() {
    let p = peers(2);
    // Many chunks: the healthy source is still busy when the deadline passes.
    let mut plan = ChunkPlan::new(64, &p, PRIOR);
    let (took, notes) = drive(&mut plan, p[0], Duration::from_millis(400));
    assert!(notes.contains(&Note::Slow(p[0])), "{notes:?}");
    assert!(!notes.contains(&Note::Slow(p[1])), "{notes:?}");
    // 64 chunks, 4 at a time, 400-450 ms each: about 7 s; never the request timeout.
    assert!(took < Duration::from_secs(9), "took {took:?}");
}

#[test]
fn busy_backs_off_and_too_many_drop_the_source() {
    let p = peers(1);
    let mut plan = ChunkPlan::new(1, &p, PRIOR);
    let mut t = Instant::now();
    for n in 1..=MAX_BUSY {
        let i = plan.poll(t);
        assert_eq!(i.len(), 1, "round {n}");
        assert!(!plan.on_answer(i[0].id, Outcome::Busy, t));
        assert!(plan.poll(t).is_empty(), "no retry before the back-off");
        t = plan.next_wake(t).expect("a wake-up for the back-off");
    }
    let i = plan.poll(t);
    plan.on_answer(i[0].id, Outcome::Busy, t);
    assert!(plan.is_stuck());
}

#[test]
fn bad_chunk_drops_and_reports_and_another_source_serves() {
    let p = peers(2);
    let mut plan = ChunkPlan::new(2, &p, PRIOR);
    let t0 = Instant::now();
    let issues = plan.poll(t0);
    let bad = issues.iter().find(|i| i.peer == p[0]).unwrap();
    plan.on_answer(bad.id, Outcome::Bad, t0);
    assert_eq!(plan.take_notes(), vec![Note::Report(p[0], RejectReason::BadChunk)]);
    let good = issues.iter().find(|i| i.peer == p[1]).unwrap();
    plan.on_answer(good.id, Outcome::Verified, t0);
    let again = plan.poll(t0);
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].peer, p[1]);
    plan.on_answer(again[0].id, Outcome::Verified, t0);
    assert!(plan.is_done());
}

#[test]
fn copies_per_chunk_are_bounded() {
    let p = peers(4);
    let mut plan = ChunkPlan::new(1, &p, PRIOR);
    let mut t = Instant::now();
    let mut sent = plan.poll(t).len();
    // Nobody ever answers: hedges and deadline re-issues stop at MAX_COPIES.
    for _ in 0..100 {
        let Some(w) = plan.next_wake(t) else { break };
        t = w;
        sent += plan.poll(t).len();
    }
    assert_eq!(sent, MAX_COPIES as usize);
    assert!(plan.next_wake(t).is_none());
}
