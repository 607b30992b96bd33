//! `RUN_ID@MULTIADDR`, the argument of `--join`: parsed with a clear error for each way it
//! can be wrong.

use std::str::FromStr;

use atoll_net::{Multiaddr, PeerId};

use crate::manifest::RunId;

/// Where to join: the run's id and a peer of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinTarget {
    pub run: RunId,
    /// The peer's address, ending in `/p2p/<peer>`.
    pub addr: Multiaddr,
    pub peer: PeerId,
}

/// Why a `--join` argument was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("expected RUN_ID@MULTIADDR, e.g. 3f2a…(64 hex digits)@/ip4/1.2.3.4/tcp/4001/p2p/12D3…; no '@' in {0:?}")]
    NoAt(String),
    #[error(
        "the run id {0:?} is the short form (16 hex digits) that logs show; --join needs \
         all 64 (a peer prints them in its `--join` line at start)"
    )]
    ShortId(String),
    #[error("the run id must be 64 hex digits (blake3 of the manifest), got {0:?}")]
    BadId(String),
    #[error("{addr:?} is not a multiaddr: {reason}")]
    BadAddr { addr: String, reason: String },
    #[error(
        "the address {0} does not end in /p2p/<peer id>; give the whole address the peer \
         printed (it names the peer, so the connection is checked to reach that peer)"
    )]
    NoPeerId(String),
}

impl FromStr for JoinTarget {
    type Err = TargetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (id, addr) = s.split_once('@').ok_or_else(|| TargetError::NoAt(s.to_owned()))?;
        let run = parse_run_id(id)?;
        if addr.is_empty() {
            let reason = "nothing after '@'".to_owned();
            return Err(TargetError::BadAddr { addr: String::new(), reason });
        }
        let addr: Multiaddr = addr.parse().map_err(|e: atoll_net::multiaddr::Error| {
            TargetError::BadAddr { addr: addr.to_owned(), reason: e.to_string() }
        })?;
        let peer = match addr.iter().last() {
            Some(atoll_net::multiaddr::Protocol::P2p(peer)) => peer,
            _ => return Err(TargetError::NoPeerId(addr.to_string())),
        };
        Ok(JoinTarget { run, addr, peer })
    }
}

/// A run id in full: 64 hex digits, either case.
pub fn parse_run_id(id: &str) -> Result<RunId, TargetError> {
    let hex_digits = !id.is_empty() && id.bytes().all(|b| b.is_ascii_hexdigit());
    if hex_digits && id.len() == 16 {
        return Err(TargetError::ShortId(id.to_owned()));
    }
    if !hex_digits || id.len() != 64 {
        return Err(TargetError::BadId(id.to_owned()));
    }
    let hash = blake3::Hash::from_hex(id).map_err(|_| TargetError::BadId(id.to_owned()))?;
    Ok(RunId(*hash.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: &str = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA";

    fn id() -> String {
        "ab".repeat(32)
    }

    #[test]
    fn a_whole_join_argument_parses() {
        let addr = format!("/ip4/127.0.0.1/tcp/4001/p2p/{PEER}");
        let t: JoinTarget = format!(" {}@{addr} ", id().to_uppercase()).parse().unwrap();
        assert_eq!(t.run.hex(), id());
        assert_eq!(t.addr.to_string(), addr);
        assert_eq!(t.peer.to_string(), PEER);
        let quic = format!("{}@/ip4/10.0.0.1/udp/9/quic-v1/p2p/{PEER}", id());
        assert!(quic.parse::<JoinTarget>().is_ok());
    }

    #[test]
    fn each_mistake_gets_its_own_message() {
        let addr = format!("/ip4/127.0.0.1/tcp/4001/p2p/{PEER}");
        let err = |s: String| s.parse::<JoinTarget>().unwrap_err();
        assert!(matches!(err(addr.clone()), TargetError::NoAt(_)));
        assert!(matches!(err(format!("{}@{addr}", &id()[..16])), TargetError::ShortId(_)));
        assert!(matches!(err(format!("{}@{addr}", &id()[..63])), TargetError::BadId(_)));
        assert!(matches!(err(format!("{}x@{addr}", &id()[..63])), TargetError::BadId(_)));
        assert!(matches!(err(format!("@{addr}")), TargetError::BadId(_)));
        assert!(matches!(err(format!("{}@", id())), TargetError::BadAddr { .. }));
        assert!(matches!(err(format!("{}@127.0.0.1:4001", id())), TargetError::BadAddr { .. }));
        let e = err(format!("{}@/ip4/127.0.0.1/tcp/4001", id()));
        assert!(matches!(e, TargetError::NoPeerId(_)));
        assert!(e.to_string().contains("/p2p/"), "{e}");
        let e = err(format!("{}@/ip4/127.0.0.1/tcp/4001/p2p/notapeer", id()));
        assert!(matches!(e, TargetError::BadAddr { .. }), "{e:?}");
        // A multi-byte character must not panic the hex check.
        assert!(matches!(err(format!("{}é@{addr}", &id()[..62])), TargetError::BadId(_)));
    }
}
