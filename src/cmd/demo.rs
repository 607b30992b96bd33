//! `atoll demo`: a local swarm. Starts N `atoll run` processes on loopback, each training
//! its own shard of the embedded corpus and merging with the others, shows one live line
//! per peer, and ends with a summary table and `RUN_DIR/summary.json`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use atoll::backend::Backend;
use atoll::data::Corpus;
use atoll::fleet::{Process, Spec, Until};
use atoll::manifest::Manifest;
use atoll::proto::{RawSettings, Settings};
use atoll::train::pace;

use super::swarm::{self, Console, Launcher};

mod summary;

/// Name of the summary file in the demo's run dir.
pub const SUMMARY_FILE: &str = "summary.json";
/// How often the live lines are refreshed.
const REFRESH: Duration = Duration::from_millis(500);
/// How long the demo times inner steps before it writes the manifest.
const MEASURE: Duration = Duration::from_secs(2);
/// A peer's work besides its steps (validation, encoding, merging, the network), as a
/// share of its step time: measured on the default model (bench/RESULTS.md, "A period of
/// h steps on any machine", "The demo's timing with a pool per peer").
const MARGIN: f64 = 1.2;

/// Arguments of `atoll demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of peer processes.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub peers: u32,
    /// Inner steps per peer.
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Directory of the demo: manifest, one run dir per peer (`peer-I`), summary.json.
    /// Peer dirs of an earlier demo there are replaced.
    #[arg(long, default_value = "runs/demo")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub run: swarm::RunArgs,
    #[command(flatten)]
    pub pace: swarm::Pace,
    /// Give up (and stop the peers) after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout: u64,
    /// What the peers run: atoll, or a synchronous baseline on the same manifest, shards
    /// and network for comparison (`dp`: data-parallel, `diloco`: synchronous DiLoCo).
    #[arg(long, value_enum, default_value_t = super::run::Method::Atoll)]
    pub method: super::run::Method,
    /// Cap every peer's uploads of payloads at this many megabits per second (a slow link).
    #[arg(long, value_name = "MBPS")]
    pub max_upload_mbps: Option<f64>,
    /// Train for this many seconds instead of --steps (which still sets the default
    /// manifest's learning-rate decay): peers of different speeds stop together.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: Option<u64>,
    /// Emulate slower hardware on some peers (`atoll run --slowdown F`): their inner steps
    /// take F times their compute time. F from 1 to 1000.
    #[arg(long, value_name = "F", default_value = "1")]
    pub slowdown: atoll::node::Slowdown,
    /// How many peers get --slowdown: the last N of --peers. Default: every peer, late
    /// ones included (a swarm of slow machines that fits on few cores).
    #[arg(long, value_name = "N")]
    pub slow_peers: Option<u32>,
    /// Scavenging: start this many more peers --late-after seconds into the run (each with
    /// its own shard; with --duration they stop with the others).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub late_peers: u32,
    /// Seconds after the first peer started when the --late-peers start.
    #[arg(long, value_name = "SECS")]
    pub late_after: Option<u64>,
    /// The run's reference inner step in ms: its rounds come every h × MS ms. Default: an
    /// inner step timed here with all the peers stepping at once, plus a fifth for the rest of
    /// a peer's work, so that a period holds about h steps on this machine (never under 100
    /// ms or --min-step-ms). A period shorter than the preset's reference shrinks the grace
    /// cap and the quorum wait with it (given MS: only where they would not fit). A --config
    /// manifest, and a swarm of --slowdown or GPU peers, keeps its own unless this is given.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub step_ms: Option<u64>,
    /// A mixed swarm: the peers' backends in turn (peer I gets the I-th, cycling), e.g.
    /// `wgpu,flex`. Overrides --backend.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub backends: Vec<Backend>,
}

