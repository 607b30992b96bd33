//! One hostile peer against one honest core, attack by attack (issue "Hostile peers",
//! attacks 1–9). Each test drives the real state machine with what an attacker who read the
//! source would send, and asserts what the honest peer does about it.

use super::{delta_by, offences, peer, plan};
use crate::delta::{self, Codec, ContentHash, DeltaMeta, EncodeOptions};
use crate::proto::*;
use bytes::Bytes;

/// The honest peer under attack (id 1) with its own round-1 delta of fragment 0 published.
/// Returns the time of the round's open.
pub(super) fn honest_with_own_delta(p: &mut Protocol, value: f32) -> Millis {
    p.start(0);
    p.handle(Event::Timer(Timer::Open { fragment: 0, round: 1 }), 1000);
    let params = vec![0.5 - value; plan().fragments[0].numel()];
    p.handle(Event::Snapshot { fragment: 0, round: 1, params, tokens: 64, steps: 4 }, 1000);
    1000
}

/// Announces and serves `bytes` as `from`; returns every output.
pub(super) fn deliver(
    p: &mut Protocol,
    from: u64,
    c: &ContributionAnnounce,
    bytes: Bytes,
    now: Millis,
) -> Vec<Output> {
    let from = PeerId(from);
    let mut out = p.handle(Event::Message { from, msg: Message::Contribution(c.clone()) }, now);
    if out.iter().any(|o| matches!(o, Output::Fetch { .. })) {
        out.extend(p.handle(Event::Fetched { from, hash: c.hash, bytes }, now));
    }
    out
}

pub(super) fn fetches(out: &[Output]) -> usize {
    out.iter().filter(|o| matches!(o, Output::Fetch { .. })).count()
}

/// Closes round 1 of fragment 0 and returns the new anchor.
fn close(p: &mut Protocol, now: Millis) -> Vec<f32> {
    p.handle(Event::Timer(Timer::Close { fragment: 0, round: 1 }), now);
    p.state(0).anchor.clone()
}

/// The anchor an honest peer gets from its own delta of `value` alone.
fn honest_only(value: f32) -> Vec<f32> {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, value);
    close(&mut p, t + 50)
}

fn distance(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum::<f64>().sqrt()
}

fn encode_as(meta: DeltaMeta, values: &[f32], codec: Codec) -> (ContributionAnnounce, Bytes) {
    let opts = EncodeOptions { codec, ..EncodeOptions::default() };
    let enc = delta::encode(meta, values, None, &opts).unwrap();
    let c = ContributionAnnounce {
        fragment: meta.fragment,
        round: meta.round,
        hash: enc.hash,
        size: enc.bytes.len() as u64,
        tokens: meta.tokens,
        steps: meta.steps,
        origin: PeerId(meta.author),
        base: ContentHash::default(),
        base_round: 0,
    };
    (c, enc.bytes)
}

pub(super) fn numel() -> usize {
    plan().fragments[0].numel()
}

/// Attack 1: claiming 2⁶⁴−1 tokens is refused before anything is fetched, and the largest
/// claim the manifest allows buys at most `max_author_share ×` the median weight.
#[test]
fn inflated_token_claims_are_refused_and_weights_capped() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    let (mut c, bytes) = delta_by(66, 1, -0.1);
    c.tokens = u64::MAX;
    let out = deliver(&mut p, 66, &c, bytes, t + 5);
    assert_eq!(fetches(&out), 0);
    assert_eq!(offences(&out), vec![Offence::InflatedClaim]);
    // A zero delta claiming a billion steps' worth of tokens (within tokens ≤ steps × tps),
    // beside three honest deltas: under the uncapped weight it would own the merge and
    // freeze training; capped at 4× the median author, the honest deltas keep 3/7.
    for author in [2, 3] {
        let (c, bytes) = delta_by(author, 1, 0.1);
        assert!(offences(&deliver(&mut p, author, &c, bytes, t + 5)).is_empty());
    }
    let meta = DeltaMeta { author: 67, fragment: 0, round: 1, tokens: 1 << 34, steps: 1 << 30 };
    let (c, bytes) = encode_as(meta, &vec![0.0; numel()], Codec::Q4);
    let out = deliver(&mut p, 67, &c, bytes, t + 6);
    assert!(offences(&out).is_empty(), "{out:?}");
    let attacked = close(&mut p, t + 50);
    let initial = vec![0.5f32; numel()];
    let moved = distance(&attacked, &initial) / distance(&honest_only(0.1), &initial);
    assert!(moved > 0.4, "honest progress kept: {moved}");
}

