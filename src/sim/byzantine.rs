//! Hostile peers: a chosen subset of the simulated peers runs the honest [`Protocol`] (so
//! it trains, merges and stays in step like anyone else) but the simulator rewrites what it
//! gossips and serves, one [`Attack`] per hostile peer (`SimConfig::hostile`).
//!
//! Payloads are built with the real codec ([`delta::encode`] with a hand-made
//! [`DeltaMeta`]) and the real state wire form, so every attack is something a peer could
//! send over the network; nothing reaches into an honest peer's state. Sybil identities
//! (fresh [`PeerId`]s, which cost nothing) are served by the hostile peer that made them.
//! The honest peers' view is what the invariants are about: [`Sim::honest_agree`],
//! [`Sim::honest_anchor_loss`].
//!
//! [`Protocol`]: crate::proto::Protocol

use super::Sim;
use crate::delta::{self, Codec, ContentHash, DeltaMeta, Limits};
use crate::proto::merge::momentum_cosine;
use crate::proto::{ContributionAnnounce, FragmentState, Message, PeerId, StateAnnounce};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;

pub use super::attack::{Attack, Forgery};

/// Payloads a hostile peer keeps to serve (bounded: old ones are forgotten).
const STORE: usize = 1024;
/// Honest deltas a hostile peer remembers per fragment.
const SEEN: usize = 16;
/// Sybil ids live above this; the bits below name the owner and the Sybil's number.
const SYBIL_BASE: u64 = 1 << 48;

/// One hostile peer's attack and what it keeps for it.
#[derive(Debug)]
pub(super) struct Hostile {
    attack: Attack,
    /// Crafted payloads by hash, served to whoever asks (also on behalf of its Sybils).
    store: VecDeque<(ContentHash, Bytes)>,
    /// The latest honest deltas of other peers, per fragment, newest last (bounded by
    /// `SEEN`): stolen poison takes the newest, a direction attack all of them.
    seen: Vec<VecDeque<Bytes>>,
    rng: ChaCha8Rng,
}

/// The hostile peers of a run.
#[derive(Debug, Default)]
pub(super) struct Hostiles {
    by_peer: Vec<Option<Hostile>>,
}

impl Hostiles {
    pub(super) fn new(
        peers: usize,
        fragments: usize,
        hostile: &[(usize, Attack)],
        seed: u64,
    ) -> Self {
        let mut by_peer: Vec<Option<Hostile>> = (0..peers).map(|_| None).collect();
        for &(i, attack) in hostile {
            if let Some(slot) = by_peer.get_mut(i) {
                let rng = ChaCha8Rng::seed_from_u64(seed ^ (0xbad5_eed0 + i as u64));
                let seen = vec![VecDeque::new(); fragments];
                *slot = Some(Hostile { attack, store: VecDeque::new(), seen, rng });
            }
        }
        Self { by_peer }
    }

    pub(super) fn is_hostile(&self, i: usize) -> bool {
        self.by_peer.get(i).is_some_and(Option::is_some)
    }

    /// A payload a hostile peer crafted, if `server` is one and made it.
    pub(super) fn serve(&self, server: usize, hash: &ContentHash) -> Option<Bytes> {
        let h = self.by_peer.get(server)?.as_ref()?;
        h.store.iter().find(|(k, _)| k == hash).map(|(_, b)| b.clone())
    }

    fn attack(&self, i: usize) -> Option<Attack> {
        self.by_peer.get(i)?.as_ref().map(|h| h.attack)
    }

    fn saw(&mut self, i: usize, p: usize, bytes: Bytes) {
        if let Some(Some(s)) =
            self.by_peer.get_mut(i).map(|h| h.as_mut().and_then(|h| h.seen.get_mut(p)))
        {
            if s.len() >= SEEN {
                s.pop_front();
            }
            s.push_back(bytes);
        }
    }

