//! What a peer serves over HTTP, checked from outside as people and tools see it: a
//! Prometheus scrape of `/metrics` parsed by a text-format parser, and the status page
//! loaded in a real headless Chromium, against a running 2-peer swarm on 127.0.0.1.
//!
//! Chromium (Debian package `chromium`) is installed by `.ci/run`; elsewhere the page test
//! skips saying why, unless `ATOLL_REQUIRE_CHROMIUM=1`, where its absence fails.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use atoll::rundir::status::{StatusFile, TrainingStatus};
use common::{Peer, Spec, Until};
use prometheus_parse::{Scrape, Value};

/// The swarm of these tests: peer 0 (serving) trains `steps` steps with a validation pass
/// every `val_every`; peer 1 trains on until the test ends (killed when dropped).
fn swarm(root: &Path, name: &str, steps: u64, val_every: u64, serve: &[&str]) -> Vec<Peer> {
    let mut train = atoll::train::TrainConfig::tiny(7);
    train.val_every = val_every;
    train.schedule.decay_steps = 100_000;
    let mut m = common::tiny_manifest(name, train);
    m.epoch_unix_ms = atoll::rundir::status::unix_ms();
    let manifest = common::write_manifest(root.join("manifest-in.json"), &m);
    let mut spec0 = Spec::train(root.join("peer-0"), &manifest, "0/2", Until::Steps(steps));
    for a in serve {
        spec0 = spec0.arg(a);
    }
    let mut peers = vec![Peer::start("peer 0", spec0)];
    let addr = peers[0].listen_addr(Duration::from_secs(30));
    let spec1 = Spec::train(root.join("peer-1"), &manifest, "1/2", Until::Steps(1_000_000))
        .bootstrap(Some(addr));
    peers.push(Peer::start("peer 1", spec1));
    peers
}

/// Waits until peer 0 names its servers and trains with peer 1 connected.
fn wait_serving(peers: &mut [Peer], min_step: u64) -> StatusFile {
    common::wait_for(
        "peer 0 serving, connected and training",
        Duration::from_secs(60),
        peers,
        |p| {
            p[0].status().is_some_and(|s| {
                s.stats.run_peers.len() == 1
                    && s.training.as_ref().is_some_and(|t| t.step >= min_step)
                    && (s.endpoints.http_addr.is_some() || s.endpoints.metrics_addr.is_some())
            })
        },
    );
    peers[0].status().unwrap()
}

