//! The heartbeat topic between real nodes: a heartbeat reaches the run's peers signed by
//! its author; an author that publishes faster than its rate is dropped, counted and, as it
//! keeps at it, banned; an oversized heartbeat is refused before it is sent.

use atoll_net::heartbeat::{HEARTBEAT_BURST, MAX_HEARTBEAT_BYTES};
use atoll_net::{NetError, NetEvent};

use crate::support::{next_event, start, start_from, stop_all, wait_until, Opts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_arrive_signed_and_a_flooding_author_is_banned() -> anyhow::Result<()> {
    let mut a = start(Opts::default()).await?;
    let b = start_from(&a).await?;
    let b_id = b.client.peer_id();
    wait_until("b is a run peer of a", || async {
        Ok(a.client.run_peers().await?.contains(&b_id))
    })
    .await?;

    // The first heartbeat goes out once b's subscription reached a (publish fails before).
    wait_until("a heartbeat published", || async {
        Ok(b.client.publish_heartbeat(b"beat 0".to_vec()).await.is_ok())
    })
    .await?;
    let (author, payload) = next_event(&mut a, |ev| match ev {
        NetEvent::Heartbeat { author, payload } => Some((author, payload)),
        _ => None,
    })
    .await?;
    assert_eq!((author, &payload[..]), (b_id, &b"beat 0"[..]));

    // Far too big: refused here, nothing sent.
    let big = vec![0u8; MAX_HEARTBEAT_BYTES + 1];
    assert!(matches!(b.client.publish_heartbeat(big).await, Err(NetError::Announce(_))));

    // A flood: 40 heartbeats at once. At most the burst (the first already took a token)
    // is delivered; the rest are dropped, counted and struck until b is banned.
    for i in 1..=40u32 {
        let _ = b.client.publish_heartbeat(format!("beat {i}").into_bytes()).await;
    }
    let mut delivered = 1;
    let banned = next_event(&mut a, |ev| match ev {
        NetEvent::Heartbeat { .. } => {
            delivered += 1;
            None
        }
        NetEvent::PeerBanned { peer, reason } => Some((peer, reason)),
        _ => None,
    })
    .await?;
    assert_eq!(banned, (b_id, "heartbeat_rate"));
    assert!(delivered <= HEARTBEAT_BURST as usize + 1, "{delivered} heartbeats got through");
    let stats = a.client.stats().await?;
    assert!(stats.rejects.get("heartbeat_rate").is_some_and(|n| *n >= 8), "{:?}", stats.rejects);
    assert!(stats.strikes.get("heartbeat_rate").is_some_and(|n| *n >= 8), "{:?}", stats.strikes);
    stop_all(vec![a, b]).await
}
