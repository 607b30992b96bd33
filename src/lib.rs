//! atoll: a leaderless peer-to-peer trainer for language models (Decoupled DiLoCo).
//!
//! Modules and their jobs:
//! - [`backend`]: which burn CPU backend runs the model (burn-flex by default, burn-ndarray).
//! - [`model`]: the byte-level decoder-only transformer; [`model::params`] reads and writes
//!   its tensors as flat `f32` buffers, fragment by fragment.
//! - [`fragment`]: the deterministic split of the parameters into `P` fragments.
//! - [`delta`]: the outer-delta codec (4/8-bit blockwise + error feedback, zstd, blake3).
//! - [`proto`]: the I/O-free leaderless protocol core (rounds, grace, merge, reconciliation).
//! - [`peer`]: one peer, I/O-free: the protocol core plus the decisions around it (a late
//!   joiner's hold, re-announcements, finishing once the swarm is quiet); the node and the
//!   simulator both run it.
//! - [`sim`]: the deterministic discrete-event simulator that drives [`peer`]s.
//! - [`data`]: the embedded corpus or a text path, validation split, per-peer shards, batches.
//! - [`train`]: the inner loop (AdamW, warm-up + cosine, clipping) and its counters;
//!   [`train::preset`] names the training configurations (`--model`) and what each needs
//!   in memory.
//! - [`checkpoint`]: atomic, checksummed checkpoints of model + optimizer + counters.
//! - [`metrics`]: the `metrics.jsonl` record of validation passes.
//! - [`manifest`]: the run manifest (everything peers must share) and the run id.
//! - [`join`]: `--join RUN_ID@MULTIADDR`: the run's manifest fetched by its id from a peer.
//! - [`rundir`]: the run dir's report and resume files (`status.json`, `swarm.json`,
//!   `merges.jsonl`, `anchors/`): formats, readers and writers, below node and web.
//! - [`node`]: a training peer: trainer + [`peer`] + `atoll-net`, on the system clock (or a
//!   test runtime's virtual one, `node::Clock`).
//! - [`sample`]: text generation from a trained model.
//! - [`chaos`]: the chaos harness's seeded fault schedule and its goodput/uptime figures.
//! - [`heartbeat`]: the heartbeat every peer gossips (codec) and the table of the run's
//!   peers built from them (`swarm.json`, `atoll status --swarm`).
//! - [`doctor`]: self-diagnosis from `status.json` and `swarm.json` (`atoll doctor`).
//! - [`web`]: the status page and Prometheus metrics a peer serves (`--http`, `--metrics-addr`).

pub mod backend;
pub mod baseline;
pub mod chaos;
pub mod checkpoint;
pub mod collective;
pub mod cursor;
pub mod data;
pub mod delta;
pub mod doctor;
pub mod fleet;
pub mod fragment;
pub mod heartbeat;
pub mod join;
pub mod manifest;
pub mod metrics;
pub mod model;
pub mod node;
pub mod peer;
pub mod proto;
pub mod rundir;
pub mod sample;
pub mod sim;
pub mod train;
pub mod web;
