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

    fn op(&mut self, op: Op) {
        match op {
            Op::FireNext { late } => {
                if let Some(i) = (0..self.timers.len()).min_by_key(|&i| self.timers[i]) {
                    self.fire(i, late % 200);
                }
            }
            Op::Fire { idx, late } => {
                if !self.timers.is_empty() {
                    let i = usize::from(idx) % self.timers.len();
                    self.fire(i, late);
                }
            }
            Op::Advance(ms) => self.now = self.now.saturating_add(u64::from(ms)),
            Op::JumpAhead(ms) => self.now = self.now.saturating_add(ms),
            Op::ClockBack(ms) => self.now = self.now.saturating_sub(u64::from(ms)),
            Op::Snapshot { values, tokens, steps, idx } => {
                if self.snapshots.is_empty() {
                    return;
                }
                let (fragment, round) =
                    self.snapshots.remove(usize::from(idx) % self.snapshots.len());
                let params = fill(values, &self.peer.protocol().state(fragment).anchor);
                let ev = Event::Snapshot {
                    fragment,
                    round,
                    params,
                    tokens: count(tokens),
                    steps: count(steps),
                };
                self.feed(ev);
            }
            Op::StraySnapshot { fragment, round, values, tokens, steps, short } => {
                let p = usize::from(fragment % 3);
                let r = self.round(p, round);
                let base = self.peer.protocol().state(p % 2).anchor.clone();
                let mut params = fill(values, &base);
                if short {
                    params.pop();
                }
                let ev = Event::Snapshot {
                    fragment: p,
                    round: r,
                    params,
                    tokens: count(tokens),
                    steps: count(steps),
                };
                self.feed(ev);
            }
            Op::Contribute {
                from,
                author,
                fragment,
                round,
                tokens,
                steps,
                values,
                codec: c,
                edits,
                lie,
                base_round,
            } => {
                let p = usize::from(fragment % 2);
                let r = self.round(p, round);
                let meta = DeltaMeta {
                    author: peer(author).0,
                    fragment: p as u32,
                    round: r,
                    tokens: count(tokens),
                    steps: count(steps).max(1),
                };
                let d = fill(values, &vec![0.0; self.plan.fragments[p].numel()]);
                let opts = EncodeOptions {
                    codec: codec(c, self.default_codec),
                    block: 64,
                    zstd_level: if c & 4 == 0 { 0 } else { 1 },
                    keep: 8,
                };
                let Ok(enc) = delta::encode(meta, &d, None, &opts) else { return };
                let mut bytes = enc.bytes.to_vec();
                for (at, v) in edits.into_iter().take(6) {
                    let at = usize::from(at) % delta::HEADER_LEN;
                    bytes[at] = v;
                }
                let size = bytes.len() as u64;
                let hash = self.remember(bytes);
                let mut c = ContributionAnnounce {
                    fragment: p as u32,
                    round: r,
                    hash,
                    size,
                    tokens: meta.tokens,
                    steps: meta.steps,
                    origin: peer(author),
                    base: self.peer.protocol().state_hash(p),
                    base_round: self.round(p, base_round),
                };
                match lie {
                    None => {}
                    Some(Lie::Round(x)) => c.round = x,
                    Some(Lie::Tokens(x)) => c.tokens = x,
                    Some(Lie::Steps(x)) => c.steps = x,
                    Some(Lie::Size(x)) => c.size = x,
                    Some(Lie::Origin(x)) => c.origin = PeerId(x),
                    Some(Lie::Fragment(x)) => c.fragment = x,
                }
                self.feed(Event::Message { from: peer(from), msg: Message::Contribution(c) });
            }
            Op::AnnounceState { from, fragment, round, anchor, log, junk, lie_size } => {
                let p = usize::from(fragment % 2);
                let r = self.round(p, round);
                let bytes = match junk {
                    Some(b) => b,
                    None => {
                        let mut s: FragmentState = self.peer.protocol().state(p).clone();
                        s.anchor = fill(anchor, &s.anchor);
                        s.round = r;
                        let mut ids: Vec<ContentHash> = log
                            .into_iter()
                            .take(8)
                            .map(|x| ContentHash::of(&x.to_le_bytes()))
                            .collect();
                        // Hashes of held contributions, so adoption re-queues or drops them.
                        ids.extend(self.known.iter().take(4).copied());
                        s.record(r, ids, 3);
                        s.to_bytes()
                    }
                };
                let size = lie_size.unwrap_or(bytes.len() as u64);
                let hash = self.remember(bytes);
                let msg = Message::State(StateAnnounce {
                    fragment: p as u32,
                    round: r,
                    hash,
                    size,
                    recipe: None,
                });
                self.feed(Event::Message { from: peer(from), msg });
            }
            Op::RawContribution {
                from,
                fragment,
                round,
                size,
                tokens,
                steps,
                origin,
                base_round,
                hash,
            } => {
                let c = ContributionAnnounce {
                    fragment,
                    round,
                    hash: self.hash(hash),
                    size,
                    tokens,
                    steps,
                    origin: PeerId(origin),
                    base: self.hash(HashSel::Known(0)),
                    base_round,
                };
                self.feed(Event::Message { from: PeerId(from), msg: Message::Contribution(c) });
            }
            Op::RawState { from, fragment, round, size, hash } => {
                let msg = Message::State(StateAnnounce {
                    fragment,
                    round,
                    hash: self.hash(hash),
                    size,
                    recipe: None,
                });
                self.feed(Event::Message { from: PeerId(from), msg });
            }
            Op::Deliver { idx, from_other } => {
                if self.fetches.is_empty() {
                    return;
                }
                let (from, hash, max_len) =
                    self.fetches.remove(usize::from(idx) % self.fetches.len());
                let from = if from_other { PeerId(from.0 ^ 1) } else { from };
                // The transport refuses what exceeds `max_len`; a holder without it denies.
                match self.library.get(&hash).cloned().or_else(|| self.peer.payload(&hash)) {
                    Some(bytes) if bytes.len() as u64 <= max_len => {
                        self.feed(Event::Fetched { from, hash, bytes })
                    }
                    _ => self.feed(Event::FetchFailed { from, hash, denied: vec![from] }),
                }
            }
            Op::DeliverJunk { idx, bytes } => {
                if self.fetches.is_empty() {
                    return;
                }
                let (from, hash, _) = self.fetches.remove(usize::from(idx) % self.fetches.len());
                self.feed(Event::Fetched { from, hash, bytes: bytes.into() });
            }
            Op::DeliverTruncated { idx, keep } => {
                if self.fetches.is_empty() {
                    return;
                }
                let (from, hash, _) = self.fetches.remove(usize::from(idx) % self.fetches.len());
                let Some(bytes) = self.library.get(&hash).cloned() else { return };
                let n = usize::from(keep) % (bytes.len() + 1);
                self.feed(Event::Fetched { from, hash, bytes: bytes.slice(..n) });
            }
            Op::DeliverUnsolicited { hash } => {
                let hash = self.hash(hash);
                if let Some(bytes) = self.library.get(&hash).cloned() {
                    self.feed(Event::Fetched { from: PeerId(3), hash, bytes });
                }
            }
            Op::FetchFailed { idx, denied } => {
                if self.fetches.is_empty() {
                    return;
                }
                let (from, hash, _) = self.fetches.remove(usize::from(idx) % self.fetches.len());
                let denied = if denied { vec![from] } else { Vec::new() };
                self.feed(Event::FetchFailed { from, hash, denied });
            }
            Op::Serve { hash } => {
                let hash = self.hash(hash);
                if let Some(bytes) = self.peer.payload(&hash) {
                    assert_eq!(ContentHash::of(&bytes), hash, "served bytes match their hash");
                }
            }
            Op::MemberJoined => self.handle(PeerEvent::RunPeerJoined),
            Op::Poll => {
                let effects = self.peer.poll(self.now);
                self.take(effects);
            }
            Op::Stepped => self.handle(PeerEvent::Stepped),
            Op::Trained => self.handle(PeerEvent::Trained),
            Op::Stop => self.handle(PeerEvent::Stop),
        }
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
