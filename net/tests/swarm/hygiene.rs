//! Network hygiene: penalties and bans, the announcement rate limit, per-IP connection caps.

use std::time::Duration;

use atoll_net::announce::{topic_name, ANNOUNCE_VERSION};
use atoll_net::{NetConfig, NetEvent, Node, PeerId};
use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::SwarmEvent;
use libp2p::{gossipsub, Swarm};

use crate::support::{bare_gossip_peer, next_event, stop_all, wait_until, DEADLINE};

/// Starts a loopback node like `support::start`, with `tweak` applied to its config.
pub async fn start_with(tweak: impl FnOnce(&mut NetConfig)) -> anyhow::Result<Node> {
    let key = atoll_net::identity::load_or_create(&tempfile::tempdir()?.path().join("peer_key"))?;
    let mut cfg = NetConfig::new(key, "test-run");
    cfg.listen = vec!["/ip4/127.0.0.1/tcp/0".parse()?];
    cfg.discovery_interval = Duration::from_millis(500);
    tweak(&mut cfg);
    Ok(Node::start(cfg).await?)
}

/// A bare gossipsub peer on TCP (fresh identity) subscribed to the run's topic.
fn gossip_peer() -> anyhow::Result<Swarm<gossipsub::Behaviour>> {
    let mut swarm = bare_gossip_peer()?;
    swarm.behaviour_mut().subscribe(&gossipsub::IdentTopic::new(topic_name("test-run")))?;
    Ok(swarm)
}

/// Dials `node` and drives `swarm` until `node` is subscribed (seen from the swarm).
async fn join(swarm: &mut Swarm<gossipsub::Behaviour>, node: &Node) -> anyhow::Result<()> {
    swarm.dial(node.listen_addrs[0].clone())?;
    let id = node.client.peer_id();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let ev = tokio::time::timeout_at(deadline, swarm.select_next_some())
            .await
            .map_err(|_| anyhow::anyhow!("gossip peer never saw the node subscribe"))?;
        // The node's subscription to the announce topic (it has a members topic too).
        let announce = gossipsub::IdentTopic::new(topic_name("test-run")).hash();
        if matches!(ev, SwarmEvent::Behaviour(gossipsub::Event::Subscribed { peer_id, topic }) if peer_id == id && topic == announce)
        {
            return Ok(());
        }
    }
}