    fn keep(&mut self, i: usize, hash: ContentHash, bytes: Bytes) {
        if let Some(Some(h)) = self.by_peer.get_mut(i) {
            if h.store.len() >= STORE {
                h.store.pop_front();
            }
            h.store.push_back((hash, bytes));
        }
    }
}

/// Sybil `k` of hostile peer `owner`.
fn sybil(owner: usize, k: usize) -> PeerId {
    PeerId(SYBIL_BASE | (owner as u64) << 20 | k as u64)
}

/// The simulated peer that answers for `id` (itself, or the owner of a Sybil).
pub(super) fn server_of(id: PeerId, peers: usize) -> Option<usize> {
    let i = if id.0 >= SYBIL_BASE { (id.0 & (SYBIL_BASE - 1)) >> 20 } else { id.0 };
    usize::try_from(i).ok().filter(|&i| i < peers)
}

impl Sim {
    /// Whether peer `i` is hostile.
    pub fn is_hostile(&self, i: usize) -> bool {
        self.byz.is_hostile(i)
    }

    /// Live honest peers' state hashes of fragment `p`, deduplicated.
    pub fn honest_distinct_states(&self, p: usize) -> usize {
        let mut h: Vec<ContentHash> = (0..self.peers())
            .filter(|&i| !self.is_hostile(i))
            .filter_map(|i| self.protocol(i).map(|x| x.state_hash(p)))
            .collect();
        h.sort();
        h.dedup();
        h.len()
    }

    /// Whether all live honest peers hold identical states of every fragment.
    pub fn honest_agree(&self) -> bool {
        (0..self.plan.len()).all(|p| self.honest_distinct_states(p) == 1)
    }

    /// Mean global loss of the live honest peers' anchors.
    pub fn honest_anchor_loss(&self) -> f64 {
        let losses: Vec<f64> = (0..self.peers())
            .filter(|&i| !self.is_hostile(i))
            .filter_map(|i| self.protocol(i))
            .map(|p| {
                let flat: Vec<f32> =
                    (0..self.plan.len()).flat_map(|f| p.state(f).anchor.iter().copied()).collect();
                self.problem.loss(&flat)
            })
            .collect();
        losses.iter().sum::<f64>() / losses.len().max(1) as f64
    }

    /// A hostile peer's protocol wants to gossip `msg`: send what its attack sends instead.
    pub(super) fn hostile_broadcast(&mut self, i: usize, msg: Message) {
        let me = PeerId(i as u64);
        let Some(attack) = self.byz.attack(i) else { return };
        match (msg, attack) {
            (Message::Contribution(c), attack) if c.origin == me => self.craft(i, c, attack),
            (Message::State(s), Attack::VoteTakeover { sybils, forged, .. }) => {
                self.takeover(i, &s, sybils, forged)
            }
            (msg, _) => self.gossip_from(i, me, msg),
        }
    }

    /// Peer `i` (honest) gossiped `msg`: hostile peers that react to others' deltas do.
    pub(super) fn observe_honest(&mut self, i: usize, msg: &Message) {
        let Message::Contribution(c) = msg else { return };
        let Some(bytes) = self.slots[i].peer.as_ref().and_then(|p| p.payload(&c.hash)) else {
            return;
        };
        for h in 0..self.peers() {
            let Some(attack) = self.byz.attack(h) else { continue };
            if h == i || self.slots[h].peer.is_none() {
                continue;
            }
            let me = PeerId(h as u64);
            match attack {
                Attack::ScaledPoison { stolen: true }
                | Attack::Direction
                | Attack::Oblique
                | Attack::Aligned => self.byz.saw(h, c.fragment as usize, bytes.clone()),
                Attack::ForgedOrigin => self.gossip_from(h, me, Message::Contribution(c.clone())),
                Attack::StolenDelta => {
                    self.byz.keep(h, c.hash, bytes.clone());
                    let stolen = ContributionAnnounce { origin: me, ..c.clone() };
                    self.gossip_from(h, me, Message::Contribution(stolen));
                }
                _ => {}
            }
        }
    }

