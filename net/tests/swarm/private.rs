//! Private swarms: peers with the same swarm key talk; without it (or with another) they
//! cannot connect, and the keyed node counts the failed handshakes.

use atoll_net::{NetError, NetEvent, Node};

use crate::hygiene::start_with;
use crate::support::{next_event, seeded_bytes, stop_all, wait_until};

fn key(seed: u64) -> [u8; 32] {
    let mut k = [0u8; 32];
    k.copy_from_slice(&seeded_bytes(seed, 32));
    k
}

async fn keyed(k: Option<[u8; 32]>, from: Option<&Node>) -> anyhow::Result<Node> {
    let bootstrap = from.map(|n| vec![n.listen_addrs[0].clone()]).unwrap_or_default();
    start_with(move |c| {
        c.swarm_key = k;
        c.bootstrap = bootstrap;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_talks_other_or_no_key_cannot_connect() -> anyhow::Result<()> {
    let text = atoll_net::swarmkey::format(&key(1));
    let k = atoll_net::swarmkey::parse(&text)?;
    let a = keyed(Some(k), None).await?;
    let mut b = keyed(Some(k), Some(&a)).await?;
    let ids = [a.client.peer_id()];
    wait_until("keyed peers connected", || crate::support::sees_exactly(&b, &ids)).await?;
    wait_until("announcement delivered", || async {
        Ok(a.client.publish(b"private hello".to_vec()).await.is_ok())
    })
    .await?;
    let payload = next_event(&mut b, |ev| match ev {
        NetEvent::Announcement { payload, .. } => Some(payload),
        _ => None,
    })
    .await?;
    assert_eq!(&payload[..], b"private hello");

    for outsider_key in [None, Some(key(2))] {
        let before = a.client.stats().await?.rejects.get("handshake").copied().unwrap_or(0);
        let outsider = keyed(outsider_key, Some(&a)).await?;
        wait_until("the keyed node counts the failed handshake", || async {
            let s = a.client.stats().await?;
            Ok(s.rejects.get("handshake").copied().unwrap_or(0) > before)
        })
        .await?;
        assert!(outsider.client.run_peers().await?.is_empty());
        assert!(!a.client.run_peers().await?.contains(&outsider.client.peer_id()));
        stop_all(vec![outsider]).await?;
    }
    stop_all(vec![a, b]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_node_refuses_quic_and_says_why() -> anyhow::Result<()> {
    let err = start_with(|c| {
        c.swarm_key = Some(key(3));
        c.listen = vec!["/ip4/127.0.0.1/udp/0/quic-v1".parse().expect("valid address")];
    })
    .await
    .err()
    .ok_or_else(|| anyhow::anyhow!("a keyed node listened on QUIC"))?;
    let msg = err.to_string();
    assert!(msg.contains("QUIC") && msg.contains("swarm key"), "{msg}");
    let node = keyed(Some(key(3)), None).await?;
    let quic = "/ip4/127.0.0.1/udp/4001/quic-v1".parse()?;
    match node.client.dial(quic).await {
        Err(NetError::Dial { reason, .. }) => assert!(reason.contains("QUIC"), "{reason}"),
        other => anyhow::bail!("QUIC dial not refused: {other:?}"),
    }
    stop_all(vec![node]).await
}
