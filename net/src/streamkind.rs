//! Which protocol a substream carries, read from its first bytes, so that every substream
//! byte can be counted per protocol ([`crate::counters::Counters::streams`]).
//!
//! A libp2p substream opens with multistream-select: the side that opened it sends
//! `/multistream/1.0.0\n` and then the protocol it proposes, each as a varint length
//! followed by the text. [`Sniffer`] reads those first bytes (at most [`SNIFF_LIMIT`])
//! and names the protocol family; anything it cannot read counts as [`StreamKind::Other`].
//! It only observes: the bytes pass through unchanged.

/// Bytes read before giving up on naming a substream's protocol.
pub const SNIFF_LIMIT: usize = 160;

const HEADER: &[u8] = b"/multistream/1.0.0\n";

/// The protocol families whose bytes are counted apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamKind {
    Gossipsub,
    Kad,
    Blob,
    Identify,
    Ping,
    Relay,
    Dcutr,
    Autonat,
    Other,
}

impl StreamKind {
    pub const ALL: [StreamKind; 9] = [
        StreamKind::Gossipsub,
        StreamKind::Kad,
        StreamKind::Blob,
        StreamKind::Identify,
        StreamKind::Ping,
        StreamKind::Relay,
        StreamKind::Dcutr,
        StreamKind::Autonat,
        StreamKind::Other,
    ];

    /// Stable name in the status file (`protocols`, prefixed `stream/`).
    pub fn as_str(self) -> &'static str {
        match self {
            StreamKind::Gossipsub => "gossipsub",
            StreamKind::Kad => "kad",
            StreamKind::Blob => "blob",
            StreamKind::Identify => "identify",
            StreamKind::Ping => "ping",
            StreamKind::Relay => "relay",
            StreamKind::Dcutr => "dcutr",
            StreamKind::Autonat => "autonat",
            StreamKind::Other => "other",
        }
    }

    /// The index of this kind in [`StreamKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The family of a protocol name such as `/meshsub/1.1.0`.
    pub fn of_protocol(name: &[u8]) -> StreamKind {
        const FAMILIES: [(&[u8], StreamKind); 9] = [
            (b"/meshsub/", StreamKind::Gossipsub),
            (b"/atoll/kad/", StreamKind::Kad),
            (b"/ipfs/kad/", StreamKind::Kad),
            (b"/atoll/blob/", StreamKind::Blob),
            (b"/ipfs/id/", StreamKind::Identify),
            (b"/ipfs/ping/", StreamKind::Ping),
            (b"/libp2p/circuit/relay/", StreamKind::Relay),
            (b"/libp2p/dcutr", StreamKind::Dcutr),
            (b"/libp2p/autonat/", StreamKind::Autonat),
        ];
        FAMILIES
            .iter()
            .find(|(prefix, _)| name.starts_with(prefix))
            .map_or(StreamKind::Other, |(_, kind)| *kind)
    }
}

/// Reads the opening of one direction of a substream until it names a protocol.
#[derive(Debug, Default)]
pub struct Sniffer {
    buf: Vec<u8>,
}

impl Sniffer {
    /// Feeds the next bytes of the direction that opened the substream. Returns the kind
    /// once known (then the sniffer is done), `None` while more bytes are needed.
    pub fn feed(&mut self, bytes: &[u8]) -> Option<StreamKind> {
        let room = SNIFF_LIMIT.saturating_sub(self.buf.len());
        self.buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
        match parse(&self.buf) {
            Some(kind) => Some(kind),
            None if self.buf.len() >= SNIFF_LIMIT => Some(StreamKind::Other),
            None => None,
        }
    }
}

/// The kind named by a complete opening in `buf`, `Other` for an opening that is not
/// multistream-select, `None` while incomplete.
fn parse(mut buf: &[u8]) -> Option<StreamKind> {
    loop {
        let (len, rest) = varint(buf)?;
        if rest.len() < len {
            return None;
        }
        let (msg, rest) = rest.split_at(len);
        if msg == HEADER {
            buf = rest;
            continue;
        }
        // The other side's refusal or a listing request: the proposal comes next.
        if msg == b"na\n" || msg == b"ls\n" {
            buf = rest;
            continue;
        }
        return Some(match msg.strip_suffix(b"\n") {
            Some(name) if name.starts_with(b"/") => StreamKind::of_protocol(name),
            _ => StreamKind::Other,
        });
    }
}