    /// Replaces hostile peer `i`'s honest announcement `c` by what `attack` announces.
    fn craft(&mut self, i: usize, c: ContributionAnnounce, attack: Attack) {
        let me = PeerId(i as u64);
        let p = c.fragment as usize;
        let Some(honest) = self.own_values(i, &c.hash, p) else { return };
        let tps = self.settings.tokens_per_step();
        let codec = self.settings.raw().encode.codec;
        let meta = DeltaMeta {
            author: me.0,
            fragment: c.fragment,
            round: c.round,
            tokens: c.tokens,
            steps: c.steps,
        };
        let scaled = |v: &[f32], k: f32| v.iter().map(|x| x * k).collect::<Vec<f32>>();
        match attack {
            Attack::InflatedTokens => {
                let m = DeltaMeta { tokens: 1 << 40, steps: 1, ..meta };
                self.publish(i, me, &c, m, &honest, codec);
            }
            Attack::InflatedSteps => {
                let steps = 1_000_000;
                let m = DeltaMeta { tokens: steps * tps, steps, ..meta };
                self.publish(i, me, &c, m, &honest, codec);
            }
            Attack::ScaledPoison { stolen } => {
                let victim = stolen.then(|| self.stolen_values(i, p)).flatten();
                let base = victim.as_deref().unwrap_or(&honest);
                self.publish(i, me, &c, meta, &scaled(base, -10.0), codec);
            }
            Attack::Reversed => self.publish(i, me, &c, meta, &scaled(&honest, -1.0), codec),
            Attack::Direction | Attack::Oblique | Attack::Aligned => {
                let mut v = self.against_seen(i, p).unwrap_or_else(|| scaled(&honest, -1.0));
                if attack != Attack::Direction {
                    self.beside_momentum(i, p, &mut v);
                }
                if attack == Attack::Aligned {
                    self.toward_momentum(i, p, &mut v, 0.5);
                }
                self.publish(i, me, &c, meta, &v, codec);
            }
            Attack::HugeValues { codec } => {
                let Some(Some(h)) = self.byz.by_peer.get_mut(i) else { return };
                let big = f32::MAX / 127.0;
                let v: Vec<f32> = honest
                    .iter()
                    .map(|_| {
                        big * h.rng.random_range(0.5f32..1.0)
                            * if h.rng.random_bool(0.5) { 1.0 } else { -1.0 }
                    })
                    .collect();
                self.publish(i, me, &c, meta, &v, codec);
            }
            Attack::ZeroMaxClaim => {
                let steps = self.settings.max_weighted_steps();
                let m = DeltaMeta { tokens: steps * tps, steps, ..meta };
                self.publish(i, me, &c, m, &vec![0.0; honest.len()], codec);
            }
            Attack::Equivocation { copies } => {
                for k in 0..copies.max(1) {
                    let v = scaled(&honest, if k % 2 == 0 { 1.0 + k as f32 } else { -(k as f32) });
                    self.publish(i, me, &c, meta, &v, codec);
                }
            }
            Attack::VoteTakeover { sybils, earn_credit, .. } => {
                self.gossip_from(i, me, Message::Contribution(c.clone()));
                for k in (0..sybils).filter(|_| earn_credit) {
                    let s = sybil(i, k);
                    self.publish(i, s, &c, DeltaMeta { author: s.0, ..meta }, &honest, codec);
                }
            }
            Attack::ForgedOrigin | Attack::StolenDelta => {
                self.gossip_from(i, me, Message::Contribution(c))
            }
        }
    }

