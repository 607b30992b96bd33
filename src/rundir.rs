//! The run dir's files a peer writes for people, scripts, the status page and its own
//! restart: their formats, readers and writers. Below the node (which writes them through
//! its disk thread), the web page, `atoll doctor` and the command line (which read them);
//! nothing here knows any of those.
//!
//! - [`status`]: `status.json`, what a peer tells about itself (network counters, training
//!   progress, the addresses it serves on).
//! - [`swarm`]: `swarm.json`, the table of the run's peers built from their heartbeats.
//! - [`ledger`]: `merges.jsonl`, one line per merge naming who contributed how many tokens.
//! - [`anchors`]: `anchors/fragment-P.state`, the replicated fragment states a restarted
//!   peer resumes from.
//!
//! Other files of a run dir live with what they serve: `metrics.jsonl`
//! ([`crate::metrics`]), `checkpoint.atoll` ([`crate::checkpoint`]), `manifest.json`
//! ([`crate::manifest`]), and the peer key and ban file of atoll-net.

pub mod anchors;
pub mod ledger;
pub mod status;
pub mod swarm;