/// Attack 2: a well-formed q8 delta whose values are near `f32::MAX` leaves every value
/// finite, and the honest peer's anchor moves as if the delta were clipped.
#[test]
fn huge_values_cannot_blow_up_the_anchor() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    // A second honest delta: two contributions pointing apart are skipped, not merged.
    let (c, bytes) = delta_by(2, 1, 0.1);
    deliver(&mut p, 2, &c, bytes, t + 1);
    let meta = DeltaMeta { author: 66, fragment: 0, round: 1, tokens: 64, steps: 4 };
    let huge: Vec<f32> = (0..numel()).map(|i| if i % 2 == 0 { 3e38 } else { -3e38 }).collect();
    let (c, bytes) = encode_as(meta, &huge, Codec::Q8);
    let out = deliver(&mut p, 66, &c, bytes, t + 5);
    assert!(offences(&out).is_empty());
    let anchor = close(&mut p, t + 50);
    assert!(anchor.iter().all(|v| v.is_finite()));
    assert!(p.state(0).momentum.iter().all(|v| v.is_finite()));
    // Clipped to 2× the lower median (the honest norm) per tensor: bounded damage.
    let honest = honest_only(0.1);
    let step = distance(&honest, &vec![0.5; numel()]);
    assert!(distance(&anchor, &honest) < 3.0 * step, "{anchor:?}");
    assert_eq!(p.metrics().merges, 1);
}

/// Attack 3: a delta scaled ×−10 is clipped against the round's own median; there is no
/// per-process history to poison and no cold start.
#[test]
fn scaled_poison_is_clipped_by_the_rounds_own_median() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    // Two more honest peers and one poisoner, in the first round this process ever saw.
    for (author, v) in [(2u64, 0.1f32), (3, 0.1), (66, -1.0)] {
        let (c, bytes) = delta_by(author, 1, v);
        assert!(offences(&deliver(&mut p, author, &c, bytes, t + 5)).is_empty());
    }
    let attacked = close(&mut p, t + 50);
    let initial = vec![0.5f32; numel()];
    // Unclipped, RDA's radius would be (3·0.1 + 1.0)/4 per value and point backwards for
    // the embedding's mean; clipped, the anchor still moves forward.
    let honest = honest_only(0.1);
    let forward = attacked.iter().zip(&initial).filter(|(a, i)| a < i).count();
    assert!(forward * 2 > numel(), "most values still move the honest way");
    assert!(distance(&attacked, &initial) < 2.5 * distance(&honest, &initial));
}

/// Attacks 5 and 7: one identity gets one contribution per fragment round — one fetch slot,
/// one quorum vote; more are equivocation.
#[test]
fn one_author_one_contribution_per_round() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    let mut out = Vec::new();
    for i in 0..50 {
        let (c, bytes) = delta_by(66, 1, 0.01 * i as f32 + 0.02);
        out.extend(deliver(&mut p, 66, &c, bytes, t + 5));
    }
    assert_eq!(p.pending(), 1, "only the own delta: an equivocator loses the round");
    assert_eq!(offences(&out).len(), 49);
    assert!(offences(&out).iter().all(|o| *o == Offence::Equivocation));
}

