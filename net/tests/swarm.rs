//! In-process multi-swarm tests on 127.0.0.1: real transports, several nodes per process.
//! Everything waits on conditions with deadlines; nothing sleeps and hopes.

#[path = "swarm/accept_flood.rs"]
mod accept_flood;
#[path = "swarm/announce.rs"]
mod announce;
#[path = "swarm/blobs.rs"]
mod blobs;
#[path = "swarm/discovery.rs"]
mod discovery;
#[path = "swarm/eclipse.rs"]
mod eclipse;
#[path = "swarm/fair_share.rs"]
mod fair_share;
#[path = "swarm/heartbeats.rs"]
mod heartbeats;
#[path = "swarm/hedged.rs"]
mod hedged;
#[path = "swarm/hostile.rs"]
mod hostile;
#[path = "swarm/hygiene.rs"]
mod hygiene;
#[path = "swarm/partition.rs"]
mod partition;
#[path = "swarm/private.rs"]
mod private;
#[path = "swarm/support.rs"]
mod support;
