//! Peers behind real NAT, in network namespaces (root only; elsewhere the test says why it
//! skips).
//!
//! ```text
//!                 relay/bootstrap 203.0.113.10   (public, `--no-train`: relay server)
//!                          │
//!        ┌──────────── bridge "internet" 203.0.113.0/24 ────────────┐
//!   router a .1           router b .2                     router c .3
//!   MASQUERADE            MASQUERADE                      MASQUERADE --random-fully
//!   (cone-like)           (cone-like)                     (symmetric: a new port per flow)
//!   host a 10.1.0.2       host b 10.2.0.2                 host c 10.3.0.2
//! ```
//!
//! No host can dial another: every private address is unroutable from outside, and the
//! routers pass only replies (conntrack), dropping anything unsolicited in silence as home
//! routers do. So each training peer learns from AutoNAT that
//! it is private, reserves a slot on the relay, and the others reach it through the relay;
//! then DCUtR punches holes. Linux's MASQUERADE keeps a flow's source port when it can, so
//! a ↔ b punch through and end on a direct link; router c picks a random port per flow, so
//! what a and b saw of c is useless to them and a ↔ c, b ↔ c stay relayed. All three train
//! over these links and must end with identical anchors. The test prints the share of
//! direct and relayed links and the bytes the relay carried (bench/RESULTS.md).

mod common;

use std::process::Command;
use std::time::Duration;

use atoll::rundir::status::StatusFile;
use atoll_net::{LinkKind, Reachability};

use common::{assert_same_final_anchors, serial, swarm_manifest, wait_for, Peer, Spec, Until};

/// Seconds each peer trains: long enough to find out it is private, reserve, connect
/// through the relay and punch (35–50 s here: AutoNAT's dial-back must time out first),
/// then train over those links.
const TRAIN_SECS: u64 = 80;
const LINKS: Duration = Duration::from_secs(60);
const FINISH: Duration = Duration::from_secs(240);
const RELAY_IP: &str = "203.0.113.10";

#[test]
fn peers_behind_nat_connect_directly_or_through_the_relay_train_and_agree() {
    if let Some(why) = cannot_run() {
        eprintln!("SKIPPED peers_behind_nat_…: {why}");
        return;
    }
    let _serial = serial();
    let lab = match Lab::setup() {
        Ok(lab) => lab,
        // Root without the right to make namespaces (some containers): nothing to test.
        Err(why) => {
            eprintln!("SKIPPED peers_behind_nat_…: cannot build the NAT lab: {why}");
            return;
        }
    };
    let tmp = common::test_dir("atoll-nat");
    let manifest = swarm_manifest(tmp.path(), "nat-test");
    let run_name = atoll::manifest::Manifest::load(&manifest).unwrap().name;

    let relay_spec = Spec::serve(tmp.path().join("relay"), &run_name)
        .wrapper(&Lab::exec_refs(&lab.exec("relay")))
        .listen(&format!("/ip4/{RELAY_IP}/tcp/4001"))
        .arg("--listen")
        .arg(&format!("/ip4/{RELAY_IP}/udp/4001/quic-v1"));
    let mut relay = Peer::start("relay", relay_spec);
    let relay_addr = relay.listen_addr(Duration::from_secs(30));

    let mut peers: Vec<Peer> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let ip = h.host_ip();
            let spec = Spec::train(
                tmp.path().join(format!("peer-{}", h.name)),
                &manifest,
                &format!("{i}/{}", HOSTS.len()),
                Until::Seconds(TRAIN_SECS),
            )
            .wrapper(&Lab::exec_refs(&lab.exec(&format!("h{}", h.name))))
            .listen(&format!("/ip4/{ip}/tcp/0"))
            .arg("--listen")
            .arg(&format!("/ip4/{ip}/udp/0/quic-v1"))
            .bootstrap(Some(relay_addr.clone()));
            Peer::start(&format!("peer {}", h.name), spec)
        })
        .collect();

    wait_for("every peer private, with a relay reservation", LINKS, &mut peers, |ps| {
        ps.iter().all(|p| {
            p.status().is_some_and(|s| {
                s.stats.reachability == Reachability::Private
                    && !s.stats.relay.reservations.is_empty()
            })
        })
    });
    // a ↔ b direct (hole punched), c relayed to both.
    let expect = |me: usize, other: usize| {
        if me == 2 || other == 2 {
            LinkKind::Relayed
        } else {
            LinkKind::Direct
        }
    };
    wait_for("links: a ↔ b direct, c relayed", LINKS, &mut peers, |ps| {
        let ids: Vec<Option<String>> = ps.iter().map(Peer::peer_id).collect();
        (0..ps.len()).all(|me| {
            let Some(s) = ps[me].status() else { return false };
            (0..ps.len()).filter(|&o| o != me).all(|o| {
                let Some(id) = &ids[o] else { return false };
                s.stats.links.iter().any(|l| &l.peer == id && l.kind == expect(me, o))
            })
        })
    });
    // What a person reads: peer c is private, and its links are relayed.
    let out = Command::new(env!("CARGO_BIN_EXE_atoll"))
        .args(["status", "--run-dir"])
        .arg(&peers[2].spec.dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("reach    private") && text.contains("(relayed)"), "{text}");
    let ids: Vec<String> = peers.iter().filter_map(Peer::peer_id).collect();
    let pairs: Vec<LinkKind> = peers
        .iter()
        .filter_map(Peer::status)
        .flat_map(|s| s.stats.links.into_iter().filter(|l| ids.contains(&l.peer)))
        .map(|l| l.kind)
        .collect();

    common::wait_all_exit(&mut peers, FINISH);
    assert_same_final_anchors(&peers);
    let relay_status = relay.status().unwrap();
    assert!(relay_status.stats.relay.serving, "the --no-train peer serves as a relay");
    assert!(relay_status.stats.relay.circuits_served > 0, "the relay carried no circuit");
    let finals: Vec<StatusFile> = peers.iter().filter_map(Peer::status).collect();
    report(&pairs, &finals, &relay_status);
    drop(relay);
}

