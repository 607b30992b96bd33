//! The peer (`atoll::peer::Peer`: the protocol core and the decisions around it, the type
//! the node runs) driven as a node would drive it, by a sequence of events decoded from
//! the input with `arbitrary`:
//!
//! - the timers the core asked for, fired at or after their time (earliest first, or any);
//! - answers to its snapshot requests, or unsolicited ones, with params that may be huge
//!   or non-finite and tokens / steps up to `u64::MAX`;
//! - gossip from other peers: contribution announcements of deltas the harness really
//!   encoded (header fields optionally overwritten after encoding, announcement fields
//!   consistent or lying), state announcements of states the harness built (derived from
//!   the core's own state, or arbitrary bytes), and messages with arbitrary fields;
//! - answers to its fetches: the announced bytes, other bytes, truncated bytes, failures;
//! - clock moves: small steps, jumps far ahead (up to `u64::MAX`), and steps back (the
//!   node's clock is wall time minus the epoch, so it can go back);
//! - its life: members joining, trainer steps, the step target reached, a stop request,
//!   polls of its clock; it may start as a late joiner.
//!
//! The peer must never panic; anchors it applies and holds must stay finite and of the
//! fragment's length; it finishes at most once, releases a joiner at most once and never
//! after finishing, and once finishing it sends the trainer nothing.
#![no_main]

use bytes::Bytes;
use std::collections::HashMap;

use arbitrary::{Arbitrary, Unstructured};
use atoll::delta::{self, Codec, ContentHash, DeltaMeta, EncodeOptions};
use atoll::fragment::FragmentPlan;
use atoll::peer::{Effect, Peer, PeerEvent};
use atoll::proto::{
    ContributionAnnounce, Event, FragmentState, Message, Millis, Output, PeerId, Protocol,
    StateAnnounce, Timer,
};
use libfuzzer_sys::fuzz_target;

mod protocol_input;
mod protocol_ops;
use protocol_input::*;

const ME: PeerId = PeerId(100);

struct Harness {
    peer: Peer,
    released: bool,
    finished: bool,
    plan: FragmentPlan,
    now: Millis,
    timers: Vec<(Millis, Timer)>,
    snapshots: Vec<(usize, u64)>,
    fetches: Vec<(PeerId, ContentHash, u64)>,
    library: HashMap<ContentHash, Bytes>,
    known: Vec<ContentHash>,
    default_codec: Codec,
}

impl Harness {
    fn new(c: &Config) -> Option<Self> {
        let (plan, settings, init) = c.run()?;
        let default_codec = settings.raw().encode.codec;
        let period = settings.period_ms();
        let proto = Protocol::new(ME, settings, &plan, init, 7).ok()?;
        Some(Self {
            peer: Peer::new(proto, period, c.late.then_some(0)),
            released: false,
            finished: false,
            plan,
            now: 0,
            timers: Vec::new(),
            snapshots: Vec::new(),
            fetches: Vec::new(),
            library: HashMap::new(),
            known: Vec::new(),
            default_codec,
        })
    }

    fn round(&self, p: usize, r: RoundSel) -> u64 {
        match r {
            RoundSel::Current(d) => {
                let cur = self.peer.protocol().schedule().current_round(p % 2, self.now);
                cur.saturating_add_signed(i64::from(d % 4))
            }
            RoundSel::Abs(r) => r,
            RoundSel::Max => u64::MAX,
        }
    }

    fn hash(&self, h: HashSel) -> ContentHash {
        match h {
            HashSel::Known(i) if !self.known.is_empty() => {
                self.known[usize::from(i) % self.known.len()]
            }
            HashSel::Known(_) => ContentHash([0; 32]),
            HashSel::StateOf(p) => self.peer.protocol().state_hash(usize::from(p % 2)),
            HashSel::Random(b) => ContentHash(b),
        }
    }

    fn remember(&mut self, bytes: Vec<u8>) -> ContentHash {
        let hash = ContentHash::of(&bytes);
        if self.library.len() < 256 {
            self.library.insert(hash, bytes.into());
            self.known.push(hash);
        }
        hash
    }

    fn feed(&mut self, ev: Event) {
        self.handle(PeerEvent::Core(ev));
    }

