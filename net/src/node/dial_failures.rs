//! The most recent failed dials, with their addresses and reasons, for the status file and
//! for a joiner that must say why it reached no one.
//!
//! libp2p reports each failed outgoing connection once, with one error per address tried
//! (`DialError::Transport`). Errors are rendered with their causes and cut to
//! [`MAX_ERROR_LEN`]; only the last [`MAX_DIAL_FAILURES`] are kept.

use std::collections::VecDeque;
use std::error::Error;

use libp2p::swarm::DialError;
use libp2p::{Multiaddr, PeerId, TransportError};

use crate::counters::DialFailure;

/// Failed dials kept (oldest dropped first).
pub const MAX_DIAL_FAILURES: usize = 16;
/// Longest reason kept, in bytes.
pub const MAX_ERROR_LEN: usize = 300;

/// See the module docs.
#[derive(Debug, Default)]
pub struct DialFailures {
    list: VecDeque<DialFailure>,
}

impl DialFailures {
    /// Records a failed dial of `peer` (one entry per address libp2p tried). A dial that
    /// was only skipped or aborted (another connection won) is not a failure.
    pub fn record(&mut self, peer: Option<PeerId>, error: &DialError, at_secs: u64) {
        let mut add = |addr: Option<&Multiaddr>, error: String| {
            if self.list.len() >= MAX_DIAL_FAILURES {
                self.list.pop_front();
            }
            self.list.push_back(DialFailure {
                peer: peer.map(|p| p.to_string()),
                addr: addr.map(ToString::to_string).unwrap_or_default(),
                error: bounded(error),
                at_secs,
            });
        };
        match error {
            DialError::Transport(errors) => {
                for (addr, e) in errors {
                    let why = match e {
                        TransportError::MultiaddrNotSupported(_) => {
                            "address not supported by this build's transports".to_string()
                        }
                        TransportError::Other(e) => chain(e),
                    };
                    add(Some(addr), why);
                }
            }
            DialError::WrongPeerId { obtained, address } => add(
                Some(address),
                format!("the peer at this address is {obtained}, not the one dialled"),
            ),
            DialError::DialPeerConditionFalse(_) | DialError::Aborted => {}
            other => add(None, chain(other)),
        }
    }

    /// The failures kept, oldest first.
    pub fn snapshot(&self) -> Vec<DialFailure> {
        self.list.iter().cloned().collect()
    }
}

/// An error and its causes, `outer: inner: …`, each cause once (libp2p's transport errors
/// often repeat their source in their own message).
fn chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn bounded(mut s: String) -> String {
    if s.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_bounded_and_keep_each_address_and_reason() {
        let mut f = DialFailures::default();
        let addr: Multiaddr = "/ip4/127.0.0.1/tcp/1".parse().unwrap();
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = DialError::Transport(vec![(addr.clone(), TransportError::Other(refused))]);
        for i in 0..(MAX_DIAL_FAILURES as u64 + 3) {
            f.record(None, &e, i);
        }
        let s = f.snapshot();
        assert_eq!(s.len(), MAX_DIAL_FAILURES);
        assert_eq!(s[0].at_secs, 3);
        assert_eq!(s[0].addr, addr.to_string());
        assert!(s[0].error.contains("refused"), "{}", s[0].error);
        f.record(None, &DialError::Aborted, 99);
        assert_eq!(f.snapshot().last().unwrap().at_secs, MAX_DIAL_FAILURES as u64 + 2);
        let long = bounded("é".repeat(MAX_ERROR_LEN));
        assert!(long.len() <= MAX_ERROR_LEN + '…'.len_utf8());
    }
}
