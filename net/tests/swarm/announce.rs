//! Announcements reach every peer of the run, with their author.

use atoll_net::NetEvent;

use crate::support::{next_event, sees_exactly, start, start_from, stop_all, wait_until, Opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announcements_reach_all_run_peers() -> anyhow::Result<()> {
    let a = start(Opts::default()).await?;
    let mut b = start_from(&a).await?;
    let mut c = start_from(&a).await?;
    let (ida, idb, idc) = (a.client.peer_id(), b.client.peer_id(), c.client.peer_id());
    wait_until("three peers connected in the run", || async {
        Ok(sees_exactly(&a, &[idb, idc]).await?
            && sees_exactly(&b, &[ida, idc]).await?
            && sees_exactly(&c, &[ida, idb]).await?)
    })
    .await?;
    // The gossip mesh needs a heartbeat after subscriptions; publish until it goes out.
    wait_until("publish accepted by gossipsub", || async {
        Ok(a.client.publish(b"round 7: delta abc".to_vec()).await.is_ok())
    })
    .await?;
    for node in [&mut b, &mut c] {
        let (author, payload) = next_event(node, |ev| match ev {
            NetEvent::Announcement { author, payload, .. } => Some((author, payload)),
            _ => None,
        })
        .await?;
        assert_eq!(author, Some(ida));
        assert_eq!(&payload[..], b"round 7: delta abc");
    }
    // Too large for an announcement: refused locally, nothing sent.
    let big = vec![0u8; atoll_net::announce::MAX_ANNOUNCE_BYTES];
    assert!(a.client.publish(big).await.is_err());
    let stats = b.client.stats().await?;
    assert!(stats.protocols["announce"].received > 0);
    stop_all(vec![a, b, c]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_loses_events_not_the_node() -> anyhow::Result<()> {
    let a = start(Opts::default()).await?;
    let b = start_from(&a).await?; // b's events are never read
    let (ida, idb) = (a.client.peer_id(), b.client.peer_id());
    wait_until("connected", || async {
        Ok(sees_exactly(&a, &[idb]).await? && sees_exactly(&b, &[ida]).await?)
    })
    .await?;
    wait_until("gossip mesh up", || async {
        Ok(a.client.publish(b"warm-up".to_vec()).await.is_ok())
    })
    .await?;
    // b accepts a's announcements at the per-source rate limit (a burst, then a steady
    // rate), so the stream fills over a few seconds; then further events are dropped and
    // counted, and b still answers.
    let deadline = tokio::time::Instant::now() + crate::support::DEADLINE;
    let mut i = 0u64;
    loop {
        for _ in 0..64 {
            a.client.publish(format!("announcement {i}").into_bytes()).await?;
            i += 1;
        }
        if b.client.stats().await?.events_dropped > 0 {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "nothing dropped after {i}");
        // Pace the publisher to the rate limit's refill (a loop with a deadline).
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    stop_all(vec![a, b]).await
}
