//! Held fetches: a holder that answers the chunk list and then never sends a chunk holds a
//! fetch no longer than the per-source deadline when another holder has the blob.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use atoll_net::blob::wire::{self, BlobRequest, BlobResponse, BLOB_PROTOCOL};
use atoll_net::{BlobHash, ChunkList, Multiaddr, PeerId, CHUNK_SIZE};
use bytes::Bytes;
use futures::StreamExt;
use libp2p::request_response::{self, ProtocolSupport, ResponseChannel};
use libp2p::swarm::SwarmEvent;
use libp2p::{noise, tcp, yamux, SwarmBuilder};

use crate::support::{seeded_bytes, sees_exactly, start, start_from, stop_all, wait_until, Opts};

/// The blob protocol's wire format, for a peer built outside atoll-net.
#[derive(Clone, Default)]
struct WireCodec;

#[async_trait::async_trait]
impl request_response::Codec for WireCodec {
    type Protocol = libp2p::StreamProtocol;
    type Request = BlobRequest;
    type Response = BlobResponse;

    async fn read_request<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
    ) -> std::io::Result<BlobRequest>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        wire::read_request(io).await
    }

    async fn read_response<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
    ) -> std::io::Result<BlobResponse>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        wire::read_response(io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        req: BlobRequest,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        wire::write_request(io, &req).await.map(|_| ())
    }

    async fn write_response<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        res: BlobResponse,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        wire::write_response(io, &res).await.map(|_| ())
    }
}

/// A peer that answers chunk lists of `blobs` at once and then holds every chunk request
/// without answering (a paused process, a saturated link). Dials `target`; returns its id
/// and the task driving it.
fn stalled_holder(
    blobs: &[Bytes],
    target: Multiaddr,
) -> anyhow::Result<(PeerId, tokio::task::JoinHandle<()>)> {
    let chunk_lists: HashMap<BlobHash, ChunkList> =
        blobs.iter().map(|b| (BlobHash::of(b), ChunkList::compute(b))).collect();
    let mut swarm = SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(tcp::Config::default(), noise::Config::new, yamux::Config::default)?
        .with_behaviour(|_| {
            request_response::Behaviour::<WireCodec>::new(
                [(BLOB_PROTOCOL, ProtocolSupport::Inbound)],
                request_response::Config::default().with_request_timeout(Duration::from_secs(300)),
            )
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(300)))
        .build();
    let id = *swarm.local_peer_id();
    swarm.dial(target)?;
    let task = tokio::spawn(async move {
        let mut held: Vec<ResponseChannel<BlobResponse>> = Vec::new();
        loop {
            if let SwarmEvent::Behaviour(request_response::Event::Message {
                message: request_response::Message::Request { request, channel, .. },
                ..
            }) = swarm.select_next_some().await
            {
                match request {
                    BlobRequest::ChunkList { hash } => {
                        let res = chunk_lists
                            .get(&hash)
                            .map_or(BlobResponse::NotFound, |m| BlobResponse::ChunkList(m.clone()));
                        let _ = swarm.behaviour_mut().send_response(channel, res);
                    }
                    BlobRequest::Chunk { .. } => held.push(channel),
                }
            }
        }
    });
    Ok((id, task))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_holder_does_not_hold_a_fetch() -> anyhow::Result<()> {
    // The honest holder is capped, so that it is still busy when the deadline passes.
    let rate = 8_000_000u64;
    let holder = start(Opts { upload_bytes_per_sec: Some(rate), ..Opts::default() }).await?;
    let fetcher = start_from(&holder).await?;
    let big = Bytes::from(seeded_bytes(21, 24 * CHUNK_SIZE));
    let small = Bytes::from(seeded_bytes(22, 700_000));
    let small2 = Bytes::from(seeded_bytes(23, 600_000));
    for b in [&big, &small, &small2] {
        holder.client.put_blob(b.clone())?;
    }
    let (stalled, task) = stalled_holder(
        &[big.clone(), small.clone(), small2.clone()],
        fetcher.listen_addrs[0].clone(),
    )?;
    let hid = holder.client.peer_id();
    let only_holder = [hid];
    wait_until("fetcher connected to the holder", || sees_exactly(&fetcher, &only_holder)).await?;
    wait_until("stalled holder connected", || async {
        Ok(fetcher.client.stats().await?.connected >= 2)
    })
    .await?;

    // One chunk, stalled holder first: a hedge goes to the honest holder after a short delay.
    let t0 = Instant::now();
    let got = fetcher.client.fetch_blob(BlobHash::of(&small), &[stalled, hid]).await?;
    let one_chunk = t0.elapsed();
    assert_eq!(got, small);
    assert!(one_chunk < Duration::from_secs(2), "one-chunk fetch took {one_chunk:?}");
    let s = fetcher.client.stats().await?;
    assert!(s.hedged_requests >= 1, "{s:?}");

    // Many chunks from both: the stalled holder's requests pass their deadline, it is
    // demoted and its chunks go to the honest holder. Before: held for the 60 s timeout.
    let t0 = Instant::now();
    let got = fetcher.client.fetch_blob(BlobHash::of(&big), &[stalled, hid]).await?;
    let many = t0.elapsed();
    assert_eq!(got, big);
    let floor = (big.len() - CHUNK_SIZE) as f64 / rate as f64;
    assert!(many.as_secs_f64() < floor + 4.0, "took {many:?}; the cap allows {floor:.1} s");
    let s = fetcher.client.stats().await?;
    assert!(s.slow_sources >= 1, "{s:?}");

    // Next time the slow holder goes last: no hedge needed.
    let hedged = s.hedged_requests;
    let got = fetcher.client.fetch_blob(BlobHash::of(&small2), &[stalled, hid]).await?;
    assert_eq!(got, small2);
    assert_eq!(fetcher.client.stats().await?.hedged_requests, hedged);
    task.abort();
    stop_all(vec![holder, fetcher]).await
}
