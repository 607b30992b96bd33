//! The live view of a local swarm (`atoll demo`, `atoll chaos`): one progress line per
//! peer on a terminal; without one (CI, a pipe), a plain line per peer now and then.
//! Messages go above the live lines.

use std::path::Path;
use std::time::{Duration, Instant};

use atoll::rundir::status;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Without a terminal, a plain progress line per peer this often.
const PLAIN_EVERY: Duration = Duration::from_secs(15);

/// One live line per peer, in the order they were added.
pub struct Console {
    multi: MultiProgress,
    bars: Vec<ProgressBar>,
    terminal: bool,
    last_plain: Instant,
}

impl Console {
    pub fn new() -> Self {
        use std::io::IsTerminal;
        Self {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Vec::new(),
            terminal: std::io::stderr().is_terminal(),
            last_plain: Instant::now(),
        }
    }

    /// Adds the next peer's line: `peer I [====>   ] step S/LEN …`, or `peer I step S …`
    /// when the length is unknown (0).
    pub fn add_peer(&mut self, len: u64) {
        let bar = self.multi.add(ProgressBar::new(len));
        let template = if len > 0 {
            "peer {prefix} [{bar:20}] step {pos}/{len} {msg}"
        } else {
            "peer {prefix} step {pos} {msg}"
        };
        let style = ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(self.bars.len().to_string());
        self.bars.push(bar);
    }

    /// Prints `line` above the live lines.
    pub fn say(&self, line: &str) {
        if self.terminal {
            self.multi.println(line).ok();
        } else {
            println!("{line}");
        }
    }

    /// Updates every peer's line from its run dir (`dirs[i]`, with `state[i]` before the
    /// figures: "paused ", "down ", ...); without a terminal, prints them when due.
    pub fn refresh<'a>(&mut self, peers: impl Iterator<Item = (&'a Path, &'a str)>) {
        let plain = !self.terminal && self.last_plain.elapsed() >= PLAIN_EVERY;
        if plain {
            self.last_plain = Instant::now();
        }
        for ((dir, state), bar) in peers.zip(&self.bars) {
            let (step, line) = live_line(dir).unwrap_or_default();
            bar.set_position(step);
            bar.set_message(format!("{state}{line}"));
            if plain {
                let of = bar.length().filter(|&l| l > 0).map_or(String::new(), |l| format!("/{l}"));
                println!("peer {} step {step}{of} {state}{line}", bar.prefix());
            }
        }
    }

    /// Removes the live lines (before the final report).
    pub fn clear(&self) {
        self.multi.clear().ok();
    }
}

/// `(step, "loss … val_bpb … round … peers … sent …")` from a peer's status file.
fn live_line(dir: &Path) -> Option<(u64, String)> {
    let s = status::read(&dir.join(status::FILE_NAME)).ok()?;
    let t = s.training.as_ref()?;
    let loss = t.loss.map_or("-".into(), |l| format!("{l:.3}"));
    let bpb = t.val_bpb.map_or("-".into(), |v| format!("{v:.3}"));
    let round = t.round.iter().max().copied().unwrap_or(0);
    let phase = match (t.final_val_bpb, t.trained) {
        (Some(_), _) => " done",
        (None, true) => " merging",
        _ => "",
    };
    Some((
        t.step,
        format!(
            "loss {loss} val_bpb {bpb} round {round} peers {} sent {}{phase}",
            s.stats.run_peers.len(),
            super::super::status::bytes(s.stats.bytes_sent)
        ),
    ))
}
