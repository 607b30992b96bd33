//! Protocol settings: raw (serde, goes into the run manifest) → validated.
//!
//! Every peer of a run must hold the same settings: the schedule, the merge rule and the
//! outer optimizer are all derived from them, and a difference would make anchors diverge.

use crate::delta::EncodeOptions;
use serde::{Deserialize, Serialize};

/// Most contributions a lane may hold (`max_held`).
pub const MAX_HELD: usize = 65_536;
/// Largest byte budget for held and in-flight deltas (`max_held_bytes`): 8 GiB.
pub const MAX_HELD_BYTES: u64 = 8 << 30;
/// Largest payload (`max_payload_bytes`): 1 GiB, an f32 fragment of 256M parameters.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 30;

/// How one fragment's deltas are combined (DESIGN.md §2.3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MergeRule {
    /// Radial-directional averaging per tensor; the embedding takes the weighted mean.
    Rda,
    /// Weighted mean for every tensor (ablation baseline).
    Mean,
    /// Coordinate-wise trimmed mean, unweighted (the stronger rule for open swarms: a
    /// minority of bad values per coordinate cannot move the result past honest ones).
    TrimmedMean,
}

/// Settings as written in a manifest. Field docs give the unit and the default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawSettings {
    /// `H`: inner steps per fragment cycle at the reference speed. Default 50.
    pub h: u64,
    /// `P`: number of fragments. Default 4.
    pub fragments: usize,
    /// Reference duration of one inner step in ms; the cycle period is `h × step_ms`.
    /// Default 100.
    pub step_ms: u64,
    /// `K`: minimum quorum of contributions (own included) before a round may close.
    pub quorum: usize,
    /// `γ` of the grace window (Eq. 3). Default 0.5.
    pub gamma: f64,
    /// Upper bound of the grace window in ms. Default 1000.
    pub grace_cap_ms: u64,
    /// `τ`: overlap in inner steps between the start of a merge and the anchor landing.
    pub tau: u64,
    /// Weight of a new sample in the moving averages of step, quorum and sync times.
    pub ema_weight: f64,
    /// Outer SGD learning rate. Default 0.7.
    pub outer_lr: f32,
    /// Outer Nesterov momentum `μ`. Default 0.9.
    pub momentum: f32,
    /// `α`: the trainer takes `α·θ + (1−α)·anchor`; 0 replaces. Default 0.
    pub alpha: f32,
    /// Combination rule. Default RDA.
    pub merge: MergeRule,
    /// Delta codec.
    pub encode: EncodeOptions,
    /// A contribution may be merged up to this many rounds after the round it was made for;
    /// older ones are dropped as stale. Bounds memory and the merged-id log. Default 3.
    pub max_lateness: u64,
    /// Rounds between a delta's round and the round that merges it: 1 (default) merges
    /// the previous round's deltas, which have had a whole period to spread, so all peers
    /// merge the same set; 0 merges a round's own deltas (the paper's timing), at the price
    /// of sets that differ with arrival times and more reconciliation. See ARCHITECTURE.md.
    pub merge_lag: u64,
    /// If the quorum is not met this long after a round opened, the round is skipped and
    /// what arrived stays pending. Default `grace_cap_ms + 2 × step_ms`.
    pub max_wait_ms: Option<u64>,
    /// When, as a fraction of the period after a round opened, a peer compares its anchor
    /// hash with the others' and starts fetching the majority state. Default 0.5. It
    /// compares again halfway from there to the next open (`Protocol::on_open`).
    pub reconcile_at: f64,
    /// Time per fetch attempt: a payload not fetched within `fetch_timeout_ms ×
    /// fetch_attempts` is given up. Sources, hedging and retries within that deadline are
    /// the transport's (atoll-net); the core asks once.
    pub fetch_timeout_ms: u64,
    /// See `fetch_timeout_ms`.
    pub fetch_attempts: u32,
    /// Most contributions held per fragment (pending or recently merged). Default 4096.
    pub max_held: usize,
    /// Byte budget of all contributions held (they stay encoded until merged), over all
    /// fragments. Default 512 MiB.
    pub max_held_bytes: u64,
    /// Largest payload fetched, in bytes. Default 256 MiB.
    pub max_payload_bytes: usize,
    /// Per tensor, a contribution's norm is clipped to `clip_factor ×` the median norm of
    /// the round's own contributions. Default 2.
    pub clip_factor: f64,
    /// No author's weight in a merge may exceed `max_author_share ×` the median author's.
    /// Default 2: a peer twice as fast as the median keeps its whole weight.
    pub max_author_share: f64,
    /// Fraction trimmed at each end per coordinate by the `trimmed_mean` rule. Default 0.2.
    pub trim: f64,
    /// Steps a contribution may claim in its weight, as a multiple of `h`: claims above
    /// `step_slack × h` weigh as if they held that many (a peer back from a stall keeps its
    /// work, an inflated claim buys nothing). Default 4.
    pub step_slack: u64,
    /// Scale each contribution's weight by how far it goes the round's way: its cosine
    /// with the coordinate-wise median of the round's delta directions, twice over the
    /// round's median cosine, clamped to `[0, 1]` (`proto::merge::agreement`). Zero,
    /// reversed and random deltas then weigh nothing, and only authors whose deltas
    /// weighed something earn vote credit. Default true.
    pub agreement_weights: bool,
    /// Adopt a fetched state that this peer cannot recompute only when it can be checked or
    /// a majority stands behind it (src/proto/check.rs): its missing deltas are fetched and
    /// it is recomputed; one made on a parent this peer never held needs most of the round's
    /// counted voters on that parent (or on the state itself); and the state to follow is
    /// picked within the lineage most voters claim. Off, an up-to-date peer takes such a
    /// state on a plurality, which two credited voters can win at merge lag 0 when the
    /// honest votes are spread (SECURITY.md). On in every new run's manifest
    /// (`manifest::default_protocol`; the default demo's quality and bytes are the same,
    /// bench/RESULTS.md, "Strict states by default"); false here, the protocol's neutral
    /// default, and in manifests written before it existed: at 1,000 all-to-all lag-0
    /// simulated peers with lost messages their votes, scattered over hundreds of states,
    /// do not come together in time with it (with sampled contributions they do).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub strict_states: bool,
    /// Deltas wanted per fragment round: in a larger swarm each peer publishes a fragment's
    /// delta only every `period` rounds, in a slot fixed by its id, with the work of the
    /// rounds between carried in its error-feedback residual; the period follows the
    /// swarm's size (`proto::sampling`). Traffic per peer then stays near `contributors`
    /// deltas a round however large the swarm. Default 0: every peer every round.
    #[serde(skip_serializing_if = "is_zero")]
    pub contributors: usize,
    /// Peers expected when the run starts, for a run that samples (`contributors`): round 1
    /// is then sampled too, at the period this size gives, instead of every peer sending
    /// its first delta (at 10,000 peers, 10⁸ fetches). The first merge measures the swarm
    /// and replaces it. Default 0: unknown, round 1 is all-to-all.
    #[serde(skip_serializing_if = "is_zero")]
    pub expected_peers: usize,
}

