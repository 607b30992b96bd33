//! What a simulated run is made of ([`SimConfig`]) and its default: a small model on a
//! calm network.

use super::byzantine::Attack;
use super::net::NetConfig;
use crate::fragment::TensorSpec;
use crate::proto::RawSettings;

/// Everything a simulated run is made of.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub peers: usize,
    pub seed: u64,
    pub settings: RawSettings,
    /// The model's tensors (cut into fragments by
    /// [`FragmentPlan`](crate::fragment::FragmentPlan)).
    pub tensors: Vec<TensorSpec>,
    pub net: NetConfig,
    /// Step time of each peer is `step_ms × u`, `u` uniform in this range.
    pub speed_range: (f64, f64),
    /// This fraction of peers (the last ones) is additionally slowed by `slow_factor`.
    pub slow_fraction: f64,
    pub slow_factor: f64,
    /// Each peer's clock runs ahead of the simulation by up to this many ms.
    pub clock_skew_ms: u64,
    pub inner_lr: f32,
    pub noise: f32,
    /// Per-peer shift of the optimum (non-IID data).
    pub heterogeneity: f32,
    pub batch_tokens: u64,
    /// Record every lineage's merged set (memory grows with peers × rounds × set size).
    pub track_lineage: bool,
    /// The peers' trainers weigh the states they are asked to (`Output::Weigh`); when
    /// false they answer "not weighed", as an executor without a trainer does, and
    /// states go by their votes alone (to measure what weighing prevents).
    pub weigh_states: bool,
    /// Hostile peers and their attacks ([`byzantine`](super::byzantine)); empty: an honest
    /// swarm.
    pub hostile: Vec<(usize, Attack)>,
    /// Inner steps each trainer takes before it is done (then its peer merges on until the
    /// swarm is quiet and finishes, as `atoll run --steps` does); `None`: trains for ever.
    pub step_target: Option<u64>,
}

impl SimConfig {
    /// One fragment of a 16-value tensor on fast uplinks with 2–40 ms latency: the cost of
    /// a run is the protocol's per-message work, not arithmetic (scale tests and benches).
    pub fn tiny_and_fast(mut self) -> Self {
        self.settings.fragments = 1;
        self.tensors = vec![self.tensors[1].clone()];
        self.tensors[0].shape = vec![4, 4];
        self.net.latency_ms = (2, 40);
        // A thousand fetches of each payload per round: give every uplink 100 MB/s.
        self.net.upload_bytes_per_ms = 100_000.0;
        self
    }

    /// Half the swarm 4× slower (DESIGN.md §2.4: 4 fast + 4 slow), quorum 1, 5–80 ms
    /// latency, lag 0: merged sets differ nearly every round (benches and catch-up tests).
    pub fn heterogeneous(&mut self) {
        self.slow_fraction = 0.5;
        self.slow_factor = 4.0;
        self.settings.quorum = 1;
        self.net.latency_ms = (5, 80);
        self.settings.grace_cap_ms = 400;
        self.settings.merge_lag = 0;
    }

    /// A small model (an embedding and three other tensors) and a calm network.
    pub fn new(peers: usize, seed: u64) -> Self {
        let t = |name: &str, shape: &[usize], emb: bool| TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
            is_embedding: emb,
        };
        Self {
            peers,
            seed,
            settings: RawSettings {
                h: 20,
                fragments: 2,
                step_ms: 100,
                grace_cap_ms: 300,
                // With the one-cycle-stale outer gradient of lag 1, μ = 0.9 oscillates on
                // this quadratic; μ = 0.5 with inner lr 0.01 converges under both lags
                // (bench/RESULTS.md).
                momentum: 0.5,
                // A lost fetch is retried well within the period.
                fetch_timeout_ms: 250,
                ..RawSettings::default()
            },
            tensors: vec![
                t("emb", &[8, 4], true),
                t("w1", &[16, 4], false),
                t("w2", &[24], false),
                t("b", &[8], false),
            ],
            net: NetConfig::default(),
            speed_range: (0.8, 1.25),
            slow_fraction: 0.0,
            slow_factor: 1.0,
            clock_skew_ms: 10,
            inner_lr: 0.01,
            noise: 0.3,
            heterogeneity: 0.2,
            batch_tokens: 1024,
            track_lineage: true,
            weigh_states: true,
            hostile: Vec::new(),
            step_target: None,
        }
    }
}