/// Prints the figures bench/RESULTS.md records: links between training peers (each end
/// counted) while they trained, and what went through the relay by the end.
fn report(pairs: &[LinkKind], peers: &[StatusFile], relay: &StatusFile) {
    let direct = pairs.iter().filter(|k| **k == LinkKind::Direct).count();
    let circuit: u64 = peers.iter().map(|s| s.stats.relay.circuit_bytes.sent).sum();
    let punched: u64 = peers.iter().map(|s| s.stats.relay.holepunch_ok).sum();
    let failed: u64 = peers.iter().map(|s| s.stats.relay.holepunch_failed).sum();
    let sent: u64 = peers.iter().map(|s| s.stats.bytes_sent).sum();
    eprintln!(
        "NAT lab: {direct} of {} peer-to-peer link ends direct, {} relayed; hole punches ok \
         {punched}, failed {failed}; circuits relayed {}; bytes the training peers sent \
         into circuits {circuit} of {sent} sent in all; the relay node sent {} B and \
         received {} B in all",
        pairs.len(),
        pairs.len() - direct,
        relay.stats.relay.circuits_served,
        relay.stats.bytes_sent,
        relay.stats.bytes_received,
    );
}

/// Why this machine cannot run the test, if it cannot.
fn cannot_run() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("needs root for network namespaces and iptables".into());
    }
    for tool in ["ip", "iptables"] {
        let found = Command::new(tool).arg("-V").output().is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!("`{tool}` is not installed (.ci/run installs it)"));
        }
    }
    None
}

/// One private LAN behind its router.
struct Host {
    name: &'static str,
    /// The router's address on the internet bridge.
    wan_ip: &'static str,
    /// `--random-fully`: a new source port per flow (hole punching cannot work).
    symmetric: bool,
}

impl Host {
    fn subnet(&self) -> u8 {
        match self.name {
            "a" => 1,
            "b" => 2,
            _ => 3,
        }
    }
    fn host_ip(&self) -> String {
        format!("10.{}.0.2", self.subnet())
    }
}

const HOSTS: [Host; 3] = [
    Host { name: "a", wan_ip: "203.0.113.1", symmetric: false },
    Host { name: "b", wan_ip: "203.0.113.2", symmetric: false },
    Host { name: "c", wan_ip: "203.0.113.3", symmetric: true },
];

/// The namespaces of the drawing above, deleted (with everything in them) when dropped.
struct Lab {
    prefix: String,
    made: Vec<String>,
}