/// Attack 6 (and 1, 7): a payload's header must say what its announcement said — round,
/// tokens, steps and author; a far-future round is never fetched.
#[test]
fn header_must_match_the_signed_announcement() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    // Announced for round 1, the payload says round 1000: parked forever before.
    let (good, _) = delta_by(66, 1, 0.1);
    let (_, future) = delta_by(66, 1000, 0.1);
    let forged = ContributionAnnounce { hash: ContentHash::of(&future), ..good.clone() };
    let out = deliver(&mut p, 66, &forged, future, t + 5);
    assert_eq!(offences(&out), vec![Offence::ClaimMismatch]);
    assert_eq!(p.pending(), 1);
    // A far-future announcement is not even fetched.
    let (far, bytes) = delta_by(67, 1000, 0.1);
    assert_eq!(fetches(&deliver(&mut p, 67, &far, bytes, t + 6)), 0);
    // Somebody else's delta announced as one's own is not credited to the announcer, and
    // does not stop the real author's announcement from being fetched and credited.
    let (honest, bytes) = delta_by(2, 1, 0.2);
    let stolen = ContributionAnnounce { origin: PeerId(68), ..honest.clone() };
    let out = deliver(&mut p, 68, &stolen, bytes.clone(), t + 7);
    assert_eq!(offences(&out), vec![Offence::ClaimMismatch]);
    let out = deliver(&mut p, 2, &honest, bytes, t + 8);
    assert!(offences(&out).is_empty());
    assert_eq!(p.pending(), 2);
    // And an announcement naming another author than its signer is refused outright.
    let (c, bytes) = delta_by(2, 1, 0.3);
    assert_eq!(offences(&deliver(&mut p, 69, &c, bytes, t + 9)), vec![Offence::ForgedAuthor]);
}

/// Attack 8: fresh identities cannot make a peer think it is behind, nor make it adopt a
/// state; a payload of another round than voted is refused.
#[test]
fn votes_need_verified_work_and_states_their_voted_round() {
    let mut p = peer(1, 0);
    let t = honest_with_own_delta(&mut p, 0.1);
    let fake = ContentHash::of(b"forged state");
    let mut out = Vec::new();
    for sybil in 1000..1100u64 {
        let s = super::vote(2, fake, 100);
        let msg = Message::State(s);
        out.extend(p.handle(Event::Message { from: PeerId(sybil), msg }, t + 1));
    }
    assert_eq!(fetches(&out), 0, "a hundred fresh keys moved the peer");
    // Far-future rounds from credited peers do not count either (u64::MAX wedged peers).
    super::credit(&mut p, 2, 1, t + 2);
    let s = super::vote(u64::MAX, fake, 100);
    let out = p.handle(Event::Message { from: PeerId(2), msg: Message::State(s) }, t + 3);
    assert_eq!(fetches(&out), 0);
    // A credited peer that votes round 3 (ahead of us) and serves a state of another round
    // under that hash is refused.
    let mut forged = p.state(0).clone();
    forged.round = 7;
    let bytes: Bytes = forged.to_bytes().into();
    let hash = ContentHash::of(&bytes);
    let s = super::vote(3, hash, bytes.len() as u64);
    let now = 3_100;
    let out = p.handle(Event::Message { from: PeerId(2), msg: Message::State(s) }, now);
    assert_eq!(fetches(&out), 1);
    let out = p.handle(Event::Fetched { from: PeerId(2), hash, bytes }, now + 1);
    assert_eq!(offences(&out), vec![Offence::BadState]);
    assert_eq!(p.state(0).round, 0);
}

