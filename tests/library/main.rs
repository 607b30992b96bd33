//! The library's public API in one process, no network: every backend trains, checkpoints
//! resume exactly and refuse damage, the data loader shards files a user has, data-parallel
//! arithmetic through the gradient hook, fragment read and write, and the fuzz targets'
//! findings. One test binary, one module each (`cargo test --test library checkpoint::`).

mod backends;
mod checkpoint;
mod data;
mod data_parallel;
mod fragments;
mod fuzz_regressions;
