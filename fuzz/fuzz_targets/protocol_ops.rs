//! What each decoded operation does to the peer under test (see `protocol.rs`).

use super::*;

impl Harness {
    pub(super) fn op(&mut self, op: Op) {
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
                    ..Default::default()
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
                    took: None,
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
                    took: None,
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