/// `GET path` over a fresh connection; the status code and body.
fn get(addr: &str, request: &str) -> (u16, String) {
    let mut s =
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("cannot connect to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // A server may answer and close before reading all of an oversized request.
    let _ = s.write_all(request.as_bytes());
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (code, body)
}

fn get_path(addr: &str, path: &str) -> (u16, String) {
    get(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"))
}

fn scrape(addr: &str) -> Scrape {
    let (code, body) = get_path(addr, "/metrics");
    assert_eq!(code, 200, "/metrics answered {code}: {body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("/metrics does not parse")
}

/// The value of the sample `name` with label `label` (if given), as a float.
fn value(s: &Scrape, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    s.samples
        .iter()
        .find(|x| x.metric == name && label.is_none_or(|(k, v)| x.labels.get(k) == Some(v)))
        .map(|x| match x.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            _ => f64::NAN,
        })
}

fn must(s: &Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    value(s, name, label).unwrap_or_else(|| panic!("no sample {name} {label:?} in the scrape"))
}

/// Asserts `before ≤ scraped ≤ after` (the scrape was taken between two status files).
fn between(what: &str, before: u64, scraped: f64, after: u64) {
    assert!(
        before as f64 <= scraped && scraped <= after as f64,
        "{what}: scraped {scraped}, status.json said {before} before and {after} after"
    );
}

#[test]
fn metrics_of_a_running_swarm_agree_with_its_status_file() {
    let _serial = common::serial();
    let tmp = common::test_dir("web-metrics-");
    let mut peers =
        swarm(tmp.path(), "web-metrics", 1_000_000, 50, &["--metrics-addr", "127.0.0.1:0"]);
    let before = wait_serving(&mut peers, 60);
    let addr = before.endpoints.metrics_addr.clone().unwrap();
    assert!(before.endpoints.http_addr.is_none(), "no page was asked for");
    let s = scrape(&addr);
    // The board is updated as the status file is queued for writing: wait for a file
    // written after the scrape (a later step: peer 0 trains on), then compare.
    let scraped_step = must(&s, "atoll_step", None) as u64;
    peers[0].wait_until("status.json past the scraped step", Duration::from_secs(10), |t| {
        t.step > scraped_step
    });
    let after = peers[0].status().unwrap();
    let (tb, ta) = (before.training.clone().unwrap(), after.training.clone().unwrap());
    between("step", tb.step, must(&s, "atoll_step", None), ta.step);
    between("tokens", tb.tokens, must(&s, "atoll_tokens_total", None), ta.tokens);
    between("merges", tb.merges, must(&s, "atoll_merges_total", None), ta.merges);
    let (bs, as_) = (before.stats.bytes_sent, after.stats.bytes_sent);
    between("bytes sent", bs, must(&s, "atoll_bytes_sent_total", None), as_);
    let (br, ar) = (before.stats.bytes_received, after.stats.bytes_received);
    between("bytes received", br, must(&s, "atoll_bytes_received_total", None), ar);
    for (p, c) in &after.stats.protocols {
        let before = before.stats.protocols.get(p).map_or(0, |c| c.sent);
        let got = must(&s, "atoll_protocol_bytes_sent_total", Some(("protocol", p)));
        between(&format!("{p} bytes sent"), before, got, c.sent);
    }
    assert_eq!(must(&s, "atoll_run_peers", None), 1.0);
    assert_eq!(must(&s, "atoll_up", None), 1.0);
    assert_eq!(must(&s, "atoll_reachability", Some(("state", "unknown"))), 1.0);
    assert_eq!(must(&s, "atoll_reachability", Some(("state", "public"))), 0.0);
    for f in 0..ta.round.len() {
        let r = must(&s, "atoll_fragment_round", Some(("fragment", &f.to_string())));
        between(&format!("round of fragment {f}"), tb.round[f], r, ta.round[f]);
    }
    let loss = must(&s, "atoll_loss", None);
    assert!(loss.is_finite() && loss > 0.0, "loss {loss}");
    assert!(value(&s, "atoll_val_bpb", None).is_some_and(|v| v > 0.0), "no val_bpb after 60 steps");
    // Gauges are typed as gauges for a Prometheus scraper.
    let step = s.samples.iter().find(|x| x.metric == "atoll_step").unwrap();
    assert!(matches!(step.value, Value::Gauge(_)), "atoll_step is {:?}", step.value);
    // The metrics server serves nothing else.
    assert_eq!(get_path(&addr, "/").0, 404);
}

#[test]
fn a_no_train_peer_serves_network_metrics_and_refuses_what_is_not_a_read() {
    let _serial = common::serial();
    let tmp = common::test_dir("web-serve-");
    let spec = Spec::serve(tmp.path().join("boot"), "web-serve")
        .arg("--metrics-addr")
        .arg("127.0.0.1:0")
        .arg("--http")
        .arg("127.0.0.1:0");
    let mut peers = vec![Peer::start("bootstrap", spec)];
    common::wait_for(
        "the servers' addresses in status.json",
        Duration::from_secs(30),
        &mut peers,
        |p| p[0].status().is_some_and(|s| s.endpoints.metrics_addr.is_some()),
    );
    let st = peers[0].status().unwrap();
    let (metrics, page) = (st.endpoints.metrics_addr.unwrap(), st.endpoints.http_addr.unwrap());
    let s = scrape(&metrics);
    assert_eq!(must(&s, "atoll_up", None), 1.0);
    assert_eq!(must(&s, "atoll_run_peers", None), 0.0);
    assert!(value(&s, "atoll_bytes_sent_total", None).is_some());
    assert!(value(&s, "atoll_step", None).is_none(), "a --no-train peer has no training metrics");
    // The page server serves the metrics, the page and its JSON too.
    assert_eq!(scrape(&page).samples.len(), s.samples.len());
    let (code, body) = get_path(&page, "/api/status");
    assert_eq!(code, 200);
    let json: StatusFile = serde_json::from_str(&body).unwrap();
    assert_eq!(json.stats.peer_id, st.stats.peer_id);
    assert!(json.training.is_none());
    assert_eq!(get_path(&page, "/api/history").0, 200);
    assert!(get_path(&page, "/").1.contains("id=\"loss-plot\""));
    // Read-only and bounded: other methods are refused, oversized headers too, and the
    // server goes on serving.
    let post =
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc";
    assert_eq!(get(&page, post).0, 405);
    let huge = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(64 * 1024));
    let (code, _) = get(&page, &huge);
    assert!(code == 431 || code == 0, "an oversized request got {code}");
    assert_eq!(get(&page, "garbage\r\n\r\n").0, 400);
    assert_eq!(get_path(&page, "/nothing").0, 404);
    assert_eq!(scrape(&page).samples.len(), s.samples.len());
    peers[0].assert_alive();
}

/// Chromium, if installed (see the module doc).
fn chromium() -> Option<PathBuf> {
    let required = std::env::var("ATOLL_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1");
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths).map(|d| d.join(name)).find(|p| p.is_file())
        })
    });
    if found.is_none() {
        assert!(!required, "ATOLL_REQUIRE_CHROMIUM=1 but no chromium on PATH");
        eprintln!("SKIPPED: no chromium on PATH (apt-get install chromium; .ci/run does)");
    }
    found
}

