//! In-process multi-swarm tests on 127.0.0.1: real transports, several nodes per process.
//! Everything waits on conditions with deadlines; nothing sleeps and hopes.

#[path = "swarm/announce.rs"]
mod announce;
#[path = "swarm/blobs.rs"]
mod blobs;
#[path = "swarm/discovery.rs"]
mod discovery;
#[path = "swarm/hostile.rs"]
mod hostile;
#[path = "swarm/partition.rs"]
mod partition;
#[path = "swarm/support.rs"]
mod support;
