//! Strikes and bans: a peer that misbehaves again and again is cut off for the run.
//!
//! Every misdeed is a strike: one reported by the protocol core through
//! [`crate::NetClient::penalize`] (bad delta, forged claim, equivocation, ...), a penalising
//! [`crate::NetClient::report`], or an announcement net itself rejected (malformed,
//! oversized, wrong run or version; honest peers validate before forwarding, so the
//! forwarder is to blame). Strikes fade by one per [`STRIKE_DECAY`], so an honest peer
//! that errs once in a while is never banned; [`BAN_STRIKES`] standing strikes ban the
//! peer: refused on dial and accept, disconnected, dropped from the DHT, blacklisted in
//! gossipsub, and written to the ban file so that a restart keeps the ban.
//!
//! Ban file format: one peer id per line, `#` comments and blank lines ignored; replaced
//! atomically (temporary file, then rename). A line that does not parse is skipped (one
//! warning names the first one): a damaged file must not stop a node from starting.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use libp2p::PeerId;

/// Standing strikes that ban a peer (rounded: eight strikes within five minutes ban).
pub const BAN_STRIKES: f64 = 8.0;
/// One strike fades in this long.
pub const STRIKE_DECAY: Duration = Duration::from_secs(600);
/// Most peers with strikes remembered (the ones with the fewest strikes are forgotten).
pub const MAX_STRIKES: usize = 4096;
/// Most peers banned; beyond it a peer is not banned but still graylisted by its score.
pub const MAX_BANS: usize = 4096;
/// Most peers named in [`crate::NetStats`] by their standing strikes, and most recent bans
/// named there: what an operator reads on the status page, not a record.
pub const SHOWN_PEERS: usize = 8;
/// Largest ban file read (about 5000 peer ids): the same bound as the block list.
pub use crate::fault::MAX_FILE_BYTES;

/// A ban file that was read: the peers, and the lines that were skipped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    pub peers: HashSet<PeerId>,
    /// How many lines did not parse.
    pub skipped: usize,
    /// The first of them, for the warning: (line number, text).
    pub first_bad: Option<(usize, String)>,
}

/// Parses the ban file format, skipping bad lines; at most [`MAX_BANS`] peers are kept.
pub fn parse(text: &str) -> Loaded {
    let mut out = Loaded::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.parse::<PeerId>() {
            Ok(p) if out.peers.len() < MAX_BANS => {
                out.peers.insert(p);
            }
            Ok(_) => {}
            Err(_) => {
                out.skipped += 1;
                if out.first_bad.is_none() {
                    out.first_bad = Some((i + 1, line.chars().take(80).collect()));
                }
            }
        }
    }
    out
}

/// Reads a ban file; a missing file is an empty list, an unreadable or oversized one an
/// error (the caller warns and starts without the bans).
pub fn read(path: &Path) -> Result<Loaded, String> {
    Ok(crate::fault::read_small(path)?.map(|t| parse(&t)).unwrap_or_default())
}

