//! Discovery by run: one bootstrap peer is enough, newcomers are found, and the loss of the
//! bootstrap peer changes nothing for the others.

use atoll_net::{Node, PeerId};

use crate::support::{sees_exactly, start, start_from, stop_all, wait_until, Opts};

async fn all_see_each_other(nodes: &[Node]) -> anyhow::Result<bool> {
    let ids: Vec<PeerId> = nodes.iter().map(|n| n.client.peer_id()).collect();
    for n in nodes {
        let others: Vec<PeerId> =
            ids.iter().copied().filter(|p| *p != n.client.peer_id()).collect();
        if !sees_exactly(n, &others).await? {
            return Ok(false);
        }
    }
    Ok(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_find_each_other_and_survive_bootstrap_loss() -> anyhow::Result<()> {
    let first = start(Opts::default()).await?;
    let mut rest = Vec::new();
    for _ in 0..4 {
        rest.push(start_from(&first).await?);
    }
    let mut all = vec![first];
    all.append(&mut rest);
    wait_until("five peers see each other", || all_see_each_other(&all)).await?;

    // The bootstrap peer goes away; a newcomer joins through a survivor.
    let first = all.remove(0);
    first.handle.shutdown().await?;
    let newcomer = start_from(&all[2]).await?;
    all.push(newcomer);
    wait_until("survivors and newcomer see each other", || all_see_each_other(&all)).await?;
    let stats = all[0].client.stats().await?;
    assert!(stats.routing_table_size >= 4, "{stats:?}");
    assert!(stats.bytes_sent > 0 && stats.bytes_received > 0);
    stop_all(all).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_share_the_dht_but_not_their_peers() -> anyhow::Result<()> {
    // a (run r1) <- b (run r2) <- c (run r1): c must find a through the DHT, b is in no run
    // of theirs.
    let a = start(Opts { run_name: "r1", ..Opts::default() }).await?;
    let b = start(Opts {
        run_name: "r2",
        bootstrap: vec![a.listen_addrs[0].clone()],
        ..Opts::default()
    })
    .await?;
    let c = start(Opts {
        run_name: "r1",
        bootstrap: vec![b.listen_addrs[0].clone()],
        ..Opts::default()
    })
    .await?;
    let (ida, idc) = (a.client.peer_id(), c.client.peer_id());
    wait_until("a and c find each other through b", || async {
        Ok(sees_exactly(&a, &[idc]).await? && sees_exactly(&c, &[ida]).await?)
    })
    .await?;
    assert!(b.client.run_peers().await?.is_empty());
    stop_all(vec![a, b, c]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_peers_connect_and_discover() -> anyhow::Result<()> {
    let quic = "/ip4/127.0.0.1/udp/0/quic-v1";
    let a = start(Opts { listen: quic, ..Opts::default() }).await?;
    let b =
        start(Opts { listen: quic, bootstrap: vec![a.listen_addrs[0].clone()], ..Opts::default() })
            .await?;
    let c =
        start(Opts { listen: quic, bootstrap: vec![a.listen_addrs[0].clone()], ..Opts::default() })
            .await?;
    let nodes = vec![a, b, c];
    wait_until("three QUIC peers see each other", || all_see_each_other(&nodes)).await?;
    stop_all(nodes).await
}
