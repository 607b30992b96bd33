//! Named model sizes (`--model`) and what each needs in memory.
//!
//! A preset is a whole training configuration — shape, batch, inner learning rate — so a
//! new run is one word; the manifest records the expanded numbers, never the name, so a
//! preset retuned later cannot change a running swarm's model.

use super::{InnerOptimizer, TrainConfig};
use crate::model::{ModelConfig, VOCAB_SIZE};

/// A named model size. The parameter counts are checked against the built model by the
/// tests below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Preset {
    /// 26k parameters, context 16: the test suite's model; seconds per run.
    Tiny,
    /// 0.67M parameters, context 64: the default; a 4-peer demo in about a minute on 2 cores.
    #[default]
    Default,
    /// 4.9M parameters, context 128: a spare desktop (about 0.4 GB per peer).
    Small,
    /// 25.6M parameters, context 256: a workstation with 4+ cores (about 2 GB per peer).
    Base,
}

impl Preset {
    /// The training configuration of this preset with `seed`.
    pub fn train_config(self, seed: u64) -> TrainConfig {
        let shaped = |d: usize, layers: usize, heads: usize, context: usize, peak: f64| {
            // AdamW: at these widths Muon's Newton–Schulz iterations cost as much as the
            // step itself (`small` alone: 1.76× as long a step for 1.7% lower val_bpb at
            // equal steps, bench/RESULTS.md, "Muon as the inner optimizer").
            let optimizer = InnerOptimizer::Adamw;
            let mut c = TrainConfig { seed, optimizer, ..TrainConfig::default() };
            c.model = ModelConfig::new()
                .with_d_model(d)
                .with_n_layers(layers)
                .with_n_heads(heads)
                .with_d_ff(4 * d)
                .with_context(context);
            // The default's swept rate (8e-3 at width 128) scaled as 1/width, as is usual for
            // Adam on wider hidden layers; not swept at these sizes.
            c.schedule.peak = peak;
            c
        };
        match self {
            Self::Tiny => TrainConfig::tiny(seed),
            Self::Default => TrainConfig { seed, ..TrainConfig::default() },
            Self::Small => shaped(256, 6, 8, 128, 4e-3),
            Self::Base => shaped(512, 8, 8, 256, 2e-3),
        }
    }
}

impl Preset {
    /// The reference inner step of a new run of this preset in ms (the manifest's
    /// `step_ms`: a fragment is due every `h ×` this): about one step of a peer alone on a
    /// 2-core machine (bench/RESULTS.md, "Model presets"), so that a period holds about `h`
    /// steps there. Slower peers take fewer steps per period and send more bytes per step;
    /// faster ones take more.
    pub fn step_ms(self) -> u64 {
        match self {
            Self::Tiny | Self::Default => 250,
            Self::Small => 1_000,
            Self::Base => 6_000,
        }
    }
}

impl ModelConfig {
    /// Number of trainable parameters (what burn's `num_params` counts for [`crate::model::Lm`]).
    /// Saturating, like [`memory_estimate`]: shapes may not be validated yet.
    pub fn num_params(&self) -> u64 {
        let (d, ff) = (self.d_model as u64, self.d_ff as u64);
        let vocab = VOCAB_SIZE as u64;
        let attention = d.saturating_mul(d).saturating_add(d).saturating_mul(4);
        let feed_forward =
            d.saturating_mul(ff).saturating_mul(2).saturating_add(ff).saturating_add(d);
        let per_block = attention.saturating_add(feed_forward).saturating_add(d.saturating_mul(4));
        let blocks = (self.n_layers as u64).saturating_mul(per_block);
        let embeddings = vocab.saturating_add(self.context as u64).saturating_mul(d);
        embeddings
            .saturating_add(blocks)
            .saturating_add(d.saturating_mul(vocab + 2))
            .saturating_add(vocab)
    }
}

/// Peak resident memory of one training peer of `c`, in bytes, estimated from the shape:
/// 48 bytes per parameter (weights, gradients, AdamW's two moments, the fragment anchors
/// and outer momentum, a snapshot for the delta, a held delta or two), twice the
/// activations autodiff keeps for one batch (per token and block: 12 × width floats plus
/// 3 × heads × context attention scores; twice, since a step's operations run on every
/// thread of the compute pool, and the allocator's per-thread arenas hold freed blocks of
/// one step where the next step's come from another arena), and 64 MiB for the process.
/// Against measured peaks of `atoll train` (bench/RESULTS.md, "Steps on the compute
/// pool"): 91–114 / 361–535 / 1,770 MiB measured for default / small / base, 121 / 576 /
/// 2,772 MiB estimated.
///
/// Saturating: it runs on shapes from the command line before they are validated.
pub fn memory_estimate(c: &TrainConfig) -> u64 {
    memory_estimate_in_passes(c, c.batch)
}

