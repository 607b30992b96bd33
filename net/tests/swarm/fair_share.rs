//! Upload amplification: a requester asking for the same chunk in a loop gets a fair share,
//! not the uplink, and the node learns who it is; an honest fetcher is not affected.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use atoll_net::blob::wire::{BlobRequest, BlobResponse};
use atoll_net::NetEvent;
use bytes::Bytes;

use crate::support::wait_until;
use crate::support::{next_event, seeded_bytes, sees_exactly, start, start_from, stop_all, Opts};

/// Length of the attack, as in the measurement window.
const ATTACK: Duration = Duration::from_secs(10);
/// Concurrent request loops of the attacker.
const LOOPS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_chunk_requests_get_a_fair_share_not_the_uplink() -> anyhow::Result<()> {
    let mut holder = start(Opts::default()).await?;
    let attacker = start_from(&holder).await?;
    let honest = start_from(&holder).await?;
    let hid = holder.client.peer_id();
    // A state of 1.7 MB: two chunks, as in the issue.
    let data = Bytes::from(seeded_bytes(17, 1_700_000));
    let hash = holder.client.put_blob(data.clone())?;
    let both = [hid, honest.client.peer_id()];
    wait_until("attacker connected", || sees_exactly(&attacker, &both)).await?;

    let got = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + ATTACK;
    let mut loops = Vec::new();
    for _ in 0..LOOPS {
        let (client, got) = (attacker.client.clone(), got.clone());
        loops.push(tokio::spawn(async move {
            let mut asked = 0u64;
            while Instant::now() < end {
                asked += 1;
                let req = BlobRequest::Chunk { hash, index: 0 };
                if let Ok(BlobResponse::Chunk(b)) = client.request_blob(hid, req).await {
                    got.fetch_add(b.len() as u64, Ordering::Relaxed);
                }
            }
            asked
        }));
    }
    // While the attack runs, an honest peer fetches the same blob from the same holder.
    let fetched = honest.client.fetch_blob(hash, &[hid]).await?;
    assert_eq!(fetched, data);
    let mut asked = 0;
    for l in loops {
        asked += l.await?;
    }
    let got = got.load(Ordering::Relaxed);
    assert!(asked > 20, "the attacker asked only {asked} times");
    assert!(
        got <= 2 * data.len() as u64,
        "attacker got {got} bytes in {ATTACK:?} for a {} byte blob ({asked} requests)",
        data.len()
    );
    // The holder counted the refusals by reason and by peer, and told the program.
    let aid = attacker.client.peer_id();
    let s = holder.client.stats().await?;
    assert!(s.rejects.get("repeat_request").copied().unwrap_or(0) > 0, "{:?}", s.rejects);
    assert!(s.upload_refusals.get(&aid.to_string()).copied().unwrap_or(0) > 0, "{s:?}");
    assert!(!s.upload_refusals.contains_key(&honest.client.peer_id().to_string()), "{s:?}");
    let refused = next_event(&mut holder, |ev| match ev {
        NetEvent::UploadAbuse { peer, refused } if peer == aid => Some(refused),
        _ => None,
    })
    .await?;
    assert!(refused >= 16, "{refused}");
    stop_all(vec![holder, attacker, honest]).await
}
