//! The transport: TCP + noise + yamux, or QUIC, with every substream byte counted.
//!
//! We assemble the transport by hand instead of `SwarmBuilder::with_tcp().with_quic()` so
//! that one wrapper around the muxer counts the bytes of all protocols on both transports;
//! libp2p's own bandwidth metrics would pull in prometheus for one pair of numbers.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{AsyncRead, AsyncWrite};
use libp2p::core::muxing::{StreamMuxer, StreamMuxerBox, StreamMuxerEvent, SubstreamBox};
use libp2p::core::transport::{Boxed, OrTransport};
use libp2p::core::upgrade::Version;
use libp2p::pnet::{PnetConfig, PreSharedKey};
use libp2p::{identity::Keypair, noise, quic, relay, tcp, yamux, PeerId, Transport};

use crate::counters::{ByteCount, ByteCounter, Counters};
use crate::error::NetError;
use crate::streamkind::{Sniffer, StreamKind};

/// Time allowed for the noise and yamux handshakes of a TCP connection.
const TCP_UPGRADE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for closing a connection. libp2p waits for the muxer's close without a
/// limit, and a peer behind a silent partition never acknowledges it: the connection would
/// stay "established" (and the peer a run peer) for as long as TCP retries, ~15 min.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Builds the counted TCP-or-QUIC transport for `key`, with circuits of `relay` (the relay
/// client's transport) beside them. With a swarm key every TCP connection and every circuit
/// is wrapped in libp2p pnet before noise, and QUIC is left out (it cannot carry the key;
/// see [`crate::swarmkey`]).
pub fn build(
    key: &Keypair,
    swarm_key: Option<[u8; 32]>,
    counters: Arc<Counters>,
    relay: relay::client::Transport,
) -> Result<Boxed<(PeerId, StreamMuxerBox)>, NetError> {
    let tcp = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
    // A circuit is a byte stream through the relay: it gets the same handshake as TCP, so
    // the relay sees only ciphertext.
    let circuits = counters.clone();
    let relay = relay.map(move |conn, _| Counted {
        inner: conn,
        counters: circuits.clone(),
        kind: Kind::Circuit,
    });
    let streams = OrTransport::new(relay, tcp);
    let streams: Boxed<(PeerId, StreamMuxerBox)> = match swarm_key {
        None => streams
            .upgrade(Version::V1Lazy)
            .authenticate(noise(key)?)
            .multiplex(yamux::Config::default())
            .timeout(TCP_UPGRADE_TIMEOUT)
            .map(|(peer, m), _| (peer, StreamMuxerBox::new(m)))
            .boxed(),
        Some(psk) => {
            let pnet = PnetConfig::new(PreSharedKey::new(psk));
            streams
                .and_then(move |socket, _| pnet.handshake(socket))
                .upgrade(Version::V1Lazy)
                .authenticate(noise(key)?)
                .multiplex(yamux::Config::default())
                .timeout(TCP_UPGRADE_TIMEOUT)
                .map(|(peer, m), _| (peer, StreamMuxerBox::new(m)))
                .boxed()
        }
    };
    let tcp = streams;
    let transport = if swarm_key.is_some() {
        tcp
    } else {
        let quic = quic::tokio::Transport::new(quic::Config::new(key))
            .map(|(peer, m), _| (peer, StreamMuxerBox::new(m)))
            .boxed();
        OrTransport::new(quic, tcp).map(|either, _| either.into_inner()).boxed()
    };
    Ok(transport
        .map(move |(peer, muxer), _| {
            let counted =
                CountingMuxer { inner: muxer, counters: counters.clone(), close_deadline: None };
            (peer, StreamMuxerBox::new(counted))
        })
        .boxed())
}

fn noise(key: &Keypair) -> Result<noise::Config, NetError> {
    noise::Config::new(key).map_err(|e| NetError::Transport(e.to_string()))
}