impl Args {
    /// Refuses combinations that would silently do something else than asked.
    fn check(&self) -> anyhow::Result<()> {
        let atoll = self.method == super::run::Method::Atoll;
        let slowed = self.slowdown != atoll::node::Slowdown::NONE;
        if let Some(n) = self.slow_peers {
            if !slowed {
                bail!("--slow-peers {n} needs --slowdown F with F > 1");
            }
            if n > self.peers {
                bail!("--slow-peers {n} is more than --peers {}", self.peers);
            }
        }
        if self.peers + self.late_peers > 16 {
            bail!("--peers plus --late-peers is at most 16");
        }
        match (self.late_peers, self.late_after, self.duration) {
            (0, Some(_), _) => bail!("--late-after needs --late-peers N"),
            (1.., None, _) => bail!("--late-peers needs --late-after SECS"),
            (1.., Some(a), Some(d)) if a >= d => {
                bail!("--late-after {a} must be less than --duration {d}")
            }
            _ => {}
        }
        if !atoll && (slowed || self.late_peers > 0) {
            bail!("--slowdown and --late-peers run atoll peers, not --method dp|diloco");
        }
        Ok(())
    }

    /// Whether peer `index` runs with `--slowdown`.
    fn slowed(&self, index: u32) -> bool {
        match self.slow_peers {
            None => true,
            Some(n) => index < self.peers && index + n >= self.peers,
        }
    }

    /// The backend of peer `index`.
    fn backend(&self, index: u32) -> Backend {
        match self.backends.len() {
            0 => self.run.backend,
            n => self.backends[index as usize % n],
        }
    }

    /// When peer `index` starts, counted from the first peer's start.
    fn start_after(&self, index: u32) -> u64 {
        if index < self.peers {
            0
        } else {
            self.late_after.unwrap_or(0)
        }
    }
}

struct Peer {
    dir: PathBuf,
    process: Process,
}