/// The page's DOM after Chromium ran it for `budget` of virtual time (its polls included).
fn dump_dom(chromium: &Path, tmp: &Path, url: &str, budget: Duration) -> String {
    let profile = tempfile::tempdir_in(tmp).unwrap();
    let out_path = tmp.join("dom.html");
    let out = std::fs::File::create(&out_path).unwrap();
    let err = std::fs::File::create(tmp.join("chromium.log")).unwrap();
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .args(["--dump-dom", url])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("cannot start chromium");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 60 s");
        }
        std::thread::sleep(common::POLL);
    };
    let dom = std::fs::read_to_string(&out_path).unwrap();
    let log = std::fs::read_to_string(tmp.join("chromium.log")).unwrap_or_default();
    assert!(status.success(), "chromium exited with {status}\n{log}");
    assert!(dom.contains("id=\"atoll\""), "not the status page:\n{dom}\n{log}");
    dom
}

/// The attribute `name` of the element with id `id` in a serialised DOM.
fn attr(dom: &str, id: &str, name: &str) -> Option<String> {
    attr_of(dom, &format!("id=\"{id}\""), name)
}

/// The attribute `name` of the first element whose tag contains `marker`.
fn attr_of(dom: &str, marker: &str, name: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(tag[from..from + tag[from..].find('"')?].to_owned())
}

