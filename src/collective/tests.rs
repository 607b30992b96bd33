//! The collective's unit tests: groups over an in-memory swarm, and the wire form.
use super::*;
use crate::node::memnet::{MemNet, MemSwarm};
use atoll_net::Keypair;

fn peer(i: u8) -> PeerId {
    Keypair::ed25519_from_bytes([i; 32]).unwrap().public().to_peer_id()
}

/// A strict group of two formed at A (peer 1) with B (peer 2), whose network the test
/// drives by hand: the swarm (keep it alive), A's group, B's network and id.
async fn strict_pair() -> (MemSwarm, Group<MemNet>, MemNet, PeerId) {
    let swarm = MemSwarm::new();
    let (a, b) = (peer(1), peer(2));
    let (net_a, events_a) = swarm.join(a);
    let (net_b, _events_b) = swarm.join(b);
    let timeout = Duration::from_secs(10);
    let g = Group::form(net_a, events_a, [1; 32], 2, false, timeout).await.unwrap();
    (swarm, g, net_b, b)
}

#[test]
fn the_wire_round_trips_and_refuses_garbage() {
    let hash = BlobHash([9; 32]);
    let w = Wire { run: [7; 32], step: 5, members: 0b101, hash, len: 1234, prev: None };
    let msg = w.encode(2);
    assert_eq!(Wire::decode(&msg), Some(w));
    let w = Wire { prev: Some(BlobHash([3; 32])), ..w };
    assert_eq!(Wire::decode(&w.encode(3)), Some(w));
    assert_eq!(Wire::decode(&msg[..msg.len() - 1]), None);
    assert_eq!(Wire::decode(b"ATCL"), None);
    let mut bad = msg.clone();
    bad[0] = b'X';
    assert_eq!(Wire::decode(&bad), None);
}

#[tokio::test]
async fn an_announced_length_other_than_ours_is_refused_before_any_transfer() {
    let (_swarm, mut g, net_b, b) = strict_pair().await;
    // B announces a buffer of a gigabyte for step 0 (and holds nothing).
    let hash = BlobHash([5; 32]);
    let w = Wire { run: [1; 32], step: 0, members: 0b11, hash, len: 1 << 30, prev: None };
    net_b.publish(w.encode(0)).await.unwrap();
    match g.mean(0, &[1.0, 2.0]).await {
        Err(CollectiveError::Fetch { peer, reason, .. }) => {
            assert_eq!(peer, b);
            assert!(reason.contains("announced 1073741824 bytes, expected 8"), "{reason}");
        }
        other => panic!("expected a refused length, got {other:?}"),
    }
}

/// The last member to finish says so and leaves at once; if its word never got out, the
/// others see it leave and stop waiting for it, instead of waiting out the barrier timeout
/// (a 3-member group under an upload cap once took 66 s to end instead of 7).
#[tokio::test]
async fn a_member_that_left_is_not_waited_for_at_the_end() {
    let (swarm, mut g, _net_b, b) = strict_pair().await;
    swarm.leave(b);
    let ended = tokio::time::timeout(Duration::from_secs(5), g.finish()).await;
    assert!(ended.is_ok(), "waited for a member that had left (timeout 10 s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_gets_the_same_mean_and_elastic_groups_drop_the_silent() {
    let swarm = MemSwarm::new();
    let ids: Vec<PeerId> = (1..=3).map(peer).collect();
    let joined: Vec<_> = ids.iter().map(|p| swarm.join(*p)).collect();
    let timeout = Duration::from_secs(10);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (net, events)) in joined.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut g = Group::form(net, events, [1; 32], 3, true, timeout).await.unwrap();
            let mut out = Vec::new();
            for step in 0..3u64 {
                let values = vec![i as f32 + step as f32, 1.0 / (i as f32 + 1.0)];
                out.push(g.mean(step, &values).await.unwrap());
            }
            // Member 2 stops; the other two go on without it after the timeout.
            if i < 2 {
                g.timeout = Duration::from_millis(300);
                out.push(g.mean(3, &[i as f32, 0.0]).await.unwrap());
                assert_eq!(g.members().len(), 2);
            }
            (i, out)
        });
    }
    let mut results = BTreeMap::new();
    while let Some(r) = tasks.join_next().await {
        let (i, out) = r.unwrap();
        results.insert(i, out);
    }
    for step in 0..3 {
        let want = [1.0 + step as f32, (1.0 + 0.5 + 1.0 / 3.0) / 3.0];
        for out in results.values() {
            assert_eq!(out[step], results[&0][step], "members disagree at step {step}");
            assert!((out[step][0] - want[0]).abs() < 1e-6 && (out[step][1] - want[1]).abs() < 1e-6);
        }
    }
    assert_eq!(results[&0][3], vec![0.5, 0.0]);
    assert_eq!(results[&1][3], vec![0.5, 0.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_the_others_dropped_learns_it_and_stops() {
    let swarm = MemSwarm::new();
    let ids: Vec<PeerId> = (1..=3).map(peer).collect();
    let joined: Vec<_> = ids.iter().map(|p| swarm.join(*p)).collect();
    let timeout = Duration::from_secs(10);
    let (done_tx, mut done_rx) = mpsc::channel::<()>(2);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (net, events)) in joined.into_iter().enumerate() {
        let done = done_tx.clone();
        let mut go = None;
        if i == 2 {
            go = Some(std::mem::replace(&mut done_rx, mpsc::channel(1).1));
        }
        tasks.spawn(async move {
            let mut g = Group::form(net, events, [1; 32], 3, true, timeout).await.unwrap();
            g.mean(0, &[i as f32]).await.unwrap();
            if let Some(mut go) = go {
                // Stalled (as if stopped) until the others have gone two steps on.
                for _ in 0..2 {
                    go.recv().await.unwrap();
                }
                return (i, g.mean(1, &[0.0]).await.map(|_| ()));
            }
            g.timeout = Duration::from_millis(300);
            for step in 1..=3 {
                assert_eq!(g.mean(step, &[1.0]).await.unwrap(), vec![1.0], "step {step}");
            }
            assert_eq!(g.members().len(), 2);
            done.send(()).await.unwrap();
            (i, Ok(()))
        });
    }
    drop(done_tx);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            (2, Err(CollectiveError::Evicted { step: 1 })) => {}
            (2, other) => panic!("the dropped member went on: {other:?}"),
            (_, res) => res.unwrap(),
        }
    }
}

/// A strict group's lone holder behind a tight upload cap answers busy or late: the
/// fetch is tried again until the barrier timeout instead of ending the run. Here B
/// announces its buffer 1.2 s before it can serve it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_group_waits_for_a_buffer_its_holder_cannot_serve_yet() {
    let (_swarm, mut g, net_b, _) = strict_pair().await;
    let bytes: Vec<u8> = [3.0f32, 5.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let hash = BlobHash::of(&bytes);
    let w = Wire { run: [1; 32], step: 0, members: 0b11, hash, len: 8, prev: None };
    net_b.publish(w.encode(0)).await.unwrap();
    let holder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        net_b.put_blob(Bytes::from(bytes)).unwrap();
    });
    let mean = g.mean(0, &[1.0, 3.0]).await.expect("the strict group gave up on a late buffer");
    assert_eq!(mean, vec![2.0, 4.0]);
    holder.await.unwrap();
}