/// Settings added after runs existed are left out of a manifest while they keep their
/// default, so its canonical JSON, and the run id, stay what they were.
fn is_zero(v: &usize) -> bool {
    *v == 0
}

impl Default for RawSettings {
    fn default() -> Self {
        Self {
            h: 50,
            fragments: 4,
            step_ms: 100,
            quorum: 1,
            gamma: 0.5,
            grace_cap_ms: 1000,
            tau: 2,
            ema_weight: 0.2,
            outer_lr: 0.7,
            momentum: 0.9,
            alpha: 0.0,
            merge: MergeRule::Rda,
            encode: EncodeOptions::default(),
            max_lateness: 3,
            merge_lag: 1,
            max_wait_ms: None,
            reconcile_at: 0.5,
            fetch_timeout_ms: 2000,
            fetch_attempts: 3,
            max_held: 4096,
            max_held_bytes: 512 << 20,
            max_payload_bytes: 256 << 20,
            clip_factor: 2.0,
            max_author_share: 2.0,
            trim: 0.2,
            step_slack: 4,
            agreement_weights: true,
            strict_states: false,
            contributors: 0,
            expected_peers: 0,
        }
    }
}

impl RawSettings {
    /// The same run on a clock of `step_ms`: a shorter step shrinks the windows set in ms
    /// (the grace cap, and the max wait if set) in proportion, so they keep their share of
    /// the shorter period and a run that was valid stays valid; a longer one keeps them as
    /// they are.
    pub fn paced(self, step_ms: u64) -> Self {
        let (old, new) = (self.step_ms.max(1), step_ms);
        let shrink = |ms: u64| {
            if new >= old {
                return ms;
            }
            // Rounded down, so a window never outgrows its share; `new < old` keeps it in u64.
            (u128::from(ms) * u128::from(new) / u128::from(old)) as u64
        };
        Self {
            step_ms,
            grace_cap_ms: shrink(self.grace_cap_ms),
            max_wait_ms: self.max_wait_ms.map(shrink),
            ..self
        }
    }
}