impl Lab {
    fn setup() -> Result<Lab, String> {
        // Names unique to this process; interface names stay under 15 bytes.
        let tag = std::process::id() % 100_000;
        let mut lab = Lab { prefix: format!("atn{tag}"), made: Vec::new() };
        lab.add("inet")?;
        lab.add("relay")?;
        lab.in_ns("inet", &["ip", "link", "add", "br0", "type", "bridge"])?;
        lab.in_ns("inet", &["ip", "link", "set", "br0", "up"])?;
        lab.wan("relay", RELAY_IP)?;
        for h in &HOSTS {
            let router = format!("r{}", h.name);
            let host = format!("h{}", h.name);
            lab.add(&router)?;
            lab.add(&host)?;
            lab.wan(&router, h.wan_ip)?;
            let lan = format!("10.{}.0", h.subnet());
            lab.veth(&router, &format!("{lan}.1/24"), &host, &format!("{lan}.2/24"))?;
            lab.in_ns(&host, &["ip", "route", "add", "default", "via", &format!("{lan}.1")])?;
            lab.in_ns(&router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
            let mut nat = vec!["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "wan0"];
            nat.extend(["-j", "MASQUERADE"]);
            if h.symmetric {
                nat.push("--random-fully");
            }
            lab.in_ns(&router, &nat)?;
            // Like a home router: unsolicited packets from outside are dropped in silence,
            // not answered with a reset (a reset kills the other side's half of a punch).
            for chain in ["INPUT", "FORWARD"] {
                let drop = ["iptables", "-A", chain, "-i", "wan0", "-m", "conntrack"];
                let mut drop = drop.to_vec();
                drop.extend(["--ctstate", "NEW,INVALID", "-j", "DROP"]);
                lab.in_ns(&router, &drop)?;
            }
        }
        Ok(lab)
    }

    fn ns(&self, name: &str) -> String {
        format!("{}-{name}", self.prefix)
    }

    /// `ip netns exec NS`, for [`Spec::wrapper`].
    fn exec(&self, name: &str) -> Vec<String> {
        ["ip", "netns", "exec"].iter().map(|s| (*s).to_owned()).chain([self.ns(name)]).collect()
    }

    fn exec_refs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    fn add(&mut self, name: &str) -> Result<(), String> {
        let ns = self.ns(name);
        run(&["ip", "netns", "add", &ns])?;
        self.made.push(ns);
        self.in_ns(name, &["ip", "link", "set", "lo", "up"])
    }

    fn in_ns(&self, name: &str, cmd: &[&str]) -> Result<(), String> {
        let exec = self.exec(name);
        let mut all = Self::exec_refs(&exec);
        all.extend_from_slice(cmd);
        run(&all)
    }

    /// A veth pair between two namespaces, `wan0`-style names inside them.
    fn veth(&self, a: &str, a_ip: &str, b: &str, b_ip: &str) -> Result<(), String> {
        let (ea, eb) = (format!("{}{a}", self.prefix), format!("{}{b}", self.prefix));
        run(&["ip", "link", "add", &ea, "type", "veth", "peer", "name", &eb])?;
        for (ns, dev, ip, inside) in [(a, &ea, a_ip, "lan0"), (b, &eb, b_ip, "eth0")] {
            run(&["ip", "link", "set", dev, "netns", &self.ns(ns)])?;
            self.in_ns(ns, &["ip", "link", "set", dev, "name", inside])?;
            self.in_ns(ns, &["ip", "addr", "add", ip, "dev", inside])?;
            self.in_ns(ns, &["ip", "link", "set", inside, "up"])?;
        }
        Ok(())
    }

    /// Connects `name` to the internet bridge as `wan0` with `ip`/24.
    fn wan(&self, name: &str, ip: &str) -> Result<(), String> {
        let (outer, inner) = (format!("{}b{name}", self.prefix), format!("{}w{name}", self.prefix));
        run(&["ip", "link", "add", &outer, "type", "veth", "peer", "name", &inner])?;
        run(&["ip", "link", "set", &outer, "netns", &self.ns("inet")])?;
        self.in_ns("inet", &["ip", "link", "set", &outer, "master", "br0"])?;
        self.in_ns("inet", &["ip", "link", "set", &outer, "up"])?;
        run(&["ip", "link", "set", &inner, "netns", &self.ns(name)])?;
        self.in_ns(name, &["ip", "link", "set", &inner, "name", "wan0"])?;
        self.in_ns(name, &["ip", "addr", "add", &format!("{ip}/24"), "dev", "wan0"])?;
        self.in_ns(name, &["ip", "link", "set", "wan0", "up"])
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Deleting a namespace deletes its interfaces, and a veth pair goes with either end.
        for ns in self.made.iter().rev() {
            let _ = run(&["ip", "netns", "del", ns]);
        }
    }
}

/// Runs a command; the error has its stderr.
fn run(cmd: &[&str]) -> Result<(), String> {
    let (prog, args) = cmd.split_first().ok_or("empty command")?;
    let out = Command::new(prog).args(args).output().map_err(|e| format!("{prog}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}