/// A muxer whose substreams count their bytes into [`Counters::transport`], and whose close
/// gives up after [`CLOSE_TIMEOUT`].
struct CountingMuxer {
    inner: StreamMuxerBox,
    counters: Arc<Counters>,
    /// Set on the first `poll_close`.
    close_deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl CountingMuxer {
    fn wrap(&self, s: SubstreamBox, opener: Direction) -> CountingStream {
        Counted {
            inner: s,
            counters: self.counters.clone(),
            kind: Kind::Sniffing {
                opener,
                sniffer: Sniffer::default(),
                pending: ByteCount::default(),
            },
        }
    }
}

impl StreamMuxer for CountingMuxer {
    type Substream = CountingStream;
    type Error = io::Error;

    fn poll_inbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<CountingStream, io::Error>> {
        let s = futures::ready!(Pin::new(&mut self.inner).poll_inbound(cx))?;
        Poll::Ready(Ok(self.wrap(s, Direction::In)))
    }

    fn poll_outbound(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<CountingStream, io::Error>> {
        let s = futures::ready!(Pin::new(&mut self.inner).poll_outbound(cx))?;
        Poll::Ready(Ok(self.wrap(s, Direction::Out)))
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        if let Poll::Ready(done) = Pin::new(&mut self.inner).poll_close(cx) {
            return Poll::Ready(done);
        }
        let deadline =
            self.close_deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(CLOSE_TIMEOUT)));
        futures::ready!(deadline.as_mut().poll(cx));
        // Dropping the muxer drops the socket: the connection is gone for us either way.
        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "connection close timed out")))
    }

    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<StreamMuxerEvent, io::Error>> {
        Pin::new(&mut self.inner).poll(cx)
    }
}

/// A substream that counts what passes through it.
type CountingStream = Counted<SubstreamBox>;

/// A byte stream that counts what passes through it: a substream (into
/// [`Counters::transport`] and, once its protocol is known, [`Counters::streams`]) or a
/// relay circuit (into [`Counters::relayed`]).
struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
    kind: Kind,
}

/// The side of a substream whose bytes name its protocol: the side that opened it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    /// The remote opened it: read what arrives.
    In,
    /// We opened it: read what we write.
    Out,
}

/// Where a stream's bytes are counted besides the totals.
enum Kind {
    /// A relay circuit: a whole connection, not one protocol.
    Circuit,
    /// A substream whose protocol is not named yet; its bytes so far wait in `pending`.
    Sniffing {
        opener: Direction,
        sniffer: Sniffer,
        pending: ByteCount,
    },
    Known(StreamKind),
}

impl<S> Counted<S> {
    fn counter(&self) -> &ByteCounter {
        if matches!(self.kind, Kind::Circuit) {
            &self.counters.relayed
        } else {
            &self.counters.transport
        }
    }

    /// Counts `bytes` that went `dir`, per protocol once the protocol is known.
    fn count(&mut self, dir: Direction, bytes: &[u8]) {
        let n = bytes.len() as u64;
        if dir == Direction::In {
            self.counter().add_in(n);
        } else {
            self.counter().add_out(n);
        }
        let named = match &mut self.kind {
            Kind::Circuit => return,
            Kind::Known(kind) => {
                add(&self.counters.streams[kind.index()], dir, n);
                return;
            }
            Kind::Sniffing { opener, sniffer, pending } => {
                match dir {
                    Direction::In => pending.received += n,
                    Direction::Out => pending.sent += n,
                }
                if *opener != dir {
                    return;
                }
                match sniffer.feed(bytes) {
                    Some(kind) => (kind, *pending),
                    None => return,
                }
            }
        };
        self.settle(named.0, named.1);
    }

    fn settle(&mut self, kind: StreamKind, pending: ByteCount) {
        let counter = &self.counters.streams[kind.index()];
        counter.add_in(pending.received);
        counter.add_out(pending.sent);
        self.kind = Kind::Known(kind);
    }
}

fn add(counter: &ByteCounter, dir: Direction, n: u64) {
    match dir {
        Direction::In => counter.add_in(n),
        Direction::Out => counter.add_out(n),
    }
}

impl<S> Drop for Counted<S> {
    /// A substream that closed before naming its protocol counts as `Other`.
    fn drop(&mut self) {
        if let Kind::Sniffing { pending, .. } = self.kind {
            self.settle(StreamKind::Other, pending);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let n = futures::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        self.count(Direction::In, &buf[..n]);
        Poll::Ready(Ok(n))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = futures::ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        self.count(Direction::Out, &buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_close(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_close(cx)
    }
}