/// Why settings were refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    #[error("{field} = {value} is out of range: {why}")]
    OutOfRange { field: &'static str, value: String, why: String },
}

/// A day in ms: the upper bound of every time setting.
const DAY_MS: u64 = 86_400_000;

fn check(
    ok: bool,
    field: &'static str,
    value: impl ToString,
    why: impl Into<String>,
) -> Result<(), SettingsError> {
    if ok {
        Ok(())
    } else {
        Err(SettingsError::OutOfRange { field, value: value.to_string(), why: why.into() })
    }
}

/// Validated settings. Fields are read through [`Settings::raw`]; serialises as the raw form.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    raw: RawSettings,
    max_wait_ms: u64,
    /// Most tokens one inner step can process (batch × context), from the run manifest:
    /// a contribution claiming more tokens than `steps ×` this is refused.
    tokens_per_step: u64,
}

impl Settings {
    /// Validates `raw`.
    pub fn new(raw: RawSettings) -> Result<Self, SettingsError> {
        let r = &raw;
        // Bounds that keep every derived time far from u64 overflow: a manifest fetched from
        // a stranger goes through this too.
        check((1..=1_000_000).contains(&r.h), "h", r.h, "1..=1000000 inner steps per cycle")?;
        check((1..=4096).contains(&r.fragments), "fragments", r.fragments, "1..=4096")?;
        check((1..=3_600_000).contains(&r.step_ms), "step_ms", r.step_ms, "1 ms..=1 h")?;
        let period = r.h * r.step_ms;
        check(period >= r.fragments as u64, "h", r.h, "period must leave ≥1 ms per fragment")?;
        check(r.grace_cap_ms <= DAY_MS, "grace_cap_ms", r.grace_cap_ms, "at most a day")?;
        check(
            r.max_wait_ms.is_none_or(|w| w <= DAY_MS),
            "max_wait_ms",
            format!("{:?}", r.max_wait_ms),
            "at most a day",
        )?;
        check(r.fetch_timeout_ms <= DAY_MS, "fetch_timeout_ms", r.fetch_timeout_ms, "≤ a day")?;
        check(r.quorum >= 1, "quorum", r.quorum, "at least 1")?;
        check((0.0..=1.0).contains(&r.gamma), "gamma", r.gamma, "0..=1")?;
        check(r.tau >= 1, "tau", r.tau, "at least 1")?;
        check(r.ema_weight > 0.0 && r.ema_weight <= 1.0, "ema_weight", r.ema_weight, "(0, 1]")?;
        check(r.outer_lr.is_finite() && r.outer_lr > 0.0, "outer_lr", r.outer_lr, "> 0")?;
        check((0.0..1.0).contains(&r.momentum), "momentum", r.momentum, "[0, 1)")?;
        check((0.0..=1.0).contains(&r.alpha), "alpha", r.alpha, "0..=1")?;
        check((1..=64).contains(&r.max_lateness), "max_lateness", r.max_lateness, "1..=64")?;
        check(
            r.reconcile_at > 0.0 && r.reconcile_at < 1.0,
            "reconcile_at",
            r.reconcile_at,
            "(0, 1)",
        )?;
        check(r.merge_lag <= 4, "merge_lag", r.merge_lag, "0..=4")?;
        let max_wait = r.max_wait_ms.unwrap_or(r.grace_cap_ms + 2 * r.step_ms);
        // The round must be closed before the reconciliation check looks at its votes.
        let reconcile_ms = (period as f64 * r.reconcile_at) as u64;
        check(
            max_wait.max(r.grace_cap_ms) < reconcile_ms,
            "grace_cap_ms",
            r.grace_cap_ms,
            format!(
                "the grace cap and the max wait ({} ms; unset: grace_cap_ms + 2 × step_ms) must \
                 end before reconcile_at × period = {reconcile_ms} ms (period = h × step_ms = \
                 {period} ms)",
                max_wait.max(r.grace_cap_ms)
            ),
        )?;
        // Upper bounds too: a joiner takes these from the run's creator, who must not be
        // able to set every peer's memory and stall limits out of reach.
        let (timeout, attempts) = (r.fetch_timeout_ms, r.fetch_attempts);
        check((1..=600_000).contains(&timeout), "fetch_timeout_ms", timeout, "1..=600000")?;
        check((1..=16).contains(&attempts), "fetch_attempts", attempts, "1..=16")?;
        check(r.max_held >= r.quorum, "max_held", r.max_held, "must hold at least a quorum")?;
        check(r.max_held <= MAX_HELD, "max_held", r.max_held, format!("≤ {MAX_HELD}"))?;
        let held_bytes = (1 << 20..=MAX_HELD_BYTES).contains(&r.max_held_bytes);
        check(held_bytes, "max_held_bytes", r.max_held_bytes, "1 MiB..=8 GiB")?;
        check(r.clip_factor >= 1.0, "clip_factor", r.clip_factor, "≥ 1 (may be inf)")?;
        check(r.max_author_share >= 1.0, "max_author_share", r.max_author_share, "≥ 1")?;
        check((0.0..0.5).contains(&r.trim), "trim", r.trim, "[0, 0.5)")?;
        check((1..=1024).contains(&r.step_slack), "step_slack", r.step_slack, "1..=1024")?;
        let most = super::MAX_PEERS;
        check(r.contributors <= most, "contributors", r.contributors, "0..=65536 (0: all)")?;
        let expected = r.expected_peers == 0 || r.contributors > 0;
        check(expected, "expected_peers", r.expected_peers, "needs contributors > 0")?;
        let expected = r.expected_peers <= super::sampling::MAX_EXPECTED_PEERS;
        check(expected, "expected_peers", r.expected_peers, "0..=2^32-1")?;
        let payload = (64..=MAX_PAYLOAD_BYTES).contains(&r.max_payload_bytes);
        check(payload, "max_payload_bytes", r.max_payload_bytes, "64..=1 GiB")?;
        check(
            crate::delta::BLOCK_RANGE.contains(&r.encode.block),
            "encode.block",
            r.encode.block,
            "8..=65536",
        )?;
        let keep = !r.encode.codec.is_sparse() || (1..=r.encode.block).contains(&r.encode.keep);
        check(keep, "encode.keep", r.encode.keep, "1..=encode.block")?;
        let decay = r.encode.feedback_decay;
        check((0.0..=1.0).contains(&decay), "encode.feedback_decay", decay, "[0, 1]")?;
        Ok(Self { raw, max_wait_ms: max_wait, tokens_per_step: u64::MAX })
    }