fn num<T: std::str::FromStr>(dom: &str, id: &str, name: &str) -> T {
    attr(dom, id, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {name} on #{id} in\n{dom}"))
}

#[test]
fn the_status_page_shows_a_live_swarm_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let _serial = common::serial();
    let tmp = common::test_dir("web-page-");
    // Peer 0 trains on past Chromium's first load (seconds).
    let steps = common::steps_for(Duration::from_secs(15));
    let mut peers = swarm(tmp.path(), "web-page", steps, 100, &["--http", "127.0.0.1:0"]);
    let before = wait_serving(&mut peers, 30);
    let url = format!("http://{}/", before.endpoints.http_addr.clone().unwrap());
    let tb = before.training.clone().unwrap();
    assert!(tb.step < steps, "peer 0 trained before the first load (step {})", tb.step);

    // A load while training: the page polled several times within the virtual time, and
    // shows the live numbers.
    let dom = dump_dom(&chromium, tmp.path(), &url, Duration::from_secs(3));
    let polls: u64 = num(&dom, "atoll", "data-updates");
    assert!(polls >= 2, "the page polled {polls} times in 3 s of virtual time");
    let step1: u64 = num(&dom, "atoll", "data-step");
    assert!(step1 >= tb.step && step1 < steps, "page step {step1}, status.json {}", tb.step);
    let curve: u64 = num(&dom, "loss-plot", "data-points");
    assert!(curve >= 20, "the loss curve has {curve} points at step {step1}");
    let curve_step: u64 = num(&dom, "loss-plot", "data-step");
    assert!(curve_step + 50 >= step1 && curve_step <= steps, "curve ends at {curve_step}");
    eprintln!(
        "first load: step {step1} (status.json {}), {curve} loss points, {polls} polls",
        tb.step
    );
    let peer1 = peers[1].peer_id().unwrap();
    assert!(dom.contains(&format!("data-peer=\"{peer1}\"")), "peer 1 not on the page\n{dom}");

    // Peer 0 reaches its target and stays, merging peer 1's deltas: its numbers are frozen,
    // so a second load must show exactly what status.json says.
    let t = peers[0].wait_until("peer 0 trained", common::deadline_for(steps, 2), |t| t.trained);
    let dom = dump_dom(&chromium, tmp.path(), &url, Duration::from_secs(2));
    let step2: u64 = num(&dom, "atoll", "data-step");
    assert_eq!(step2, steps, "the page did not update to the final step");
    assert!(step2 > step1);
    let loss: f64 = num(&dom, "atoll", "data-loss");
    assert!(
        (loss - f64::from(t.loss.unwrap())).abs() < 1e-6,
        "page loss {loss}, status {:?}",
        t.loss
    );
    // Refusals are counters: what the page showed, status.json shows at least now.
    let refused: u64 = num(&dom, "atoll", "data-refused");
    let now: u64 = peers[0].training().unwrap().refusals.values().sum();
    assert!(refused <= now, "the page shows {refused} refusals, status.json {now}");
    // Contribution period: this swarm does not sample, so every fragment's is 1.
    let period: u32 = num(&dom, "atoll", "data-period");
    assert_eq!((period, &t.period), (1, &vec![1; t.round.len()]), "page and status period");
    let val: f64 = num(&dom, "atoll", "data-val-bpb");
    assert!((val - t.val_bpb.unwrap()).abs() < 1e-9, "page val_bpb {val}, status {:?}", t.val_bpb);
    let val_plot: f64 = num(&dom, "val-plot", "data-val-bpb");
    assert!((val_plot - val).abs() < 1e-9, "the val_bpb curve ends at {val_plot}, not {val}");
    let val_points: u64 = num(&dom, "val-plot", "data-points");
    assert!(val_points >= steps / 100 - 1, "{val_points} validation points over {steps} steps");
    let curve2: u64 = num(&dom, "loss-plot", "data-points");
    assert!(curve2 > curve, "the loss curve did not grow: {curve} then {curve2}");
    assert_eq!(num::<u64>(&dom, "loss-plot", "data-step"), steps);
    check_rounds(&dom, &peers[0].training().unwrap());
    // Peer 1's heartbeats carry its states' short hashes: the consensus column compares them.
    let reported: u64 = num(&dom, "consensus", "data-reported");
    assert_eq!(reported, 1, "peers whose anchors reached the page");
    let sent: u64 = num(&dom, "bytes-sent", "data-bytes");
    assert!(sent > before.stats.bytes_sent, "bytes sent on the page {sent}");
    assert!(peers[0].status().is_some_and(|s| s.stats.bytes_sent >= sent));
}

