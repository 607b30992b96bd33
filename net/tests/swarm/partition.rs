//! Fault injection: a node refuses and drops the peers on its block list, both ways, so
//! announcements and blob fetches cannot cross; once the lists are emptied, discovery
//! finds the other side again (nothing re-dials on unblock).

use atoll_net::{fault, NetEvent, Node, PeerId};
use bytes::Bytes;

use crate::support::{next_event, seeded_bytes, sees_exactly, start, stop_all, wait_until, Opts};

/// True when every node of `group` lists exactly the others of `group` as run peers.
async fn group_sees_itself(nodes: &[Node], group: &[usize]) -> anyhow::Result<bool> {
    for &i in group {
        let others: Vec<PeerId> =
            group.iter().filter(|&&j| j != i).map(|&j| nodes[j].client.peer_id()).collect();
        if !sees_exactly(&nodes[i], &others).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Publishes until gossipsub takes it (the mesh needs a heartbeat after a change), then
/// waits until `to` receives it from `author`.
async fn gossip(nodes: &mut [Node], from: usize, to: usize, text: &str) -> anyhow::Result<()> {
    wait_until("publish accepted", || async {
        Ok(nodes[from].client.publish(text.as_bytes().to_vec()).await.is_ok())
    })
    .await?;
    let author = nodes[from].client.peer_id();
    next_event(&mut nodes[to], |ev| match ev {
        NetEvent::Announcement { author: Some(a), payload, .. }
            if a == author && &payload[..] == text.as_bytes() =>
        {
            Some(())
        }
        _ => None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_list_cuts_both_ways_and_discovery_heals_it() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let list = |i: usize| dir.path().join(format!("blocked-{i}"));
    let mut nodes = vec![start(Opts { block_list: Some(list(0)), ..Opts::default() }).await?];
    for i in 1..4 {
        let bootstrap = vec![nodes[0].listen_addrs[0].clone()];
        nodes.push(start(Opts { bootstrap, block_list: Some(list(i)), ..Opts::default() }).await?);
    }
    let ids: Vec<PeerId> = nodes.iter().map(|n| n.client.peer_id()).collect();
    wait_until("four peers see each other", || group_sees_itself(&nodes, &[0, 1, 2, 3])).await?;

    // Cut {0, 1} | {2, 3}, each side blocking the other.
    for (side, other) in [([0, 1], [2, 3]), ([2, 3], [0, 1])] {
        for i in side {
            fault::write(&list(i), other.iter().map(|&j| &ids[j]))?;
        }
    }
    wait_until("each side sees only itself", || async {
        Ok(group_sees_itself(&nodes, &[0, 1]).await? && group_sees_itself(&nodes, &[2, 3]).await?)
    })
    .await?;
    let hash = nodes[0].client.put_blob(Bytes::from(seeded_bytes(5, 100_000)))?;
    assert!(
        nodes[2].client.fetch_blob(hash, &[ids[0]]).await.is_err(),
        "a blob was fetched across the cut"
    );
    // Each node applies its list within a second (the first one cuts the connection).
    wait_until("every node to refuse dials across the cut", || async {
        for (i, j) in [(0, 2), (1, 3), (2, 0), (3, 1)] {
            if nodes[i].client.dial(nodes[j].listen_addrs[0].clone()).await.is_ok() {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    // Gossip goes around within a side; nothing published on side A reaches side B.
    gossip(&mut nodes, 0, 1, "side A only").await?;
    gossip(&mut nodes, 2, 3, "side B only").await?;
    for i in [2, 3] {
        while let Ok(ev) = nodes[i].events.try_recv() {
            if let NetEvent::Announcement { author: Some(a), .. } = ev {
                assert!(a != ids[0] && a != ids[1], "node {i} heard side A across the cut");
            }
        }
    }

    // The heal: only discovery may bring the sides back together.
    for i in 0..4 {
        fault::write(&list(i), [])?;
    }
    wait_until("four peers see each other again", || group_sees_itself(&nodes, &[0, 1, 2, 3]))
        .await?;
    let fetched = nodes[2].client.fetch_blob(hash, &[ids[0]]).await?;
    assert_eq!(fetched.len(), 100_000);
    gossip(&mut nodes, 0, 3, "healed").await?;
    stop_all(nodes).await
}