fn envelope(payload: &[u8]) -> Vec<u8> {
    let mut v = ANNOUNCE_VERSION.to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_ban_a_peer_and_the_ban_file_survives_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ban_file = dir.path().join("banned_peers");
    let bf = ban_file.clone();
    let mut node = start_with(|c| c.ban_file = Some(bf)).await?;
    let bad = start_with(|c| c.bootstrap = vec![node.listen_addrs[0].clone()]).await?;
    let bad_id = bad.client.peer_id();
    wait_until("bad peer joined", || async {
        Ok(node.client.run_peers().await?.contains(&bad_id))
    })
    .await?;
    for _ in 0..7 {
        node.client.penalize(bad_id, "bad_delta").await?;
    }
    let s = node.client.stats().await?;
    assert_eq!(s.strikes.get("bad_delta"), Some(&7));
    assert_eq!(s.banned, 0, "seven strikes do not ban");
    // The operator sees who: the peer named with its standing strikes (faded a little).
    assert_eq!(s.struck.len(), 1, "{:?}", s.struck);
    assert_eq!(s.struck[0].peer, bad_id.to_string());
    assert!((6.9..=7.0).contains(&s.struck[0].strikes), "{:?}", s.struck);
    node.client.penalize(bad_id, "equivocation").await?;
    let (peer, reason) = next_event(&mut node, |ev| match ev {
        NetEvent::PeerBanned { peer, reason } => Some((peer, reason)),
        _ => None,
    })
    .await?;
    assert_eq!((peer, reason), (bad_id, "equivocation"));
    assert_eq!(node.client.banned().await?, vec![bad_id]);
    wait_until("banned peer disconnected", || async {
        Ok(!node.client.run_peers().await?.contains(&bad_id))
    })
    .await?;
    let s = node.client.stats().await?;
    assert_eq!(s.banned, 1);
    assert!(s.struck.is_empty(), "a banned peer's strikes no longer stand: {:?}", s.struck);
    assert_eq!(s.recent_bans.len(), 1);
    assert_eq!(
        (s.recent_bans[0].peer.as_str(), s.recent_bans[0].reason.as_str()),
        (bad_id.to_string().as_str(), "equivocation")
    );
    let text = std::fs::read_to_string(&ban_file)?;
    assert!(text.lines().any(|l| l == bad_id.to_string()), "{text}");

    // It cannot come back: its dials are refused, while an honest newcomer gets in.
    bad.client.dial(node.listen_addrs[0].clone()).await?;
    let honest = start_with(|c| c.bootstrap = vec![node.listen_addrs[0].clone()]).await?;
    let honest_id = honest.client.peer_id();
    wait_until("honest peer joined", || async {
        Ok(node.client.run_peers().await?.contains(&honest_id))
    })
    .await?;
    assert!(!node.client.run_peers().await?.contains(&bad_id));
    stop_all(vec![node, honest]).await?;

    // A restart reads the file; a damaged line is skipped, the rest kept.
    std::fs::write(&ban_file, format!("{text}not-a-peer-id\n"))?;
    let bf = ban_file.clone();
    let restarted = start_with(|c| c.ban_file = Some(bf)).await?;
    assert_eq!(restarted.client.banned().await?, vec![bad_id]);
    assert_eq!(restarted.client.stats().await?.banned, 1);
    stop_all(vec![restarted, bad]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_sending_malformed_announcements_is_banned() -> anyhow::Result<()> {
    let mut node = start_with(|_| {}).await?;
    let mut evil = gossip_peer()?;
    let evil_id = *evil.local_peer_id();
    join(&mut evil, &node).await?;
    let topic = gossipsub::IdentTopic::new(topic_name("test-run"));
    for i in 0..4u8 {
        let _ = evil.behaviour_mut().publish(topic.clone(), vec![i; 16]);
    }
    let evil_task = tokio::spawn(async move {
        loop {
            evil.select_next_some().await;
        }
    });
    let peer = next_event(&mut node, |ev| match ev {
        NetEvent::PeerBanned { peer, .. } => Some(peer),
        _ => None,
    })
    .await?;
    assert_eq!(peer, evil_id);
    let s = node.client.stats().await?;
    assert!(s.strikes.get("malformed").copied().unwrap_or(0) >= 2, "{s:?}");
    assert_eq!(s.banned, 1);
    evil_task.abort();
    stop_all(vec![node]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcement_flood_is_rate_limited_and_honest_events_get_through() -> anyhow::Result<()>
{
    let mut node = start_with(|_| {}).await?;
    let honest = start_with(|c| c.bootstrap = vec![node.listen_addrs[0].clone()]).await?;
    let honest_id = honest.client.peer_id();
    let mut evil = gossip_peer()?;
    join(&mut evil, &node).await?;
    let topic = gossipsub::IdentTopic::new(topic_name("test-run"));
    const FLOOD: usize = 3000;
    let evil_task = tokio::spawn(async move {
        let mut sent = 0usize;
        loop {
            while sent < FLOOD {
                let msg = envelope(format!("flood {sent}").as_bytes());
                if evil.behaviour_mut().publish(topic.clone(), msg).is_err() {
                    break;
                }
                sent += 1;
                if sent % 100 == 0 {
                    break;
                }
            }
            // Drive the swarm a little (it may have no event to report).
            let _ = tokio::time::timeout(Duration::from_millis(5), evil.select_next_some()).await;
        }
    });
    wait_until("flood rate limited", || async {
        Ok(node.client.stats().await?.rejects.get("rate_limited").copied().unwrap_or(0) > 100)
    })
    .await?;
    // The honest peer's announcement still reaches the node (retried until the mesh
    // includes it), among at most the flood's burst plus its sustained rate.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut flood_seen = 0usize;
    let mut n = 0u32;
    'outer: loop {
        n += 1;
        let _ = honest.client.publish(format!("honest {n}").into_bytes()).await;
        let until = tokio::time::Instant::now() + Duration::from_millis(300);
        while let Ok(Some(ev)) = tokio::time::timeout_at(until, node.events.recv()).await {
            if let NetEvent::Announcement { from, payload, .. } = ev {
                if from == honest_id && payload.starts_with(b"honest") {
                    break 'outer;
                }
                flood_seen += 1;
            }
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "honest announcement lost");
    }
    let s = node.client.stats().await?;
    assert!(flood_seen < FLOOD, "flood was not limited: {flood_seen} events");
    assert!(s.log_suppressed > 0, "rate-limit log lines were not throttled: {s:?}");
    assert_eq!(s.banned, 0, "a flood of valid messages is not a ban");
    evil_task.abort();
    stop_all(vec![node, honest]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_ip_cannot_take_every_connection_slot() -> anyhow::Result<()> {
    let node = start_with(|c| {
        c.exempt_loopback = false;
        c.max_connections_per_ip = 3;
        c.listen = vec![
            "/ip4/127.0.0.1/tcp/0".parse().expect("valid address"),
            "/ip6/::1/tcp/0".parse().expect("valid address"),
        ];
    })
    .await?;
    let on = |v6: bool| {
        node.listen_addrs
            .iter()
            .find(|a| a.iter().any(|p| matches!(p, Protocol::Ip6(_)) == v6))
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no listen address"))
    };
    let (v4, v6) = (on(false)?, on(true)?);
    // Ten fresh identities from 127.0.0.1: three get in, the rest are refused and counted.
    let mut flood = Vec::new();
    for _ in 0..10 {
        let mut s = gossip_peer()?;
        s.dial(v4.clone())?;
        flood.push(tokio::spawn(async move {
            loop {
                s.select_next_some().await;
            }
        }));
    }
    wait_until("connections over the per-IP cap refused", || async {
        Ok(node.client.stats().await?.rejects.get("ip_limit").copied().unwrap_or(0) >= 7)
    })
    .await?;
    assert!(node.client.stats().await?.connected <= 3);
    // A newcomer from another IP (::1) joins.
    let newcomer = start_with(|c| {
        c.listen = vec!["/ip6/::1/tcp/0".parse().expect("valid address")];
        c.bootstrap = vec![v6];
    })
    .await?;
    let id: PeerId = newcomer.client.peer_id();
    wait_until("newcomer joined despite the flood", || async {
        Ok(node.client.run_peers().await?.contains(&id))
    })
    .await?;
    for t in flood {
        t.abort();
    }
    stop_all(vec![node, newcomer]).await
}
