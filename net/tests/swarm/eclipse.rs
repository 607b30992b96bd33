//! Eclipse by many identities (SECURITY.md): Kademlia stores a provider record on the 20
//! peers closest to the run key, and ids are free, so an attacker that grinds two dozen ids
//! next to the key holds every provider record of the run and answers every lookup with
//! nobody; their full k-bucket also keeps a member whose id falls in that bucket out of the
//! routing table that answers FIND_NODE. Discovery by the DHT alone then fails: a newcomer
//! bootstrapped from one honest member never learns of such a member. A member is also
//! known by what it signs, though: its member record (its addresses, signed gossip)
//! reaches the newcomer through the one honest member, and the newcomer connects.

use std::time::Duration;

use atoll_net::behaviour::{IDENTIFY_PROTOCOL_VERSION, KAD_PROTOCOL};
use atoll_net::config::run_key;
use futures::StreamExt;
use libp2p::identity::Keypair;
use libp2p::kad::{self, KBucketKey, RecordKey};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{identify, noise, tcp, yamux, Multiaddr, Swarm, SwarmBuilder};

use crate::support::{start, stop_all, wait_until, Opts};

/// Sybil ids near the run key: more than Kademlia's replication factor of 20.
const SYBILS: usize = 24;
/// Leading bits each Sybil id shares with the run key (about 256 key draws each); an
/// honest id shares one on average.
const NEAR_BITS: u32 = 8;

#[derive(NetworkBehaviour)]
struct Sybil {
    kad: kad::Behaviour<kad::store::MemoryStore>,
    identify: identify::Behaviour,
}

/// The first seeded key (draws `seed`, 0, 1, …) whose peer id passes `ok`.
fn ground_key(seed: u64, ok: impl Fn(&KBucketKey<libp2p::PeerId>) -> bool) -> Keypair {
    let mut bytes = [0u8; 32];
    for n in 0u64.. {
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        bytes[8..16].copy_from_slice(&n.to_le_bytes());
        let k = Keypair::ed25519_from_bytes(bytes).expect("32-byte seed");
        if ok(&KBucketKey::from(k.public().to_peer_id())) {
            return k;
        }
    }
    unreachable!("the draws never end")
}

/// A key whose peer id shares at least `NEAR_BITS` leading bits with `key`.
fn near_key(key: &RecordKey, seed: u64) -> Keypair {
    let target = KBucketKey::new(key.clone());
    ground_key(seed, |id| id.distance(&target).ilog2().is_none_or(|b| b < 256 - NEAR_BITS))
}

/// A DHT server that speaks atoll's Kademlia and identify, keeps no provider record and so
/// answers every provider lookup with nobody.
fn sybil(key: Keypair) -> anyhow::Result<Swarm<Sybil>> {
    Ok(SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_tcp(tcp::Config::default(), noise::Config::new, yamux::Config::default)?
        .with_behaviour(|key| {
            let id = key.public().to_peer_id();
            let mut cfg = kad::Config::new(KAD_PROTOCOL);
            // Inbound ADD_PROVIDER arrives as an event and is never stored.
            cfg.set_record_filtering(kad::StoreInserts::FilterBoth);
            let mut kad = kad::Behaviour::with_config(id, kad::store::MemoryStore::new(id), cfg);
            kad.set_mode(Some(kad::Mode::Server));
            let identify = identify::Behaviour::new(identify::Config::new(
                IDENTIFY_PROTOCOL_VERSION.into(),
                key.public(),
            ));
            Sybil { kad, identify }
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(120)))
        .build())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sybils_next_to_the_run_key_cannot_hide_run_members() -> anyhow::Result<()> {
    let key = run_key("test-run");
    // Seen from the first member, the Sybils all fall in one bucket (the one the run key
    // falls in); the second member is drawn to fall in it too.
    let run = KBucketKey::new(key.clone());
    let first_key = ground_key(1 << 40, |id| id.distance(&run).ilog2() > Some(256 - NEAR_BITS));
    let first_id = KBucketKey::from(first_key.public().to_peer_id());
    let bucket = first_id.distance(&run).ilog2();
    // So is the newcomer: otherwise the second member's own lookups would find it in the
    // first member's table and connect to it. (Neither is near the key itself: every
    // Sybil is closer to it.)
    let hidden = |seed| {
        ground_key(seed, |id| {
            first_id.distance(id).ilog2() == bucket
                && id.distance(&run).ilog2() >= Some(256 - NEAR_BITS)
        })
    };
    let (second_key, newcomer_key) = (hidden(2 << 40), hidden(3 << 40));
    let first = start(Opts { key: Some(first_key), ..Opts::default() }).await?;
    let target: Multiaddr = first.listen_addrs[0].clone();

    // The Sybils join the DHT through the first member and fill its view of the key.
    let mut sybils = Vec::new();
    for i in 0..SYBILS {
        let mut s = sybil(near_key(&key, i as u64))?;
        s.listen_on("/ip4/127.0.0.1/tcp/0".parse()?)?;
        let target = target.clone();
        sybils.push(tokio::spawn(async move {
            // Dial once listening, so identify tells the member where the Sybil is.
            while !matches!(s.select_next_some().await, SwarmEvent::NewListenAddr { .. }) {}
            let _ = s.dial(target);
            loop {
                s.select_next_some().await;
            }
        }));
    }
    wait_until("a full k-bucket of Sybils in the first member's table", || async {
        Ok(first.client.stats().await?.routing_table_size >= kad::K_VALUE.get())
    })
    .await?;

    // A second member joins: its provider records go to the Sybils only, and the first
    // member's full bucket has no room for it.
    let second =
        start(Opts { key: Some(second_key), bootstrap: vec![target.clone()], ..Opts::default() })
            .await?;
    let (id1, id2) = (first.client.peer_id(), second.client.peer_id());
    wait_until("the two members see each other", || async {
        Ok(second.client.run_peers().await?.contains(&id1)
            && first.client.run_peers().await?.contains(&id2))
    })
    .await?;

    // A newcomer bootstrapped from the first member must find the second.
    let newcomer =
        start(Opts { key: Some(newcomer_key), bootstrap: vec![target], ..Opts::default() }).await?;
    let found = wait_until("the newcomer connects to the second member", || async {
        Ok(newcomer.client.run_peers().await?.contains(&id2))
    })
    .await;
    sybils.iter().for_each(|s| s.abort());
    stop_all(vec![first, second, newcomer]).await?;
    found
}