/// An unsigned LEB128 length of at most two bytes (multistream messages are short).
fn varint(buf: &[u8]) -> Option<(usize, &[u8])> {
    let first = *buf.first()?;
    if first < 0x80 {
        return Some((first as usize, &buf[1..]));
    }
    let second = *buf.get(1)?;
    // A third byte would mean a message over 16 KiB: not an opening; `Other`.
    let len = (first & 0x7f) as usize | ((second & 0x7f) as usize) << 7;
    let len = if second >= 0x80 { SNIFF_LIMIT } else { len };
    Some((len, &buf[2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(text: &[u8]) -> Vec<u8> {
        let mut out = vec![text.len() as u8];
        out.extend_from_slice(text);
        out
    }

    fn opening(protocol: &str) -> Vec<u8> {
        let mut out = message(HEADER);
        out.extend(message(format!("{protocol}\n").as_bytes()));
        out
    }

    #[test]
    fn names_each_family_from_a_whole_opening() {
        let cases = [
            ("/meshsub/1.2.0", StreamKind::Gossipsub),
            ("/meshsub/1.1.0", StreamKind::Gossipsub),
            ("/atoll/kad/1.0.0", StreamKind::Kad),
            ("/atoll/blob/1", StreamKind::Blob),
            ("/ipfs/id/1.0.0", StreamKind::Identify),
            ("/ipfs/id/push/1.0.0", StreamKind::Identify),
            ("/ipfs/ping/1.0.0", StreamKind::Ping),
            ("/libp2p/circuit/relay/0.2.0/hop", StreamKind::Relay),
            ("/libp2p/dcutr", StreamKind::Dcutr),
            ("/libp2p/autonat/1.0.0", StreamKind::Autonat),
            ("/something/else", StreamKind::Other),
        ];
        for (protocol, kind) in cases {
            let mut with_data = opening(protocol);
            with_data.extend_from_slice(b"payload that follows the opening");
            assert_eq!(Sniffer::default().feed(&with_data), Some(kind), "{protocol}");
        }
    }

    #[test]
    fn waits_for_an_opening_split_across_writes() {
        let bytes = opening("/atoll/blob/1");
        for cut in 0..bytes.len() {
            let mut s = Sniffer::default();
            let first = s.feed(&bytes[..cut]);
            assert_eq!(first, None, "cut at {cut}");
            assert_eq!(s.feed(&bytes[cut..]), Some(StreamKind::Blob), "cut at {cut}");
        }
        // One byte at a time.
        let mut s = Sniffer::default();
        let seen: Vec<_> = bytes.iter().filter_map(|b| s.feed(&[*b])).collect();
        assert_eq!(seen, vec![StreamKind::Blob]);
    }

    #[test]
    fn skips_refusals_to_the_next_proposal() {
        let mut bytes = message(HEADER);
        bytes.extend(message(b"na\n"));
        bytes.extend(message(b"/meshsub/1.1.0\n"));
        assert_eq!(Sniffer::default().feed(&bytes), Some(StreamKind::Gossipsub));
    }

    #[test]
    fn anything_else_is_other_within_the_limit() {
        // Not multistream-select at all.
        assert_eq!(Sniffer::default().feed(b"\x05hello"), Some(StreamKind::Other));
        // A length that never completes: given up at the limit.
        let mut s = Sniffer::default();
        assert_eq!(s.feed(&[100]), None);
        assert_eq!(s.feed(&[0u8; SNIFF_LIMIT]), Some(StreamKind::Other));
        // A huge varint length.
        assert_eq!(Sniffer::default().feed(&[0xff, 0xff, 0x7f]), None);
        let mut s = Sniffer::default();
        s.feed(&[0xff, 0xff, 0x7f]);
        assert_eq!(s.feed(&[0u8; SNIFF_LIMIT]), Some(StreamKind::Other));
    }

    #[test]
    fn all_is_in_index_order() {
        for (i, kind) in StreamKind::ALL.iter().enumerate() {
            assert_eq!(kind.index(), i);
        }
    }
}