pub fn main(mut args: Args) -> anyhow::Result<()> {
    args.check()?;
    let started = Instant::now();
    swarm::prepare_dir(&args.run_dir, &[SUMMARY_FILE])?;
    let (corpus, manifest) = args.run.open(Some(args.steps))?;
    args.run.fit(&manifest, args.peers + args.late_peers)?;
    let manifest = paced(&args, manifest, &corpus)?;
    let manifest_path = swarm::save_manifest(&args.run_dir, &manifest)?;
    let length = match args.duration {
        Some(d) => format!("{d} s"),
        None => format!("{} steps", args.steps),
    };
    let gpu = (0..args.peers).filter(|&i| args.backend(i).is_gpu()).count() as u32;
    if args.duration.is_none() && gpu > 0 && gpu < args.peers {
        // A GPU peer does its steps many times faster and leaves the run with the anchors
        // of that moment, while the CPU peers merge on (bench/RESULTS.md, GPU backend).
        eprintln!(
            "note: GPU and CPU peers given a step count finish far apart, and a peer that \
             leaves early keeps the anchors of when it left; --duration SECS makes them \
             train as long and stop together"
        );
    }
    println!(
        "demo: {} {} peers × {length}, manifest {} in {}",
        args.peers,
        args.method.name(),
        manifest.run_id(),
        args.run_dir.display()
    );
    if args.slowdown != atoll::node::Slowdown::NONE {
        let slow = (0..args.peers + args.late_peers).filter(|&i| args.slowed(i)).count();
        println!("demo: {slow} peers slowed {}× (--slowdown)", args.slowdown);
    }
    if let (1.., Some(after)) = (args.late_peers, args.late_after) {
        println!("demo: {} more peers after {after} s (--late-peers)", args.late_peers);
    }

    let mut console = Console::new();
    let mut peers: Vec<Peer> = Vec::new();
    let result = run_swarm(&args, &manifest_path, &mut console, &mut peers);
    if result.is_err() {
        // Dropping a process kills it.
        peers.clear();
    }
    result?;
    console.clear();
    let dirs: Vec<&Path> = peers.iter().map(|p| p.dir.as_path()).collect();
    let summary = summary::summarise(&args, &manifest, &dirs, started.elapsed().as_secs_f64())?;
    summary::print(&summary);
    let path = args.run_dir.join(SUMMARY_FILE);
    atoll::checkpoint::write_atomic(&path, &serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    println!("summary written to {}", path.display());
    if !summary.anchors_agree {
        bail!("the peers ended with different anchors (see {})", path.display());
    }
    Ok(())
}

/// `manifest` with the reference step of `--step-ms`, or of this machine (see
/// [`atoll::train::pace`]) where the demo made the manifest and its peers are CPU peers at
/// full speed.
fn paced(args: &Args, mut manifest: Manifest, corpus: &Corpus) -> anyhow::Result<Manifest> {
    let peers = args.peers + args.late_peers;
    let protocol = manifest.protocol.clone();
    let paced = match args.step_ms {
        // The manifest's windows where they fit the chosen period, else shrunk with it.
        Some(ms) => {
            let kept = RawSettings { step_ms: ms, ..protocol.clone() };
            if Settings::new(kept.clone()).is_ok() {
                kept
            } else {
                protocol.paced(ms)
            }
        }
        None if args.run.config.is_some()
            || args.method != super::run::Method::Atoll
            || args.slowdown != atoll::node::Slowdown::NONE
            || (0..peers).any(|i| args.backend(i).is_gpu()) =>
        {
            return Ok(manifest);
        }
        None => {
            println!("demo: timing an inner step with {peers} peers stepping at once…");
            let rows = args.run.micro_batch.unwrap_or(0) as usize;
            let (backend, train) = (args.run.backend, &manifest.train);
            let step = pace::measure_step(train, backend, corpus, peers, rows, MEASURE)?;
            let floor = pace::MIN_STEP_MS.max(args.pace.min_step_ms.unwrap_or(0));
            let ms = pace::step_ms(step, MARGIN, floor);
            println!(
                "demo: an inner step takes {} ms here; rounds every {} × {ms} ms (--step-ms)",
                step.as_millis(),
                manifest.protocol.h
            );
            // The preset's windows keep their share of a period shorter than its reference.
            protocol.paced(ms)
        }
    };
    manifest.protocol = paced;
    manifest.validate()?;
    Ok(manifest)
}

/// The command line of peer `index`.
fn peer_spec(args: &Args, launcher: &Launcher, index: u32, bootstrap: &[String]) -> Spec {
    let until = match args.duration {
        // A late peer stops with the others.
        Some(d) => Until::Seconds(d.saturating_sub(args.start_after(index)).max(1)),
        None => Until::Steps(args.steps),
    };
    let mut spec = launcher.spec(index, until, args.backend(index), bootstrap);
    if let Some(mbps) = args.max_upload_mbps {
        spec = spec.arg("--max-upload-mbps").arg(&mbps.to_string());
    }
    if args.slowed(index) && args.slowdown != atoll::node::Slowdown::NONE {
        spec = spec.arg("--slowdown").arg(&args.slowdown.factor().to_string());
    }
    if args.method != super::run::Method::Atoll {
        let group = args.peers.to_string();
        spec = spec.arg("--method").arg(args.method.name()).arg("--group").arg(&group);
    }
    spec
}

fn run_swarm(
    args: &Args,
    manifest: &Path,
    console: &mut Console,
    peers: &mut Vec<Peer>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let launcher = Launcher {
        dir: &args.run_dir,
        manifest,
        run: &args.run,
        pace: args.pace,
        peers: args.peers + args.late_peers,
    };
    let start = |index: u32, bootstrap: &[String], console: &mut Console| {
        let spec = peer_spec(args, &launcher, index, bootstrap);
        console.add_peer(spec.steps().unwrap_or(0));
        (spec.dir.clone(), spec)
    };
    let (dir, spec) = start(0, &[], console);
    let (process, addr) = launcher.start_first(&spec)?;
    peers.push(Peer { dir, process });
    // The first peer's address is the others' bootstrap.
    if let Ok(a) = addr.parse() {
        let run = Manifest::load(manifest)?.run_id();
        if let Some(line) = atoll::join::join_line(run, &[a]) {
            console.say(&format!("others on this machine join with: {line}"));
        }
    }
    let bootstrap = std::slice::from_ref(&addr);
    for i in 1..args.peers {
        let (dir, spec) = start(i, bootstrap, console);
        peers.push(Peer { dir, process: swarm::start(&spec)? });
    }
    let first_started = Instant::now();
    loop {
        let mut running = 0;
        for (i, p) in peers.iter_mut().enumerate() {
            let exit = p.process.poll_exit()?;
            if let Some(exit) = exit.filter(|e| !e.success()) {
                bail!("peer {i} failed ({exit}):\n{}", swarm::log_tail(&p.dir));
            }
            running += usize::from(exit.is_none());
        }
        console.refresh(peers.iter().map(|p| (p.dir.as_path(), "")));
        let next = peers.len() as u32;
        let late = next < args.peers + args.late_peers;
        if late && first_started.elapsed().as_secs() >= args.start_after(next) {
            let (dir, spec) = start(next, bootstrap, console);
            peers.push(Peer { dir, process: swarm::start(&spec)? });
            continue;
        }
        if running == 0 && !late {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the demo did not finish within --timeout {} s", args.timeout);
        }
        std::thread::sleep(REFRESH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Demo {
        #[command(flatten)]
        args: Args,
    }

    /// The protocol settings of the manifest `atoll demo LINE` would write.
    fn paced_protocol(line: &[&str]) -> anyhow::Result<RawSettings> {
        let args = Demo::try_parse_from(std::iter::once("demo").chain(line.iter().copied()))?.args;
        let (corpus, manifest) = args.run.open(Some(args.steps))?;
        Ok(paced(&args, manifest, &corpus)?.protocol)
    }

    fn paced_ms(line: &[&str]) -> u64 {
        paced_protocol(line).unwrap().step_ms
    }

    #[test]
    fn the_demo_paces_its_own_run_by_this_machine() {
        // A tiny step takes milliseconds even with four peers: the shortest pace stands,
        // or the step floor where it is longer, with the grace cap shrunk in proportion
        // to the preset's 250 ms (500 ms there).
        let tiny = paced_protocol(&["--model", "tiny"]).unwrap();
        assert_eq!((tiny.step_ms, tiny.grace_cap_ms), (pace::MIN_STEP_MS, 200));
        assert_eq!(paced_ms(&["--model", "tiny", "--min-step-ms", "330"]), 330);
        // Chosen, or not measured: slowed peers keep the preset's pace.
        assert_eq!(paced_ms(&["--model", "tiny", "--step-ms", "400"]), 400);
        assert_eq!(paced_ms(&["--model", "base", "--slowdown", "2"]), 6_000);
        // A chosen period keeps the preset's windows where they fit, else shrinks them:
        // 70 ms (a 700 ms period) was refused while they stayed.
        let kept = paced_protocol(&["--model", "tiny", "--step-ms", "200"]).unwrap();
        assert_eq!((kept.step_ms, kept.grace_cap_ms), (200, 500));
        let short = paced_protocol(&["--model", "tiny", "--step-ms", "70"]).unwrap();
        assert_eq!((short.step_ms, short.grace_cap_ms, short.max_wait_ms), (70, 140, None));
    }

    #[test]
    fn a_new_runs_outer_rate_follows_its_inner_optimizer() {
        let outer = |line: &[&str]| {
            let line: Vec<&str> = ["--step-ms", "250"].iter().chain(line).copied().collect();
            paced_protocol(&line).unwrap().outer_lr
        };
        // The default preset steps with Muon, the tiny one with AdamW.
        assert_eq!(outer(&[]), 1.0);
        assert_eq!(outer(&["--optimizer", "adamw"]), 0.7);
        assert_eq!(outer(&["--model", "tiny"]), 0.7);
        assert_eq!(outer(&["--model", "tiny", "--optimizer", "muon"]), 1.0);
    }
}