    /// Encodes `values` under `meta`, keeps the payload to serve and announces it as `from`
    /// (also the `origin` it claims).
    fn publish(
        &mut self,
        i: usize,
        from: PeerId,
        c: &ContributionAnnounce,
        meta: DeltaMeta,
        values: &[f32],
        codec: Codec,
    ) {
        let opts = delta::EncodeOptions { codec, ..self.settings.raw().encode };
        let Ok(enc) = delta::encode(meta, values, None, &opts) else { return };
        let announce = ContributionAnnounce {
            hash: enc.hash,
            size: enc.bytes.len() as u64,
            tokens: meta.tokens,
            steps: meta.steps,
            origin: from,
            ..c.clone()
        };
        self.byz.keep(i, enc.hash, enc.bytes);
        self.gossip_from(i, from, Message::Contribution(announce));
    }

    /// After its merge, hostile peer `i` and its Sybils vote for a forged state of `s`'s
    /// fragment, which it serves.
    fn takeover(&mut self, i: usize, s: &StateAnnounce, sybils: usize, forged: Forgery) {
        let p = s.fragment as usize;
        let Some(mine) = self.protocol(i).map(|x| x.state(p).clone()) else { return };
        let poison: Vec<f32> = mine.anchor.iter().map(|a| -10.0 * a).collect();
        let mut state = FragmentState::initial(s.fragment, poison.clone());
        let (voted, payload_round) = match forged {
            Forgery::FutureRound => (s.round + 1, s.round + 1),
            Forgery::MaxRound => (s.round + 1, u64::MAX),
            Forgery::ForgedLog | Forgery::KnownParent | Forgery::UnservedLog => (s.round, s.round),
        };
        state.momentum = mine.momentum.clone();
        state.record(
            payload_round,
            vec![ContentHash([0xde; 32]), ContentHash::of(&s.fragment.to_le_bytes())],
            4,
        );
        state.round = payload_round;
        match forged {
            Forgery::KnownParent => {
                state = mine;
                state.anchor = poison;
            }
            Forgery::UnservedLog => {
                let made_up = vec![ContentHash([0xde; 32]), ContentHash([0xad; 32])];
                state = mine;
                state.anchor = poison;
                state.log.pop_back();
                state.record(payload_round, made_up, 4);
            }
            _ => {}
        }
        let bytes: Bytes = state.to_bytes().into();
        let hash = ContentHash::of(&bytes);
        let vote = StateAnnounce {
            fragment: s.fragment,
            round: voted,
            hash,
            size: bytes.len() as u64,
            // The count its payload's log bears out (a larger claim is caught on fetch).
            took: Some(state.took()),
            recipe: None,
            // The parent its payload names: a false one is caught on fetch.
            parent: Some(state.parent),
        };
        self.byz.keep(i, hash, bytes);
        let voters: Vec<PeerId> =
            std::iter::once(PeerId(i as u64)).chain((0..sybils).map(|k| sybil(i, k))).collect();
        for v in voters {
            self.gossip_from(i, v, Message::State(vote.clone()));
        }
    }

    /// The values of hostile peer `i`'s own honest delta `hash` of fragment `p`.
    fn own_values(&self, i: usize, hash: &ContentHash, p: usize) -> Option<Vec<f32>> {
        let bytes = self.slots[i].peer.as_ref()?.payload(hash)?;
        self.decode_values(&bytes, p)
    }

    /// The values of the latest honest delta of another peer that `i` saw for `p`.
    fn stolen_values(&self, i: usize, p: usize) -> Option<Vec<f32>> {
        let bytes = self.byz.by_peer.get(i)?.as_ref()?.seen.get(p)?.back()?.clone();
        self.decode_values(&bytes, p)
    }