    fn handle(&mut self, ev: PeerEvent) {
        let effects = self.peer.handle(ev, self.now);
        self.take(effects);
    }

    fn take(&mut self, effects: Vec<Effect>) {
        for e in effects {
            let o = match e {
                Effect::Core(o) => o,
                // Served from the peer's own store (`Op::Serve`).
                Effect::Offer { hash, payload, .. } => {
                    assert_eq!(
                        ContentHash::of(&payload),
                        hash,
                        "an offered payload matches its hash"
                    );
                    continue;
                }
                Effect::Withdraw { .. } => continue,
                Effect::Release(r) => {
                    assert!(!self.released && !self.finished, "released twice or after finishing");
                    assert_eq!(r.rounds.len(), 2);
                    self.released = true;
                    continue;
                }
                Effect::Finish { anchors } => {
                    assert!(!self.finished, "finished twice");
                    assert!(anchors.iter().all(|a| a.anchor.iter().all(|v| v.is_finite())));
                    self.finished = true;
                    continue;
                }
            };
            if self.finished {
                let to_trainer = matches!(o, Output::Snapshot { .. } | Output::Apply(_));
                assert!(!to_trainer, "the trainer was asked for something after the finish");
            }
            match o {
                Output::SetTimer { at, timer } => {
                    if self.timers.len() < 512 {
                        self.timers.push((at, timer));
                    }
                }
                Output::Snapshot { fragment, round } => {
                    assert!(fragment < 2);
                    self.snapshots.push((fragment, round));
                }
                Output::Fetch { hash, holders, max_len, .. } => {
                    // Asked once per hash: never while a fetch of it is pending.
                    assert!(
                        !self.fetches.iter().any(|(_, h, _)| *h == hash),
                        "a second fetch of {hash} while one runs"
                    );
                    let from = holders.first().copied().unwrap_or(PeerId(0));
                    if self.fetches.len() < 512 {
                        self.fetches.push((from, hash, max_len));
                    }
                }
                Output::CancelFetch { hash } => self.fetches.retain(|(_, h, _)| *h != hash),
                Output::Apply(a) => {
                    assert_eq!(a.anchor.len(), self.plan.fragments[a.fragment].numel());
                    assert!(a.anchor.iter().all(|v| v.is_finite()), "non-finite anchor applied");
                }
                Output::Publish { msg, payload } => {
                    let hash = match &msg {
                        Message::Contribution(c) => c.hash,
                        Message::State(s) => s.hash,
                    };
                    assert_eq!(ContentHash::of(&payload), hash, "published bytes do not match");
                    let bytes = atoll::proto::encode_message(&msg);
                    assert_eq!(atoll::proto::decode_message(&bytes).as_ref(), Ok(&msg));
                }
                Output::Merged(r) => {
                    assert_eq!(r.merged.len(), r.contributions.len());
                }
                _ => {}
            }
        }
    }

    fn check(&self) {
        for (p, f) in self.plan.fragments.iter().enumerate() {
            let s = self.peer.protocol().state(p);
            assert_eq!(s.anchor.len(), f.numel());
            assert_eq!(s.momentum.len(), f.numel());
            assert!(s.anchor.iter().chain(&s.momentum).all(|v| v.is_finite()), "non-finite state");
            assert_eq!(s.hash(), self.peer.protocol().state_hash(p));
        }
    }

    fn fire(&mut self, i: usize, late: u16) {
        let (at, timer) = self.timers.swap_remove(i);
        self.now = self.now.max(at).saturating_add(u64::from(late));
        self.feed(Event::Timer(timer));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(config) = Config::arbitrary(&mut u) else { return };
    let Some(mut h) = Harness::new(&config) else { return };
    h.now = match config.start {
        Start::Zero => 0,
        Start::At(t) => u64::from(t),
        Start::Far(t) => t,
    };
    let out = h.peer.start(h.now);
    h.take(out);
    for _ in 0..96 {
        let Ok(op) = Op::arbitrary(&mut u) else { break };
        h.op(op);
        h.check();
    }
    let p = h.peer.protocol();
    let _ = (p.metrics(), p.pending(), p.grace_window(), p.agreement(0));
});
