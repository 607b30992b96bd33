//! The simulator's tests (`src/sim.rs`): the peer that ships, many of them, on a seeded
//! discrete-event network. One test binary, one module per property; `SEED=n` replays a
//! failure, `cargo test --test simulator byzantine::` runs one module.

mod adoptions;
mod agreement;
mod byzantine;
mod grace_cap;
mod no_double_merge;
mod numbers;
mod peer;
mod sampling;
mod scale;