    /// `−Σ uᵢ` over the unit vectors of the honest deltas `i` saw for `p`, scaled to 1.9×
    /// their median norm.
    fn against_seen(&self, i: usize, p: usize) -> Option<Vec<f32>> {
        let seen = self.byz.by_peer.get(i)?.as_ref()?.seen.get(p)?;
        let all: Vec<Vec<f32>> = seen.iter().filter_map(|b| self.decode_values(b, p)).collect();
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let mut norms: Vec<f64> = all.iter().map(|v| norm(v)).filter(|n| *n > 0.0).collect();
        norms.sort_by(f64::total_cmp);
        let median = *norms.get(norms.len().checked_sub(1)? / 2)?;
        let mut sum = vec![0f64; all.first()?.len()];
        for v in &all {
            let n = norm(v);
            for (s, &x) in sum.iter_mut().zip(v).filter(|_| n > 0.0) {
                *s += f64::from(x) / n;
            }
        }
        let k = -1.9 * median / sum.iter().map(|x| x * x).sum::<f64>().sqrt();
        k.is_finite().then(|| sum.iter().map(|&x| (k * x) as f32).collect())
    }

    /// Takes hostile peer `i`'s outer momentum of fragment `p` out of each tensor of `v`,
    /// keeping each tensor's norm: a cosine of zero with the momentum, tensor by tensor.
    fn beside_momentum(&self, i: usize, p: usize, v: &mut [f32]) {
        let Some(proto) = self.protocol(i) else { return };
        let Some(spec) = self.plan.fragments.get(p) else { return };
        let m = &proto.state(p).momentum;
        let dot = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum::<f64>()
        };
        for (_, r) in spec.ranges() {
            let (v, m) = (&mut v[r.clone()], &m[r]);
            let (before, mm) = (dot(v, v).sqrt(), dot(m, m));
            if mm == 0.0 {
                continue;
            }
            let k = dot(v, m) / mm;
            for (x, &y) in v.iter_mut().zip(m) {
                *x = (f64::from(*x) - k * f64::from(y)) as f32;
            }
            let after = dot(v, v).sqrt();
            if after > 0.0 {
                v.iter_mut().for_each(|x| *x = (f64::from(*x) * before / after) as f32);
            }
        }
    }

    /// Turns `v` (already beside the momentum) towards hostile peer `i`'s outer momentum of
    /// fragment `p`, keeping each tensor's norm, until each tensor's cosine with it is
    /// `share` × the median momentum cosine of the honest deltas it saw, as the merge
    /// reads it ([`momentum_cosine`]).
    fn toward_momentum(&self, i: usize, p: usize, v: &mut [f32], share: f64) {
        let Some(proto) = self.protocol(i) else { return };
        let Some(spec) = self.plan.fragments.get(p) else { return };
        let Some(Some(h)) = self.byz.by_peer.get(i) else { return };
        let Some(seen) = h.seen.get(p) else { return };
        let m = &proto.state(p).momentum;
        let dot = |a: &[f32], b: &[f32]| {
            a.iter().zip(b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum::<f64>()
        };
        let mut cosines: Vec<f64> = seen
            .iter()
            .filter_map(|b| self.decode_values(b, p))
            .filter_map(|d| momentum_cosine(spec, &d, m))
            .collect();
        if cosines.is_empty() {
            return;
        }
        cosines.sort_by(f64::total_cmp);
        let c = (share * cosines[(cosines.len() - 1) / 2]).clamp(0.0, 0.99);
        for (_, r) in spec.ranges() {
            let (v, m) = (&mut v[r.clone()], &m[r]);
            let (nv, nm) = (dot(v, v).sqrt(), dot(m, m).sqrt());
            if nv == 0.0 || nm == 0.0 {
                continue;
            }
            let s = (1.0 - c * c).sqrt();
            for (x, &y) in v.iter_mut().zip(m) {
                *x = (nv * (s * f64::from(*x) / nv + c * f64::from(y) / nm)) as f32;
            }
        }
    }

    fn decode_values(&self, bytes: &[u8], p: usize) -> Option<Vec<f32>> {
        let limits = Limits { max_payload_bytes: self.settings.raw().max_payload_bytes };
        delta::decode(bytes, self.plan.fragments.get(p)?, &limits).ok().map(|d| d.values)
    }
}