/// [`memory_estimate`] with each step's batch run in passes of at most `rows` rows
/// ([`crate::train::Trainer::set_micro_batch`]): autodiff keeps one pass's activations.
pub fn memory_estimate_in_passes(c: &TrainConfig, rows: usize) -> u64 {
    let m = &c.model;
    let n = |x: usize| x as u64;
    let rows = rows.clamp(1, c.batch.max(1));
    let token_blocks = n(rows).saturating_mul(n(m.context)).saturating_mul(n(m.n_layers));
    let floats = n(m.d_model)
        .saturating_mul(12)
        .saturating_add(n(m.n_heads).saturating_mul(3).saturating_mul(n(m.context)));
    let activations = token_blocks.saturating_mul(floats.saturating_mul(2 * 4));
    m.num_params().saturating_mul(48).saturating_add(activations).saturating_add(64 << 20)
}

/// The model needs more memory than the machine has, even one row at a time.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "this model ({params} parameters) needs about {need_mib} MiB per peer even one batch row \
     at a time, {total_mib} MiB for {peers} peer(s), and this machine has {available_mib} MiB \
     available: pick a smaller --model, or fewer peers"
)]
pub struct TooLarge {
    pub params: u64,
    pub need_mib: u64,
    pub total_mib: u64,
    pub peers: u64,
    pub available_mib: u64,
}

/// How `peers` peers of `c` fit a machine with `available` bytes free: 0 when each can run
/// its whole batch at once, else the most rows per pass that fit (a micro-batch; the same
/// steps, slower); an error when not even one row at a time fits.
pub fn check_fits(c: &TrainConfig, peers: u64, available: u64) -> Result<usize, TooLarge> {
    let fits = |rows: usize| memory_estimate_in_passes(c, rows).saturating_mul(peers) <= available;
    if fits(c.batch) {
        return Ok(0);
    }
    // The estimate grows with the rows: the most that fit, by bisection (the batch comes
    // from the command line before it is validated).
    let (mut lo, mut hi) = (0usize, c.batch);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo > 0 {
        return Ok(lo);
    }
    let need = memory_estimate_in_passes(c, 1);
    Err(TooLarge {
        params: c.model.num_params(),
        need_mib: need >> 20,
        total_mib: need.saturating_mul(peers) >> 20,
        peers,
        available_mib: available >> 20,
    })
}

/// The memory this machine has available for new processes (`MemAvailable` of
/// /proc/meminfo), or `None` where that cannot be read (not Linux): then nothing is
/// refused up front.
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&info)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let mut words = line.split_whitespace();
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib.saturating_mul(1024))
}

