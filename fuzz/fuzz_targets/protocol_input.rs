//! What the protocol fuzz target decodes from its input (`arbitrary`): the run's
//! configuration and the operations, with the helpers that turn them into numbers.

use arbitrary::Arbitrary;
use atoll::delta::Codec;
use atoll::fragment::{FragmentPlan, TensorSpec};
use atoll::proto::{MergeRule, PeerId, RawSettings, Settings};

#[derive(Arbitrary, Debug)]
pub struct Config {
    pub merge: u8,
    pub codec: u8,
    pub merge_lag: u8,
    pub quorum: u8,
    pub max_lateness: u8,
    pub fetch_attempts: u8,
    pub small_held: bool,
    pub alpha_half: bool,
    pub start: Start,
    /// Starts as a fresh peer joining a swarm that has merged (held until caught up).
    pub late: bool,
}

#[derive(Arbitrary, Debug)]
pub enum Start {
    Zero,
    At(u32),
    Far(u64),
}

/// A round number: near the core's current round of the fragment, or anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum RoundSel {
    Current(i8),
    Abs(u64),
    Max,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Values {
    Zero,
    Small(i8),
    Huge(bool),
    Tiny,
    NonFinite(u8),
    Bits(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Count {
    Small(u8),
    Big(u64),
    Max,
    Zero,
}

#[derive(Arbitrary, Debug)]
pub enum Op {
    /// Fire the earliest timer (at its time, or later).
    FireNext {
        late: u16,
    },
    /// Fire any pending timer (at or after its time).
    Fire {
        idx: u8,
        late: u16,
    },
    Advance(u16),
    JumpAhead(u64),
    ClockBack(u16),
    /// Answer the oldest snapshot request.
    Snapshot {
        values: Values,
        tokens: Count,
        steps: Count,
        idx: u8,
    },
    /// A snapshot nobody asked for.
    StraySnapshot {
        fragment: u8,
        round: RoundSel,
        values: Values,
        tokens: Count,
        steps: Count,
        short: bool,
    },
    /// A peer encodes a delta and announces it.
    Contribute {
        from: u8,
        author: u8,
        fragment: u8,
        round: RoundSel,
        tokens: Count,
        steps: Count,
        values: Values,
        codec: u8,
        /// Header bytes overwritten after encoding (offset in the 64-byte header, value).
        edits: Vec<(u8, u8)>,
        /// Announcement fields that differ from the payload.
        lie: Option<Lie>,
        base_round: RoundSel,
    },
    /// A peer announces a state derived from the core's own one (or junk bytes).
    AnnounceState {
        from: u8,
        fragment: u8,
        round: RoundSel,
        anchor: Values,
        log: Vec<u64>,
        junk: Option<Vec<u8>>,
        lie_size: Option<u64>,
    },
    /// A message with arbitrary fields.
    RawContribution {
        from: u64,
        fragment: u32,
        round: u64,
        size: u64,
        tokens: u64,
        steps: u64,
        origin: u64,
        base_round: u64,
        hash: HashSel,
    },
    RawState {
        from: u64,
        fragment: u32,
        round: u64,
        size: u64,
        hash: HashSel,
    },
    /// Answer a pending fetch with the payload the harness knows for its hash.
    Deliver {
        idx: u8,
        from_other: bool,
    },
    /// Answer a pending fetch with other bytes.
    DeliverJunk {
        idx: u8,
        bytes: Vec<u8>,
    },
    /// Answer a pending fetch with the right bytes cut short.
    DeliverTruncated {
        idx: u8,
        keep: u16,
    },
    /// Answer a fetch nobody asked for.
    DeliverUnsolicited {
        hash: HashSel,
    },
    /// No holder delivered; `denied`: the holder answered that it does not have it.
    FetchFailed {
        idx: u8,
        denied: bool,
    },
    Serve {
        hash: HashSel,
    },
    /// A member of the run connects.
    MemberJoined,
    /// The peer's clock decides (release, re-announcements, finishing when quiet).
    Poll,
    /// The trainer took a step.
    Stepped,
    /// The trainer reached its target.
    Trained,
    /// The user asks the peer to stop.
    Stop,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Lie {
    Round(u64),
    Tokens(u64),
    Steps(u64),
    Size(u64),
    Origin(u64),
    Fragment(u32),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum HashSel {
    Known(u8),
    StateOf(u8),
    Random([u8; 32]),
}

pub fn peer(x: u8) -> PeerId {
    PeerId(u64::from(x % 8) + 1)
}

pub fn count(c: Count) -> u64 {
    match c {
        Count::Small(n) => u64::from(n),
        Count::Big(n) => n,
        Count::Max => u64::MAX,
        Count::Zero => 0,
    }
}

pub fn codec(x: u8, default: Codec) -> Codec {
    match x % 4 {
        0 => Codec::Q4,
        1 => Codec::Q8,
        2 => Codec::F32,
        _ => default,
    }
}

pub fn fill(v: Values, base: &[f32]) -> Vec<f32> {
    base.iter()
        .enumerate()
        .map(|(i, &b)| match v {
            Values::Zero => b,
            Values::Small(s) => b + f32::from(s) * 0.01 * ((i % 3) as f32 - 1.0),
            Values::Huge(neg) => {
                if neg {
                    -3.0e38
                } else {
                    3.0e38
                }
            }
            Values::Tiny => b + 1e-40,
            Values::NonFinite(k) if usize::from(k) % base.len().max(1) == i => f32::NAN,
            Values::NonFinite(_) => b,
            Values::Bits(bits) => f32::from_bits(bits.rotate_left(i as u32)),
        })
        .collect()
}

impl Config {
    /// The run this configuration describes: a small model in two fragments, its
    /// settings, and its initial parameters.
    pub fn run(&self) -> Option<(FragmentPlan, Settings, Vec<Vec<f32>>)> {
        let c = self;
        let t = |n: &str, len: usize, emb: bool| TensorSpec {
            name: n.into(),
            shape: vec![len],
            is_embedding: emb,
        };
        let plan = FragmentPlan::new(
            &[t("emb", 32, true), t("a", 24, false), t("b", 16, false), t("c", 8, false)],
            2,
        )
        .ok()?;
        let mut raw = RawSettings {
            h: 10,
            fragments: 2,
            step_ms: 100,
            grace_cap_ms: 100,
            merge_lag: u64::from(c.merge_lag % 3),
            quorum: usize::from(c.quorum % 3) + 1,
            max_lateness: u64::from(c.max_lateness % 4) + 1,
            fetch_attempts: u32::from(c.fetch_attempts % 3) + 1,
            merge: [MergeRule::Rda, MergeRule::Mean, MergeRule::TrimmedMean]
                [usize::from(c.merge % 3)],
            alpha: if c.alpha_half { 0.5 } else { 0.0 },
            ..RawSettings::default()
        };
        raw.encode.codec = codec(c.codec, Codec::Q4);
        if c.small_held {
            raw.max_held = 4;
            raw.max_held_bytes = 1 << 20;
        }
        let settings = Settings::new(raw).ok()?.with_tokens_per_step(16);
        let init: Vec<Vec<f32>> = plan
            .fragments
            .iter()
            .map(|f| (0..f.numel()).map(|i| (i as f32 * 0.37).sin()).collect())
            .collect();
        Some((plan, settings, init))
    }
}
