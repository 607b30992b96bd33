//! `atoll doctor`: what is wrong with a peer and what to do, from its run dir.
//!
//! Exit status: 0 when no problem was found (warnings may be printed), 1 when at least one
//! problem was found, 2 when the run dir could not be read.

use std::path::PathBuf;
use std::process::ExitCode;

use atoll::doctor::{self, count, Finding, Severity};
use atoll::heartbeat::short_peer;
use atoll::rundir::status::{unix_ms, StatusFile};

use super::status::{read_status, read_swarm};

/// Width of the human output's wrapped lines.
const WIDTH: usize = 88;

/// Arguments of `atoll doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run dir of the peer (as given to `atoll run --run-dir`).
    #[arg(long)]
    pub run_dir: PathBuf,
    /// Print the findings as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// Runs the diagnosis; the exit status says whether a problem was found.
pub fn main(args: Args) -> ExitCode {
    let status = match read_status(&args.run_dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    // A peer of an older version writes no swarm table: the checks that need it are skipped.
    let swarm = read_swarm(&args.run_dir).ok();
    let findings = doctor::diagnose(&status, swarm.as_ref(), unix_ms());
    if args.json {
        let out = serde_json::json!({
            "healthy": doctor::healthy(&findings),
            "peer_id": status.stats.peer_id,
            "findings": findings,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        print!("{}", human(&status, swarm.as_ref().map_or(0, |v| v.peers.len()), &findings));
    }
    if doctor::healthy(&findings) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn human(s: &StatusFile, heard: usize, findings: &[Finding]) -> String {
    let mut out = format!(
        "atoll doctor: peer {} of run {:?}: {} connected, {heard} heard by heartbeat\n",
        short_peer(&s.stats.peer_id),
        s.stats.run_name,
        count(s.stats.run_peers.len(), "run peer")
    );
    for f in findings {
        let label = match f.severity {
            Severity::Problem => "PROBLEM",
            Severity::Warning => "warning",
        };
        out += &format!("\n{label}  {}\n", f.title);
        out += &wrap("  saw  ", &f.saw);
        out += &wrap("  fix  ", &f.fix);
    }
    let problems = findings.iter().filter(|f| f.severity == Severity::Problem).count();
    let warnings = findings.len() - problems;
    out += &match (problems, warnings) {
        (0, 0) => "\nhealthy: no problem found (checked: reachable peers, NAT and relay, islands, \
                   rounds, clock, manifest, upload cap)\n"
            .to_owned(),
        (0, w) => format!("\nno problem found; {}\n", count(w, "warning")),
        (p, w) => format!("\n{}, {}\n", count(p, "problem"), count(w, "warning")),
    };
    out
}

/// `text` wrapped at [`WIDTH`], the first line after `head`, the others indented alike.
fn wrap(head: &str, text: &str) -> String {
    let indent = " ".repeat(head.chars().count());
    let mut out = String::new();
    let mut line = head.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            out += line.trim_end();
            out.push('\n');
            line = indent.clone();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out += line.trim_end();
    out.push('\n');
    out
}