/// Replaces the ban file atomically with `peers`, sorted (stable diffs for people).
pub fn write<'a>(path: &Path, peers: impl IntoIterator<Item = &'a PeerId>) -> std::io::Result<()> {
    let mut ids: Vec<String> = peers.into_iter().map(|p| p.to_string()).collect();
    ids.sort();
    let mut text = String::from("# atoll: peers banned for misbehaving, one per line\n");
    for id in ids {
        text.push_str(&id);
        text.push('\n');
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Standing strikes per peer, fading with time. Bounded by [`MAX_STRIKES`].
#[derive(Debug, Default)]
pub struct Strikes {
    /// Strikes as of the instant they were last updated.
    map: HashMap<PeerId, (f64, Instant)>,
}

impl Strikes {
    /// Adds `n` strikes to `peer` at `now`; returns its standing strikes.
    pub fn add(&mut self, peer: PeerId, n: f64, now: Instant) -> f64 {
        if !self.map.contains_key(&peer) && self.map.len() >= MAX_STRIKES {
            self.map.retain(|_, (s, at)| faded(*s, *at, now) > 0.0);
            if self.map.len() >= MAX_STRIKES {
                let least = self
                    .map
                    .iter()
                    .min_by(|a, b| {
                        faded(a.1 .0, a.1 .1, now).total_cmp(&faded(b.1 .0, b.1 .1, now))
                    })
                    .map(|(p, _)| *p);
                if let Some(p) = least {
                    self.map.remove(&p);
                }
            }
        }
        let standing = self.get(&peer, now) + n;
        self.map.insert(peer, (standing, now));
        standing
    }

    /// Standing strikes of `peer` at `now`.
    pub fn get(&self, peer: &PeerId, now: Instant) -> f64 {
        self.map.get(peer).map_or(0.0, |(s, at)| faded(*s, *at, now))
    }

    /// The `n` peers with the most standing strikes at `now`, most first (ties: the
    /// smallest id); peers whose strikes have faded are left out.
    pub fn most(&self, n: usize, now: Instant) -> Vec<(PeerId, f64)> {
        let mut v: Vec<(PeerId, f64)> = self
            .map
            .iter()
            .map(|(p, (s, at))| (*p, faded(*s, *at, now)))
            .filter(|(_, s)| *s > 0.0)
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }

    /// Forgets a peer (once banned, its strikes no longer matter).
    pub fn remove(&mut self, peer: &PeerId) {
        self.map.remove(peer);
    }

    /// Peers remembered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

fn faded(strikes: f64, at: Instant, now: Instant) -> f64 {
    let gone = now.saturating_duration_since(at).as_secs_f64() / STRIKE_DECAY.as_secs_f64();
    (strikes - gone).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_bad_lines_and_names_the_first() {
        let (a, b) = (PeerId::random(), PeerId::random());
        let loaded = parse(&format!("# bans\n{a}\nnot-a-peer\n\n {b} \nalso bad\n{a}\n"));
        assert_eq!(loaded.peers, HashSet::from([a, b]));
        assert_eq!(loaded.skipped, 2);
        assert_eq!(loaded.first_bad, Some((3, "not-a-peer".to_string())));
    }

    #[test]
    fn write_then_read_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("banned_peers");
        assert_eq!(read(&path).unwrap(), Loaded::default());
        let peers: HashSet<PeerId> = (0..5).map(|_| PeerId::random()).collect();
        write(&path, &peers).unwrap();
        assert_eq!(read(&path).unwrap().peers, peers);
        assert!(!dir.path().join(".banned_peers.tmp").exists());
    }

    #[test]
    fn strikes_add_up_and_fade() {
        let mut s = Strikes::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        for _ in 0..7 {
            s.add(p, 1.0, t0);
        }
        assert_eq!(s.get(&p, t0), 7.0);
        assert_eq!(s.get(&p, t0 + STRIKE_DECAY * 2), 5.0);
        assert_eq!(s.add(p, 1.0, t0 + STRIKE_DECAY * 2), 6.0);
        assert_eq!(s.get(&p, t0 + STRIKE_DECAY * 20), 0.0);
    }

    #[test]
    fn the_most_struck_come_first_and_faded_ones_are_left_out() {
        let mut s = Strikes::default();
        let t0 = Instant::now();
        let (a, b, c) = (PeerId::random(), PeerId::random(), PeerId::random());
        s.add(a, 1.0, t0);
        s.add(b, 3.0, t0);
        s.add(c, 2.0, t0);
        assert_eq!(s.most(2, t0), vec![(b, 3.0), (c, 2.0)]);
        // After 1.5 decays, a has faded and the others have 1.5 and 0.5 left.
        let later = t0 + STRIKE_DECAY * 3 / 2;
        assert_eq!(s.most(8, later), vec![(b, 1.5), (c, 0.5)]);
    }

    #[test]
    fn strikes_are_bounded() {
        let mut s = Strikes::default();
        let t0 = Instant::now();
        let worst = PeerId::random();
        s.add(worst, 5.0, t0);
        for _ in 0..MAX_STRIKES + 10 {
            s.add(PeerId::random(), 1.0, t0);
        }
        assert_eq!(s.len(), MAX_STRIKES);
        assert_eq!(s.get(&worst, t0), 5.0, "the worst offender is not the one forgotten");
    }
}