    /// Bounds token claims by what one inner step can process (batch × context of the
    /// run manifest). Without it any tokens-per-step ratio passes (the manifest and the
    /// simulator always set it).
    pub fn with_tokens_per_step(mut self, tokens_per_step: u64) -> Self {
        self.tokens_per_step = tokens_per_step.max(1);
        self
    }

    /// Most tokens one inner step can process.
    pub fn tokens_per_step(&self) -> u64 {
        self.tokens_per_step
    }

    /// Most steps a contribution's weight may count (`step_slack × h`).
    pub fn max_weighted_steps(&self) -> u64 {
        self.raw.step_slack * self.raw.h
    }

    /// The robustness bounds of the merge.
    pub fn merge_bounds(&self) -> super::merge::Bounds {
        super::merge::Bounds {
            clip: self.raw.clip_factor,
            max_share: self.raw.max_author_share,
            trim: self.raw.trim,
            agree: self.raw.agreement_weights,
            abstain: self.raw.encode.codec.is_sparse(),
        }
    }

    /// The settings as given.
    pub fn raw(&self) -> &RawSettings {
        &self.raw
    }

    /// Fragment cycle period in ms (`H × step_ms`).
    pub fn period_ms(&self) -> u64 {
        self.raw.h * self.raw.step_ms
    }

    /// Longest wait for the quorum after a round opens.
    pub fn max_wait_ms(&self) -> u64 {
        self.max_wait_ms
    }

    /// Offset of the reconciliation check after a round opens.
    pub fn reconcile_offset_ms(&self) -> u64 {
        (self.period_ms() as f64 * self.raw.reconcile_at) as u64
    }
}

impl Serialize for Settings {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Settings {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Settings::new(RawSettings::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
