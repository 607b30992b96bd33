//! Private swarms: a pre-shared key (libp2p pnet) that every peer of the swarm must hold.
//!
//! With [`crate::NetConfig::swarm_key`] set, every TCP connection is wrapped in pnet's
//! XSalsa20 stream before noise: a peer without the key (or with another one) cannot even
//! finish the noise handshake, so it never learns our peer id's protocols, our DHT or our
//! announcements. QUIC encrypts inside the transport and has no layer for pnet, so a keyed
//! node refuses QUIC listen and dial addresses ([`NetError::Config`] / [`NetError::Dial`]).
//!
//! The key file is the format shared with go-libp2p and IPFS (`swarm.key`):
//!
//! ```text
//! /key/swarm/psk/1.0.0/
//! /base16/
//! <64 hex digits>
//! ```

use std::path::{Path, PathBuf};

use libp2p::multiaddr::Protocol;
use libp2p::Multiaddr;

use crate::error::NetError;

/// Length of a swarm key in bytes.
pub const KEY_LEN: usize = 32;
const HEADER: &str = "/key/swarm/psk/1.0.0/";
const ENCODING: &str = "/base16/";

/// Why a swarm key file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwarmKeyError {
    #[error("cannot read swarm key file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("swarm key: first line must be {HEADER:?}")]
    Header,
    #[error("swarm key: second line must be {ENCODING:?} (the only encoding supported)")]
    Encoding,
    #[error("swarm key: the key must be 64 hex digits, found {0} characters")]
    Length(usize),
    #[error("swarm key: {0:?} is not a hex digit")]
    Hex(char),
}

/// Parses the `swarm.key` format (see the module docs). Trailing whitespace and CRLF line
/// ends are tolerated.
pub fn parse(text: &str) -> Result<[u8; KEY_LEN], SwarmKeyError> {
    let mut lines = text.lines().map(str::trim);
    if lines.next() != Some(HEADER) {
        return Err(SwarmKeyError::Header);
    }
    if lines.next() != Some(ENCODING) {
        return Err(SwarmKeyError::Encoding);
    }
    let hex = lines.next().unwrap_or("");
    if hex.len() != 2 * KEY_LEN || !hex.is_ascii() {
        return Err(SwarmKeyError::Length(hex.chars().count()));
    }
    let mut key = [0u8; KEY_LEN];
    for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16).ok_or(SwarmKeyError::Hex(b as char));
        key[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Ok(key)
}

/// Reads and parses a swarm key file.
pub fn load(path: &Path) -> Result<[u8; KEY_LEN], SwarmKeyError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SwarmKeyError::Read { path: path.to_path_buf(), source })?;
    parse(&text)
}

/// Formats a key in the `swarm.key` format.
pub fn format(key: &[u8; KEY_LEN]) -> String {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    format!("{HEADER}\n{ENCODING}\n{hex}\n")
}

/// True for QUIC addresses (which cannot carry a swarm key).
pub fn is_quic(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::QuicV1 | Protocol::Quic))
}

/// The error for a QUIC address on a keyed node.
pub(crate) fn quic_refused(addr: &Multiaddr, listen: bool) -> NetError {
    let reason = "a private swarm (swarm key) runs over TCP only: QUIC has no layer for the \
                  pre-shared key; use a /tcp/ address"
        .to_string();
    if listen {
        NetError::Listen { addr: addr.to_string(), reason }
    } else {
        NetError::Dial { addr: addr.to_string(), reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let key: [u8; KEY_LEN] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(parse(&format(&key)).unwrap(), key);
        assert_eq!(parse(&format(&key).replace('\n', "\r\n")).unwrap(), key);
        assert!(matches!(parse("/key/swarm/psk/2.0.0/\n"), Err(SwarmKeyError::Header)));
        assert!(matches!(
            parse("/key/swarm/psk/1.0.0/\n/base64/\nAA==\n"),
            Err(SwarmKeyError::Encoding)
        ));
        assert!(matches!(
            parse("/key/swarm/psk/1.0.0/\n/base16/\nabcd\n"),
            Err(SwarmKeyError::Length(4))
        ));
        let bad = format!("/key/swarm/psk/1.0.0/\n/base16/\n{}zz\n", "0".repeat(62));
        assert!(matches!(parse(&bad), Err(SwarmKeyError::Hex('z'))));
        assert!(is_quic(&"/ip4/127.0.0.1/udp/1/quic-v1".parse().unwrap()));
        assert!(!is_quic(&"/ip4/127.0.0.1/tcp/1".parse().unwrap()));
    }
}
