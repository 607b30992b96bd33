//! Blob transfer: several sources, a lying source, a source vanishing mid-transfer, the cap.

use std::time::Instant;

use atoll_net::{BlobHash, ChunkList, NetEvent, RejectReason, CHUNK_SIZE};
use bytes::Bytes;

use crate::support::{
    next_event, seeded_bytes, sees_exactly, start, start_from, stop_all, wait_until, Opts,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_from_several_sources_verifies_and_stores() -> anyhow::Result<()> {
    let a = start(Opts::default()).await?;
    let b = start_from(&a).await?;
    let c = start_from(&a).await?;
    let d = start_from(&a).await?;
    let data = Bytes::from(seeded_bytes(1, 5 * CHUNK_SIZE + 123));
    let hash = a.client.put_blob(data.clone())?;
    assert_eq!(hash, BlobHash::of(&data));
    b.client.put_blob(data.clone())?;
    c.client.put_blob(data.clone())?;
    let sources = [a.client.peer_id(), b.client.peer_id(), c.client.peer_id()];
    wait_until("fetcher connected to the three sources", || sees_exactly(&d, &sources)).await?;
    let got = d.client.fetch_blob(hash, &sources).await?;
    assert_eq!(got, data);
    assert!(d.client.has_blob(&hash));
    let stats = d.client.stats().await?;
    let serving = sources
        .iter()
        .filter(|p| stats.peers.get(&p.to_string()).is_some_and(|b| b.received > 0))
        .count();
    assert!(serving >= 2, "chunks came from {serving} sources: {stats:?}");
    assert_eq!(stats.blobs_stored, 1);
    // A blob larger than the caller expects is refused before download.
    let big = a.client.put_blob(Bytes::from(seeded_bytes(5, 2 * CHUNK_SIZE)))?;
    let e = d.client.fetch_blob_limited(big, &[a.client.peer_id()], 1000).await;
    assert!(matches!(e, Err(atoll_net::NetError::Fetch(atoll_net::FetchError::TooLarge { .. }))));
    assert!(!d.client.has_blob(&big));
    // Unknown blobs fail cleanly, naming every source that said it does not hold them.
    match d.client.fetch_blob(BlobHash::of(b"nobody has this"), &sources).await {
        Err(atoll_net::NetError::Fetch(e)) => {
            let mut denied = e.denied().to_vec();
            denied.sort();
            let mut want = sources.to_vec();
            want.sort();
            assert_eq!(denied, want, "{e}");
        }
        other => panic!("fetching an unknown blob gave {other:?}"),
    }
    stop_all(vec![a, b, c, d]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lying_source_is_dropped_and_penalised() -> anyhow::Result<()> {
    let honest = start(Opts::default()).await?;
    let liar = start_from(&honest).await?;
    let bad_chunk_list = start_from(&honest).await?;
    let mut fetcher = start_from(&honest).await?;
    let data = Bytes::from(seeded_bytes(2, 4 * CHUNK_SIZE));
    let hash = honest.client.put_blob(data.clone())?;
    // The liar has the right chunk list but flips a byte in every chunk, so whichever chunk
    // it is asked for is wrong.
    let mut wrong = data.to_vec();
    for chunk in wrong.chunks_mut(CHUNK_SIZE) {
        chunk[10] ^= 1;
    }
    liar.client.insert_unverified_for_tests(
        hash,
        Bytes::from(wrong.clone()),
        ChunkList::compute(&data),
    )?;
    // The other liar's chunk list is that of other bytes.
    bad_chunk_list.client.insert_unverified_for_tests(
        hash,
        Bytes::from(wrong.clone()),
        ChunkList::compute(&wrong),
    )?;
    let (idl, idm) = (liar.client.peer_id(), bad_chunk_list.client.peer_id());
    let all = [idl, idm, honest.client.peer_id()];
    wait_until("fetcher connected to all sources", || sees_exactly(&fetcher, &all)).await?;
    // Liars first, so they are asked first.
    let got = fetcher.client.fetch_blob(hash, &[idm, idl, honest.client.peer_id()]).await?;
    assert_eq!(got, data);
    let penalised = next_event(&mut fetcher, |ev| match ev {
        NetEvent::PeerPenalised { peer, reason } if peer == idl => Some(reason),
        _ => None,
    })
    .await?;
    assert_eq!(penalised, RejectReason::BadChunk);
    let stats = fetcher.client.stats().await?;
    assert!(stats.rejects.get("bad_chunk").copied().unwrap_or(0) >= 1, "{stats:?}");
    assert_eq!(stats.rejects.get("bad_chunk_list").copied(), Some(1), "{stats:?}");
    assert_eq!(stats.penalised, 2);
    // A penalised peer is not asked again.
    let req = atoll_net::blob::wire::BlobRequest::ChunkList { hash };
    assert!(matches!(
        fetcher.client.request_blob(idl, req).await,
        Err(atoll_net::NetError::Penalised(_))
    ));
    stop_all(vec![honest, liar, bad_chunk_list, fetcher]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_resumes_when_a_source_vanishes() -> anyhow::Result<()> {
    // Capped sources make the transfer last long enough to pull the plug in the middle.
    let capped = || Opts { upload_bytes_per_sec: Some(4_000_000), ..Opts::default() };
    let a = start(capped()).await?;
    let b = start(Opts { bootstrap: vec![a.listen_addrs[0].clone()], ..capped() }).await?;
    let f = start_from(&a).await?;
    let (ida, idb) = (a.client.peer_id(), b.client.peer_id());
    let both = [ida, idb];
    wait_until("fetcher connected to both", || sees_exactly(&f, &both)).await?;
    let data = Bytes::from(seeded_bytes(3, 16 * CHUNK_SIZE));
    let hash = a.client.put_blob(data.clone())?;
    b.client.put_blob(data.clone())?;
    let client = f.client.clone();
    let fetch = tokio::spawn(async move { client.fetch_blob(hash, &[ida, idb]).await });
    wait_until("some chunks arrived from a", || async {
        let s = f.client.stats().await?;
        Ok(s.peers.get(&ida.to_string()).is_some_and(|b| b.received >= CHUNK_SIZE as u64))
    })
    .await?;
    a.handle.shutdown().await?;
    let got = fetch.await??;
    assert_eq!(got, data);
    let s = f.client.stats().await?;
    assert!(s.peers[&idb.to_string()].received >= CHUNK_SIZE as u64, "{s:?}");
    stop_all(vec![b, f]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_cap_holds_the_rate() -> anyhow::Result<()> {
    let rate = 8_000_000u64; // 8 MB/s
    let src = start(Opts { upload_bytes_per_sec: Some(rate), ..Opts::default() }).await?;
    let dst = start_from(&src).await?;
    let data = Bytes::from(seeded_bytes(4, 16 * CHUNK_SIZE));
    let hash = src.client.put_blob(data.clone())?;
    let t0 = Instant::now();
    let got = dst.client.fetch_blob(hash, &[src.client.peer_id()]).await?;
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(got, data);
    // The bucket starts empty and holds one chunk: the transfer cannot beat the cap.
    let floor = (data.len() - CHUNK_SIZE) as f64 / rate as f64;
    assert!(secs >= floor * 0.95, "took {secs:.2} s, the cap allows no less than {floor:.2} s");
    stop_all(vec![src, dst]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn substream_bytes_are_counted_per_protocol() -> anyhow::Result<()> {
    let a = start(Opts::default()).await?;
    let b = start_from(&a).await?;
    let data = Bytes::from(seeded_bytes(3, 3 * CHUNK_SIZE));
    let hash = a.client.put_blob(data.clone())?;
    let source = [a.client.peer_id()];
    wait_until("b connected to a", || sees_exactly(&b, &source)).await?;
    assert_eq!(b.client.fetch_blob(hash, &source).await?, data);
    let len = data.len() as u64;
    for (node, fetched) in [(&b, true), (&a, false)] {
        let s = node.client.stats().await?;
        let stream = |name: &str| s.protocols.get(&format!("stream/{name}")).copied();
        let blob = stream("blob").unwrap_or_default();
        let moved = if fetched { blob.received } else { blob.sent };
        assert!(moved >= len, "blob stream bytes {blob:?} for {len} payload bytes: {s:?}");
        assert!(stream("identify").is_some_and(|c| c.sent > 0 && c.received > 0), "{s:?}");
        // Streams still opening are counted in the total only.
        let (sent, received) = s
            .protocols
            .iter()
            .filter(|(k, _)| k.starts_with("stream/"))
            .fold((0, 0), |(t, r), (_, c)| (t + c.sent, r + c.received));
        assert!(sent <= s.bytes_sent && received <= s.bytes_received, "{s:?}");
        assert!(sent * 10 >= s.bytes_sent * 9, "most bytes named: {sent} of {}", s.bytes_sent);
    }
    stop_all(vec![a, b]).await
}
