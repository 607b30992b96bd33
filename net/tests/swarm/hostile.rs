//! Broken and hostile input crashes nobody; each rejection is counted by reason.

use std::time::Duration;

use atoll_net::announce::{topic_name, ANNOUNCE_VERSION};
use atoll_net::{Multiaddr, NetEvent};
use futures::StreamExt;
use libp2p::swarm::SwarmEvent;
use libp2p::{gossipsub, noise, tcp, yamux, Swarm, SwarmBuilder};
use tokio::io::AsyncWriteExt;

use crate::support::{
    bare_gossip_peer, next_event, seeded_bytes, start, start_from, stop_all, wait_until, Opts,
    DEADLINE,
};

/// Drives the swarm until `done` says so, or fails at the deadline.
async fn drive_until(
    swarm: &mut Swarm<gossipsub::Behaviour>,
    mut done: impl FnMut(&SwarmEvent<gossipsub::Event>) -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let ev = tokio::time::timeout_at(deadline, swarm.select_next_some())
            .await
            .map_err(|_| anyhow::anyhow!("hostile peer: condition not reached in time"))?;
        if done(&ev) {
            return Ok(());
        }
    }
}

fn envelope(version: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = version.to_be_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// The first envelope's form: a magic, the version and the run's name.
fn envelope_v1(run: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = b"ATLA".to_vec();
    v.extend_from_slice(&1u16.to_be_bytes());
    v.push(run.len() as u8);
    v.extend_from_slice(run.as_bytes());
    v.extend_from_slice(payload);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gossip_is_rejected_counted_and_not_forwarded() -> anyhow::Result<()> {
    let node = start(Opts::default()).await?;
    let mut honest = start_from(&node).await?;
    let target: Multiaddr = node.listen_addrs[0].clone();

    let topic = gossipsub::IdentTopic::new(topic_name("test-run"));
    let node_id = node.client.peer_id();
    let mut joined = Vec::new();
    for _ in 0..2 {
        let mut swarm = bare_gossip_peer()?;
        swarm.behaviour_mut().subscribe(&topic)?;
        swarm.dial(target.clone())?;
        drive_until(&mut swarm, |ev| {
            matches!(ev, SwarmEvent::Behaviour(gossipsub::Event::Subscribed { peer_id, topic: t }) if *peer_id == node_id && *t == topic.hash())
        })
        .await?;
        joined.push(swarm);
    }
    let (mut blunt, mut evil) = (joined.remove(0), joined.remove(0));
    // Bytes no honest peer sends: two of them ban the sender.
    for data in [b"n".to_vec(), envelope(ANNOUNCE_VERSION, &[7u8; 20 * 1024])] {
        let _ = blunt.behaviour_mut().publish(topic.clone(), data);
    }
    let blunt_task = tokio::spawn(async move {
        loop {
            blunt.select_next_some().await;
        }
    });
    // Another version (a peer of the first envelope's generation, or of a later one) is
    // one strike each: that peer is not banned, and its valid messages still go through
    // below.
    for data in [envelope_v1("test-run", b"x"), envelope(ANNOUNCE_VERSION + 1, b"x")] {
        let _ = evil.behaviour_mut().publish(topic.clone(), data);
    }
    // The hostile peer keeps running in its own task and publishes what it is sent.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let evil_topic = topic.clone();
    let evil_task = tokio::spawn(async move {
        loop {
            tokio::select! {
                Some(data) = rx.recv() => {
                    let _ = evil.behaviour_mut().publish(evil_topic.clone(), data);
                }
                _ = evil.select_next_some() => {}
            }
        }
    });
    let stats_ok = |s: &atoll_net::NetStats| {
        ["malformed", "wrong_version", "oversized"]
            .iter()
            .all(|r| s.rejects.get(*r).copied().unwrap_or(0) >= 1)
            && s.banned == 1
    };
    wait_until("rejections counted", || async { Ok(stats_ok(&node.client.stats().await?)) })
        .await?;
    // Valid messages from the same peer still go through, and are forwarded to the honest
    // peer (retried until the gossip mesh includes it).
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut n = 0u32;
    loop {
        n += 1;
        let msg = format!("still alive {n}");
        tx.send(envelope(ANNOUNCE_VERSION, msg.as_bytes())).await?;
        let got = tokio::time::timeout(Duration::from_millis(200), honest.events.recv()).await;
        if let Ok(Some(NetEvent::Announcement { payload, .. })) = got {
            assert!(payload.starts_with(b"still alive"));
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "valid message never forwarded");
    }
    // A frame above gossipsub's transmit limit is dropped by its codec (and with it the
    // stream it came on); the node stays up and keeps serving the others.
    tx.send(envelope(ANNOUNCE_VERSION, &[8u8; 100 * 1024])).await?;
    wait_until("the node still publishes to the honest peer", || async {
        Ok(node.client.publish(b"after".to_vec()).await.is_ok())
    })
    .await?;
    let payload = next_event(&mut honest, |ev| match ev {
        NetEvent::Announcement { payload, .. } if &payload[..] == b"after" => Some(payload),
        _ => None,
    })
    .await?;
    assert_eq!(&payload[..], b"after");
    let honest_stats = honest.client.stats().await?;
    assert!(honest_stats.rejects.is_empty(), "bad messages were forwarded: {honest_stats:?}");
    evil_task.abort();
    blunt_task.abort();
    stop_all(vec![node, honest]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_listen_port_crashes_nobody() -> anyhow::Result<()> {
    let node = start(Opts::default()).await?;
    let port = node.listen_addrs[0]
        .iter()
        .find_map(|p| match p {
            libp2p::multiaddr::Protocol::Tcp(port) => Some(port),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no tcp port"))?;
    for i in 0..5u64 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let _ = s.write_all(&seeded_bytes(i, 64 * 1024)).await;
        let _ = s.shutdown().await;
    }
    wait_until("handshake failures counted", || async {
        Ok(node.client.stats().await?.rejects.get("handshake").copied().unwrap_or(0) >= 5)
    })
    .await?;
    // Still a working peer.
    let other = start_from(&node).await?;
    let id = other.client.peer_id();
    wait_until("a real peer still joins", || async {
        Ok(node.client.run_peers().await?.contains(&id))
    })
    .await?;
    stop_all(vec![node, other]).await
}

/// A request-response codec that sends raw bytes: garbage on the blob protocol.
#[derive(Clone, Default)]
struct RawCodec;

#[async_trait::async_trait]
impl libp2p::request_response::Codec for RawCodec {
    type Protocol = libp2p::StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &Self::Protocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        read_bounded(io).await
    }

    async fn read_response<T>(&mut self, _: &Self::Protocol, io: &mut T) -> std::io::Result<Vec<u8>>
    where
        T: futures::AsyncRead + Unpin + Send,
    {
        read_bounded(io).await
    }

    async fn write_request<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        use futures::AsyncWriteExt;
        io.write_all(&req).await?;
        io.close().await
    }

    async fn write_response<T>(
        &mut self,
        _: &Self::Protocol,
        io: &mut T,
        res: Vec<u8>,
    ) -> std::io::Result<()>
    where
        T: futures::AsyncWrite + Unpin + Send,
    {
        use futures::AsyncWriteExt;
        io.write_all(&res).await?;
        io.close().await
    }
}

async fn read_bounded<T: futures::AsyncRead + Unpin>(io: &mut T) -> std::io::Result<Vec<u8>> {
    use futures::AsyncReadExt;
    let mut buf = Vec::new();
    io.take(1 << 20).read_to_end(&mut buf).await?;
    Ok(buf)
}

/// A bare libp2p peer speaking the blob protocol with raw bytes, one way or the other.
fn raw_blob_peer(
    support: libp2p::request_response::ProtocolSupport,
) -> anyhow::Result<Swarm<libp2p::request_response::Behaviour<RawCodec>>> {
    use libp2p::request_response;
    Ok(SwarmBuilder::with_new_identity()
        .with_tokio()
        .with_tcp(tcp::Config::default(), noise::Config::new, yamux::Config::default)?
        .with_behaviour(|_| {
            request_response::Behaviour::<RawCodec>::new(
                [(atoll_net::blob::wire::BLOB_PROTOCOL, support)],
                request_response::Config::default(),
            )
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(DEADLINE))
        .build())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_the_blob_protocol_is_counted_and_harmless() -> anyhow::Result<()> {
    use libp2p::request_response::ProtocolSupport;
    let node = start(Opts::default()).await?;
    let data = bytes::Bytes::from(seeded_bytes(9, 3 * atoll_net::CHUNK_SIZE));
    let hash = node.client.put_blob(data.clone())?;

    let mut evil = raw_blob_peer(ProtocolSupport::Outbound)?;
    let (peer, addr) = atoll_net::node::split_p2p(&node.listen_addrs[0])
        .ok_or_else(|| anyhow::anyhow!("listen address without peer id"))?;
    evil.add_peer_address(peer, addr);
    // Unknown tag, truncated chunk request, and a hash cut short.
    let garbage = [vec![0xff; 64], vec![1, 2, 3], vec![0; 10]];
    for g in &garbage {
        evil.behaviour_mut().send_request(&peer, g.clone());
    }
    let evil_task = tokio::spawn(async move {
        loop {
            evil.select_next_some().await;
        }
    });
    wait_until("garbage requests counted", || async {
        let s = node.client.stats().await?;
        Ok(s.rejects.get("blob_malformed").copied().unwrap_or(0) >= garbage.len() as u64)
    })
    .await?;
    evil_task.abort();
    // The node still serves a real fetcher.
    let fetcher = start_from(&node).await?;
    let id = [node.client.peer_id()];
    wait_until("fetcher connected", || crate::support::sees_exactly(&fetcher, &id)).await?;
    assert_eq!(fetcher.client.fetch_blob(hash, &id).await?, data);
    stop_all(vec![node, fetcher]).await
}

/// A holder that takes blob requests and never answers them (a slow-loris stall) is named
/// in the failed fetch's `silent`, apart from a peer that answered "not here" (`denied`):
/// the two look alike to a fetcher that only counts failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_never_answers_is_named_silent() -> anyhow::Result<()> {
    use libp2p::request_response::{self, ProtocolSupport};
    let node = start(Opts::default()).await?;
    let denier = start_from(&node).await?;
    let denier_id = denier.client.peer_id();
    let mut silent = raw_blob_peer(ProtocolSupport::Inbound)?;
    let silent_id = *silent.local_peer_id();
    silent.listen_on("/ip4/127.0.0.1/tcp/0".parse()?)?;
    let addr = loop {
        if let SwarmEvent::NewListenAddr { address, .. } = silent.select_next_some().await {
            break address;
        }
    };
    // Takes every request and keeps its channel: the stream stays open, nothing is sent.
    let silent_task = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            if let SwarmEvent::Behaviour(request_response::Event::Message {
                message: request_response::Message::Request { channel, .. },
                ..
            }) = silent.select_next_some().await
            {
                held.push(channel);
            }
        }
    });
    node.client.dial(addr.with(libp2p::multiaddr::Protocol::P2p(silent_id))).await?;
    wait_until("the denier joined and the silent holder is connected", || async {
        let s = node.client.stats().await?;
        Ok(s.connected >= 2 && node.client.run_peers().await?.contains(&denier_id))
    })
    .await?;
    let hash = atoll_net::BlobHash::of(&seeded_bytes(3, 1000));
    let err = node.client.fetch_blob(hash, &[silent_id]).await.expect_err("nobody holds it");
    silent_task.abort();
    let atoll_net::NetError::Fetch(f) = &err else { anyhow::bail!("not a fetch error: {err}") };
    assert_eq!(f.silent(), &[silent_id][..], "{err}");
    assert_eq!(f.denied(), &[denier_id][..], "{err}");
    assert!(err.to_string().contains("1 did not answer"), "{err}");
    stop_all(vec![node, denier]).await
}
