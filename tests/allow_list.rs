//! A closed run: the manifest's `allow` list names the peers that may take part. A peer not
//! on it refuses to start and says why; one that connects anyway is disconnected by the
//! members, who count it as `not_allowed`.

mod common;

use std::time::Duration;

use common::{Peer, Spec, Until};

#[test]
fn peers_off_the_allow_list_are_refused_on_both_sides() {
    let _serial = common::serial();
    let tmp = common::test_dir("allow-");
    let key = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let k = atoll_net::identity::load_or_create(&dir.join("peer_key")).unwrap();
        atoll_net::PeerId::from(k.public()).to_string()
    };
    let member = key("member");
    let _outsider = key("outsider");
    let mut train = atoll::train::TrainConfig::tiny(3);
    train.val_every = 100;
    let mut m = common::tiny_manifest("allow-test", train);
    m.epoch_unix_ms = atoll::rundir::status::unix_ms();
    m.allow = vec![member.clone()];
    let manifest = common::write_manifest(tmp.path().join("manifest-in.json"), &m);

    // The outsider has the manifest but is not on its list: it refuses to start.
    let spec = Spec::train(tmp.path().join("outsider"), &manifest, "1/2", Until::Steps(50));
    let mut outsider = Peer::start("outsider", spec);
    let exit = outsider.wait_exit(Duration::from_secs(60));
    assert!(!exit.success(), "an outsider trained in a closed run");
    assert!(outsider.log().contains("not on the run's allow list"), "{}", outsider.log_tail());

    // A member trains; a peer that is not on the list connects anyway and is dropped.
    let spec = Spec::train(tmp.path().join("member"), &manifest, "0/2", Until::Steps(3_000));
    let mut member_peer = Peer::start("member", spec);
    let addr = member_peer.listen_addr(Duration::from_secs(30));
    let intruder = Spec::serve(tmp.path().join("intruder"), "allow-test").bootstrap(Some(addr));
    let mut intruder = Peer::start("intruder", intruder);
    let refused = |ps: &[Peer]| {
        let rejects = ps[0].status().map(|s| s.stats.rejects).unwrap_or_default();
        rejects.get("not_allowed").copied().unwrap_or(0) > 0
    };
    let wait = Duration::from_secs(30);
    common::wait_for("the intruder refused", wait, std::slice::from_mut(&mut member_peer), refused);
    assert!(member_peer.run_peers().is_empty(), "the intruder is still a run peer");
    intruder.kill();
    member_peer.kill();
}