/// One row per fragment, with this peer's anchor and round as of the load: the round no
/// later than the newest status file's, the anchor of that round where they match.
fn check_rounds(dom: &str, latest: &TrainingStatus) {
    let rows = dom.matches("data-fragment=").count();
    assert_eq!(
        rows,
        latest.round.len(),
        "{rows} fragment rows for {} fragments",
        latest.round.len()
    );
    for (f, (round, hash)) in latest.round.iter().zip(&latest.anchor_hashes).enumerate() {
        let marker = format!("data-fragment=\"{f}\"");
        let shown: u64 = attr_of(dom, &marker, "data-round").and_then(|r| r.parse().ok()).unwrap();
        let anchor = attr_of(dom, &marker, "data-anchor").unwrap();
        assert!(shown <= *round, "fragment {f}: page round {shown}, status.json {round}");
        assert_eq!(anchor.len(), 64, "fragment {f}: anchor {anchor:?}");
        if shown == *round {
            assert_eq!(&anchor, hash, "fragment {f} at round {round}");
        }
    }
}

/// The page names the peers this one refused, struck or banned: banned first, then by
/// standing strikes, then by refusals, each once. The figures are set on a board served
/// by the peer's own HTTP server (a swarm of honest peers has none to show).
#[test]
fn the_status_page_names_suspect_peers_in_chromium() {
    let Some(chromium) = chromium() else { return };
    let tmp = common::test_dir("web-suspects-");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let board = atoll::web::Board::new();
    let mut stats =
        atoll_net::NetStats { peer_id: "12D3KooWself".into(), banned: 3, ..Default::default() };
    stats.struck = vec![
        atoll_net::StruckPeer { peer: "12D3KooWlow".into(), strikes: 1.5 },
        atoll_net::StruckPeer { peer: "12D3KooWhigh".into(), strikes: 6.25 },
    ];
    stats.recent_bans = vec![atoll_net::BannedPeer {
        peer: "12D3KooWgone".into(),
        reason: "unserved".into(),
        at_secs: 42,
    }];
    let mut t = TrainingStatus { step: 5, round: vec![1], ..Default::default() };
    // Refused and struck: one row, its refusals and strikes side by side.
    t.refused_from =
        [("12D3KooWlow", 9), ("12D3KooWquiet", 2)].map(|(p, n)| (p.to_owned(), n)).into();
    t.anchor_hashes = vec!["0".repeat(64)];
    board.set_status(true, stats, Some(t));
    let opts = atoll::web::WebOptions { http: Some("127.0.0.1:0".parse().unwrap()), metrics: None };
    let servers = rt.block_on(atoll::web::start(opts, &board)).unwrap();
    let url = format!("http://{}/", servers.endpoints.http_addr.clone().unwrap());
    let dom = dump_dom(&chromium, tmp.path(), &url, Duration::from_secs(2));
    rt.block_on(servers.shutdown());

    assert_eq!(num::<u64>(&dom, "atoll", "data-suspects"), 4, "{dom}");
    let order: Vec<usize> = ["12D3KooWgone", "12D3KooWhigh", "12D3KooWlow", "12D3KooWquiet"]
        .iter()
        .map(|p| dom.find(&format!("data-peer=\"{p}\"")).unwrap_or_else(|| panic!("no {p}")))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "rows out of order: {order:?}");
    let of = |p: &str, name: &str| attr_of(&dom, &format!("data-peer=\"{p}\""), name).unwrap();
    assert_eq!(of("12D3KooWgone", "data-banned"), "unserved");
    assert_eq!(of("12D3KooWhigh", "data-strikes"), "6.25");
    assert_eq!(
        (of("12D3KooWlow", "data-refused"), of("12D3KooWlow", "data-strikes")),
        ("9".into(), "1.5".into())
    );
    assert_eq!(
        (of("12D3KooWquiet", "data-refused"), of("12D3KooWquiet", "data-banned")),
        ("2".into(), String::new())
    );
    assert!(dom.contains("unserved at 42 s"), "the ban's reason and time are shown");
    assert!(dom.contains("3 banned in all"), "{dom}");
}
