//! The attacks a hostile simulated peer can run ([`super::byzantine`] carries them out).

use crate::delta::Codec;

/// What a hostile peer does. Letters refer to the threat list in ARCHITECTURE.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Attack {
    /// (a) Its honest delta, claimed as 2^40 tokens in 1 step.
    InflatedTokens,
    /// (a) Its honest delta, claimed as 10^6 steps with tokens to match.
    InflatedSteps,
    /// (b) Its honest delta (or, if `stolen`, the latest honest delta of another peer it
    /// saw) × −10, under its own name and its honest counts.
    ScaledPoison { stolen: bool },
    /// (b) Its honest delta × −1: within every norm bound, pointing back.
    Reversed,
    /// (b) Minus the sum of the unit vectors of the latest honest deltas it saw for the
    /// fragment, scaled to 1.9× their median norm (just inside the clip): the direction
    /// that undoes the honest peers' together. Colluding identities send the same.
    Direction,
    /// (b) [`Attack::Direction`] with the state's outer momentum taken out of each tensor
    /// (and scaled back to the same norm): the aimed delta that no check against the
    /// momentum refuses, at an angle to where the swarm has been going. Colluding
    /// identities send the same.
    Oblique,
    /// (b) The attacker's answer to the momentum's share (`agreement::momentum_factors`):
    /// [`Attack::Oblique`] turned towards the momentum, tensor by tensor, until its cosine
    /// with it is half the median of the honest deltas it saw — just enough to keep its
    /// whole weight. Colluding identities send the same. Not in [`Attack::catalogue`]: it
    /// is the one well-formed attack the merge's bounds do not hold against (SECURITY.md).
    Aligned,
    /// (c) Well-formed, finite values near `f32::MAX / 127`, honest counts.
    HugeValues { codec: Codec },
    /// (d) A zero delta with the largest claim the manifest allows.
    ZeroMaxClaim,
    /// (e) Re-announces every honest delta it sees with `origin` = the victim.
    ForgedOrigin,
    /// (e) Re-announces every honest delta it sees as its own (it holds the bytes).
    StolenDelta,
    /// (f) `copies` different deltas per round under its own name.
    Equivocation { copies: usize },
    /// (g) After each merge, `sybils` fresh identities (and its own) vote for a forged
    /// state, which it serves under that hash. With `earn_credit`, each Sybil also
    /// publishes a well-formed delta every round (a copy of the attacker's honest one),
    /// which is what crediting a voter asks for.
    VoteTakeover { sybils: usize, forged: Forgery, earn_credit: bool },
}

/// The state a [`Attack::VoteTakeover`] serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgery {
    /// Voted for the next round (the latest a vote may name); payload of that round.
    FutureRound,
    /// Voted for the next round; the payload says round `u64::MAX`.
    MaxRound,
    /// Voted for the round just merged; a poisoned anchor and a made-up merged-id log.
    ForgedLog,
    /// Voted for the round just merged; the attacker's own state (its parent and its
    /// contribution set, which honest peers hold) with a poisoned anchor.
    KnownParent,
    /// Voted for the round just merged; the attacker's own parent with a poisoned anchor
    /// and a log that lists deltas nobody holds: made on a parent honest peers hold, and
    /// still impossible to recompute.
    UnservedLog,
}

impl Attack {
    /// Every attack, once (the plain Sybil vote, without earned credit).
    pub fn catalogue() -> Vec<Attack> {
        let vote = |forged| Attack::VoteTakeover { sybils: 24, forged, earn_credit: false };
        vec![
            Attack::InflatedTokens,
            Attack::InflatedSteps,
            Attack::ScaledPoison { stolen: false },
            Attack::ScaledPoison { stolen: true },
            Attack::Reversed,
            Attack::Direction,
            Attack::Oblique,
            Attack::HugeValues { codec: Codec::Q8 },
            Attack::HugeValues { codec: Codec::F32 },
            Attack::ZeroMaxClaim,
            Attack::ForgedOrigin,
            Attack::StolenDelta,
            Attack::Equivocation { copies: 6 },
            vote(Forgery::FutureRound),
            vote(Forgery::MaxRound),
            vote(Forgery::ForgedLog),
            vote(Forgery::KnownParent),
            vote(Forgery::UnservedLog),
        ]
    }
}