/// Attack 9: rounds of `u64::MAX` anywhere, and manifests whose times overflow, panic
/// nothing (the test profile checks overflow).
#[test]
fn extreme_numbers_panic_nothing() {
    let mut p = peer(1, 1);
    let t = honest_with_own_delta(&mut p, 0.1);
    let (mut c, bytes) = delta_by(66, u64::MAX, 0.1);
    c.base_round = u64::MAX;
    deliver(&mut p, 66, &c, bytes, t);
    let (_, bytes) = delta_by(66, u64::MAX, 0.1);
    c.round = 1;
    deliver(&mut p, 66, &c, bytes, t + 1);
    let s = StateAnnounce {
        fragment: 1,
        round: u64::MAX,
        hash: ContentHash::default(),
        size: 1,
        took: None,
        recipe: None,
        parent: None,
    };
    p.handle(Event::Message { from: PeerId(66), msg: Message::State(s) }, t + 2);
    for at in [t + 3, u64::MAX / 2, u64::MAX] {
        p.handle(Event::Timer(Timer::Open { fragment: 0, round: u64::MAX }), at);
        p.handle(Event::Timer(Timer::Close { fragment: 0, round: u64::MAX }), at);
    }
    for (h, step_ms) in [(1u64 << 63, 2u64), (u64::MAX, u64::MAX), (1_000_000, 3_600_000)] {
        let raw = RawSettings { h, step_ms, ..RawSettings::default() };
        if let Ok(s) = Settings::new(raw.clone()) {
            let sched = Schedule::new(&s);
            sched.current_round(0, u64::MAX);
            sched.open_time(0, u64::MAX);
        }
    }
    let raw =
        RawSettings { grace_cap_ms: u64::MAX, max_wait_ms: Some(u64::MAX), ..Default::default() };
    assert!(Settings::new(raw).is_err());
}

mod generated {
    //! Valid-looking messages and payloads with every field drawn from the whole range
    //! (random bytes never get past the JSON parser or the magic bytes).
    use super::*;
    use proptest::prelude::*;

    fn round() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..12, Just(u64::MAX), Just(u64::MAX / 2), any::<u64>()]
    }

    fn count() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..100, Just(u64::MAX), any::<u64>()]
    }

    /// One event: (kind, sender, fragment, round, tokens, steps, origin is sender, time step).
    type Step = (u8, u64, u32, u64, u64, u64, bool, u64);

    fn step() -> impl Strategy<Value = Step> {
        (
            0u8..4,
            0u64..4,
            0u32..3,
            round(),
            count(),
            count(),
            any::<bool>(),
            prop_oneof![0u64..300, Just(u64::MAX / 4)],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn well_formed_hostile_sequences_never_panic(steps in prop::collection::vec(step(), 1..60)) {
            let mut p = peer(1, 0);
            let mut now = 0u64;
            p.start(0);
            for (kind, from, fragment, round, tokens, steps_claim, own, dt) in steps {
                now = now.saturating_add(dt);
                let sender = PeerId(10 + from);
                let origin = if own { sender } else { PeerId(1) };
                let out = match kind {
                    0 | 1 => {
                        // A real payload whose header says what the generator says.
                        let meta = DeltaMeta {
                            author: origin.0,
                            fragment: 0,
                            round,
                            tokens,
                            steps: steps_claim.max(1),
                        };
                        let values = vec![if kind == 0 { 0.1 } else { 3e38 }; numel()];
                        let (mut c, bytes) = encode_as(meta, &values, Codec::Q8);
                        c.fragment = fragment;
                        c.tokens = tokens;
                        c.steps = steps_claim;
                        deliver(&mut p, sender.0, &c, bytes, now)
                    }
                    2 => {
                        let s = StateAnnounce {
                            fragment,
                            round,
                            hash: ContentHash::of(&round.to_le_bytes()),
                            size: tokens, took: None, recipe: None, parent: None,
                        };
                        p.handle(Event::Message { from: sender, msg: Message::State(s) }, now)
                    }
                    _ => {
                        let t = Timer::Open { fragment: (fragment % 2) as usize, round: round % 20 };
                        let mut out = p.handle(Event::Timer(t), now);
                        let t = Timer::Close { fragment: (fragment % 2) as usize, round: round % 20 };
                        out.extend(p.handle(Event::Timer(t), now));
                        out
                    }
                };
                // Every fetch the core asks for is answered with garbage or a failure.
                for o in out {
                    if let Output::Fetch { holders, hash, .. } = o {
                        let from = holders.first().copied().unwrap_or(PeerId(0));
                        p.handle(Event::FetchFailed { from, hash, denied: vec![], silent: vec![] }, now);
                    }
                }
            }
            for f in 0..2 {
                prop_assert!(p.state(f).anchor.iter().all(|v| v.is_finite()));
                prop_assert!(p.state(f).momentum.iter().all(|v| v.is_finite()));
            }
        }
    }
}