/// The rows per pass `peers` peers of `c` run in on this machine: `chosen` (a
/// `--micro-batch`), else what [`check_fits`] finds against the available memory (0, the
/// whole batch at once, where that is unknown). Either way a model that does not fit even
/// one row at a time is refused; a micro-batch the peer picked itself is logged (it trains
/// slower than it could).
pub fn check_machine(c: &TrainConfig, peers: u64, chosen: Option<u64>) -> Result<usize, TooLarge> {
    let fits = match available_memory() {
        Some(available) => check_fits(c, peers, available)?,
        None => 0,
    };
    if let Some(rows) = chosen {
        return Ok(usize::try_from(rows).unwrap_or(usize::MAX));
    }
    if fits > 0 {
        tracing::warn!(
            rows = fits,
            batch = c.batch,
            "the whole batch does not fit this machine's available memory: each step runs in \
             passes of {fits} rows (the same steps, slower)"
        );
    }
    Ok(fits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Lm;
    use burn::module::Module;
    use clap::ValueEnum;

    /// The counting formula is burn's count, and each preset's help states its count.
    #[test]
    fn presets_state_their_parameter_counts() {
        let device = Default::default();
        for preset in Preset::value_variants() {
            let c = preset.train_config(0);
            assert_eq!(c.validate().map_err(|e| e.to_string()), Ok(()), "{preset:?}");
            let n = c.model.num_params();
            if n < 10_000_000 {
                let lm: Lm = c.model.init(&device);
                assert_eq!(n, lm.num_params() as u64, "{preset:?}");
            }
            let help = preset.to_possible_value().unwrap().get_help().unwrap().to_string();
            let stated = if n < 100_000 {
                format!("{}k parameters", (n as f64 / 1e3).round())
            } else {
                format!("{:.2}M parameters", n as f64 / 1e6)
            };
            let stated_short = format!("{:.1}M parameters", n as f64 / 1e6);
            assert!(
                help.starts_with(&stated) || help.starts_with(&stated_short),
                "{preset:?}: help says {help:?}, the model has {n} ({stated} / {stated_short})"
            );
        }
        // The base preset's shape is the one issue 24 measured (25M).
        assert_eq!(Preset::Base.train_config(0).model.num_params(), 25_613_568);
    }

    /// Larger presets pace their rounds by their slower steps; the default run's protocol,
    /// and with it its run id, stays the one without a preset.
    #[test]
    fn each_preset_paces_a_valid_run() {
        use crate::manifest::{default_protocol, preset_protocol};
        use crate::proto::RawSettings;
        let mut last = 0;
        for preset in Preset::value_variants() {
            let optimizer = preset.train_config(0).optimizer;
            let settings =
                crate::proto::Settings::new(preset_protocol(*preset, optimizer)).unwrap();
            assert_eq!(settings.period_ms(), settings.raw().h * preset.step_ms(), "{preset:?}");
            assert!(preset.step_ms() >= last, "{preset:?} steps faster than a smaller preset");
            last = preset.step_ms();
        }
        let adamw = preset_protocol(Preset::Default, InnerOptimizer::Adamw);
        assert_eq!(adamw, default_protocol());
        let muon = preset_protocol(Preset::Default, InnerOptimizer::Muon);
        assert_eq!(muon, RawSettings { outer_lr: 1.0, ..default_protocol() });
        assert!(Preset::Base.step_ms() > Preset::Default.step_ms());
    }

    #[test]
    fn presets_grow_and_default_is_the_default_run() {
        let sizes: Vec<u64> =
            Preset::value_variants().iter().map(|p| p.train_config(0).model.num_params()).collect();
        assert!(sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
        assert_eq!(
            Preset::default().train_config(3),
            TrainConfig { seed: 3, ..Default::default() }
        );
    }

    #[test]
    fn a_machine_too_small_is_refused_with_the_numbers() {
        let base = Preset::Base.train_config(0);
        let need = memory_estimate(&base);
        assert_eq!(check_fits(&base, 1, need), Ok(0));
        let one_row = memory_estimate_in_passes(&base, 1);
        assert!(one_row < need);
        let err = check_fits(&base, 4, 4 * one_row - 1).unwrap_err();
        assert_eq!((err.peers, err.total_mib), (4, (4 * one_row) >> 20));
        let msg = err.to_string();
        assert!(msg.contains("25613568 parameters") && msg.contains("--model"), "{msg}");
        // The estimate covers the measured peaks it documents, within 1.6× of them.
        let mib = |p: Preset| memory_estimate(&p.train_config(0)) >> 20;
        assert!((114..=180).contains(&mib(Preset::Default)), "{}", mib(Preset::Default));
        assert!((535..=850).contains(&mib(Preset::Small)), "{}", mib(Preset::Small));
        assert!((1770..=2850).contains(&mib(Preset::Base)), "{}", mib(Preset::Base));
    }

    /// A machine that cannot hold the whole batch runs it in passes: the most rows that
    /// fit, and one more would not.
    #[test]
    fn a_machine_short_of_the_whole_batch_gets_micro_batches() {
        let base = Preset::Base.train_config(0);
        assert!(base.batch > 2);
        let available = 4 * memory_estimate(&base) * 2 / 3;
        let rows = check_fits(&base, 4, available).unwrap();
        assert!(rows >= 1 && rows < base.batch, "{rows}");
        assert!(4 * memory_estimate_in_passes(&base, rows) <= available);
        assert!(4 * memory_estimate_in_passes(&base, rows + 1) > available);
        // Passes never count more rows than the batch has, nor fewer than one.
        assert_eq!(memory_estimate_in_passes(&base, 10 * base.batch), memory_estimate(&base));
        assert_eq!(memory_estimate_in_passes(&base, 0), memory_estimate_in_passes(&base, 1));
    }

    /// A chosen micro-batch is kept as chosen; without one, a model that fits runs whole.
    #[test]
    fn a_chosen_micro_batch_is_kept() {
        let tiny = TrainConfig::tiny(0);
        assert_eq!(check_machine(&tiny, 1, Some(3)), Ok(3));
        assert_eq!(check_machine(&tiny, 1, None), Ok(0));
    }

    /// Shapes from the command line reach the estimate before validation: absurd ones
    /// are refused by the numbers, never by an overflow.
    #[test]
    fn absurd_shapes_are_refused_not_overflowed() {
        let mut c = Preset::Base.train_config(0);
        c.batch = usize::MAX;
        c.model = ModelConfig::new().with_d_model(usize::MAX).with_context(usize::MAX);
        assert_eq!(memory_estimate(&c), u64::MAX);
        assert!(check_fits(&c, 4, 1 << 40).is_err());
    }

    #[test]
    fn mem_available_is_read_or_ignored() {
        let info = "MemTotal:       24000000 kB\nMemAvailable:   1000 kB\n";
        assert_eq!(parse_mem_available(info), Some(1_024_000));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: 5 MB\n"), None);
    }
}
