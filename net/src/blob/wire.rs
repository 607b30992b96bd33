//! The blob wire protocol `/atoll/blob/1`: one request and one response per stream.
//!
//! Hand-written fixed layouts instead of a serde format: every length is checked against a
//! bound before anything is allocated, and a chunk travels without re-encoding.
//!
//! ```text
//! request  = 0x00 hash[32]                      (chunk list)
//!          | 0x01 hash[32] index:u32be          (chunk)
//! response = 0x00 size:u64be count:u32be cv[32]*count
//!          | 0x01 len:u32be bytes[len]          (len <= CHUNK_SIZE)
//!          | 0x02                               (not found)
//!          | 0x03                               (busy: upload queue full, retry elsewhere)
//! ```

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;

use super::{chunk_count, BlobHash, ChunkList, CHUNK_SIZE, MAX_BLOB_SIZE, MAX_CHUNKS};
use crate::counters::Counters;

/// Protocol name (versioned).
pub const BLOB_PROTOCOL: StreamProtocol = StreamProtocol::new("/atoll/blob/1");

/// Directives for the binary's tracing filter. libp2p's request-response handler logs one
/// WARN per inbound stream it drops over [`crate::behaviour::MAX_BLOB_STREAMS`] per
/// connection ("Dropping inbound stream because we are at capacity"): a peer opening blob
/// streams in a loop produced thousands of lines. The line names no peer and comes from
/// inside libp2p, so it cannot be throttled per peer here; the filter silences it (the
/// requester simply gets no answer, and the fair share counts what it does get).
pub const QUIET_LOG_DIRECTIVES: &[&str] = &["libp2p_request_response::handler=error"];

/// A request for part of a blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlobRequest {
    ChunkList { hash: BlobHash },
    Chunk { hash: BlobHash, index: u32 },
}

/// The answer to a [`BlobRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlobResponse {
    ChunkList(ChunkList),
    Chunk(Bytes),
    NotFound,
    Busy,
}

impl BlobResponse {
    /// Payload bytes this response carries (what the upload cap and counters measure).
    pub fn payload_len(&self) -> usize {
        match self {
            BlobResponse::ChunkList(m) => 12 + 32 * m.chunk_cvs.len(),
            BlobResponse::Chunk(b) => b.len(),
            BlobResponse::NotFound | BlobResponse::Busy => 0,
        }
    }
}

/// The request-response codec; counts wire bytes of the blob protocol.
#[derive(Clone)]
pub struct BlobCodec {
    pub(crate) counters: Arc<Counters>,
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

async fn read_array<T: AsyncRead + Unpin, const N: usize>(io: &mut T) -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    io.read_exact(&mut buf).await?;
    Ok(buf)
}

/// Decodes a request (at most 37 bytes are read).
pub async fn read_request<T: AsyncRead + Unpin>(io: &mut T) -> io::Result<BlobRequest> {
    let [tag] = read_array::<_, 1>(io).await?;
    let hash = BlobHash(read_array::<_, 32>(io).await?);
    match tag {
        0 => Ok(BlobRequest::ChunkList { hash }),
        1 => {
            let index = u32::from_be_bytes(read_array::<_, 4>(io).await?);
            Ok(BlobRequest::Chunk { hash, index })
        }
        _ => Err(invalid("unknown blob request tag")),
    }
}

/// Encodes a request; returns the bytes written.
pub async fn write_request<T: AsyncWrite + Unpin>(
    io: &mut T,
    req: &BlobRequest,
) -> io::Result<usize> {
    let mut buf = Vec::with_capacity(37);
    match req {
        BlobRequest::ChunkList { hash } => {
            buf.push(0);
            buf.extend_from_slice(&hash.0);
        }
        BlobRequest::Chunk { hash, index } => {
            buf.push(1);
            buf.extend_from_slice(&hash.0);
            buf.extend_from_slice(&index.to_be_bytes());
        }
    }
    io.write_all(&buf).await?;
    io.close().await?;
    Ok(buf.len())
}

/// Decodes a response, checking every length before allocating.
pub async fn read_response<T: AsyncRead + Unpin>(io: &mut T) -> io::Result<BlobResponse> {
    let [tag] = read_array::<_, 1>(io).await?;
    match tag {
        0 => {
            let size = u64::from_be_bytes(read_array::<_, 8>(io).await?);
            let count = u32::from_be_bytes(read_array::<_, 4>(io).await?) as usize;
            if size > MAX_BLOB_SIZE || count > MAX_CHUNKS || count != chunk_count(size) {
                return Err(invalid("chunk list size or chunk count out of bounds"));
            }
            let mut chunk_cvs = Vec::with_capacity(count);
            for _ in 0..count {
                chunk_cvs.push(read_array::<_, 32>(io).await?);
            }
            Ok(BlobResponse::ChunkList(ChunkList { size, chunk_cvs }))
        }
        1 => {
            let len = u32::from_be_bytes(read_array::<_, 4>(io).await?) as usize;
            if len > CHUNK_SIZE {
                return Err(invalid("chunk longer than CHUNK_SIZE"));
            }
            let mut data = vec![0u8; len];
            io.read_exact(&mut data).await?;
            Ok(BlobResponse::Chunk(Bytes::from(data)))
        }
        2 => Ok(BlobResponse::NotFound),
        3 => Ok(BlobResponse::Busy),
        _ => Err(invalid("unknown blob response tag")),
    }
}

/// Encodes a response; returns the bytes written.
pub async fn write_response<T: AsyncWrite + Unpin>(
    io: &mut T,
    res: &BlobResponse,
) -> io::Result<usize> {
    let written = match res {
        BlobResponse::ChunkList(m) => {
            let mut buf = Vec::with_capacity(13 + 32 * m.chunk_cvs.len());
            buf.push(0);
            buf.extend_from_slice(&m.size.to_be_bytes());
            buf.extend_from_slice(&(m.chunk_cvs.len() as u32).to_be_bytes());
            for cv in &m.chunk_cvs {
                buf.extend_from_slice(cv);
            }
            io.write_all(&buf).await?;
            buf.len()
        }
        BlobResponse::Chunk(data) => {
            let mut head = [0u8; 5];
            head[0] = 1;
            head[1..].copy_from_slice(&(data.len() as u32).to_be_bytes());
            io.write_all(&head).await?;
            io.write_all(data).await?;
            5 + data.len()
        }
        BlobResponse::NotFound => {
            io.write_all(&[2]).await?;
            1
        }
        BlobResponse::Busy => {
            io.write_all(&[3]).await?;
            1
        }
    };
    io.close().await?;
    Ok(written)
}

#[async_trait::async_trait]
impl libp2p::request_response::Codec for BlobCodec {
    type Protocol = StreamProtocol;
    type Request = BlobRequest;
    type Response = BlobResponse;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<BlobRequest>
    where
        T: AsyncRead + Unpin + Send,
    {
        match read_request(io).await {
            Ok(req) => {
                self.counters.blob.add_in(37);
                Ok(req)
            }
            Err(e) => {
                self.counters.blob_malformed.fetch_add(1, Ordering::Relaxed);
                if !self.counters.blob_malformed_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "malformed blob request rejected (logged once; see rejects.blob_malformed)"
                    );
                }
                Err(e)
            }
        }
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<BlobResponse>
    where
        T: AsyncRead + Unpin + Send,
    {
        let res = read_response(io).await?;
        self.counters.blob.add_in(1 + res.payload_len() as u64);
        Ok(res)
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: BlobRequest,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        let n = write_request(io, &req).await?;
        self.counters.blob.add_out(n as u64);
        Ok(())
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: BlobResponse,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        let n = write_response(io, &res).await?;
        self.counters.blob.add_out(n as u64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use futures::io::Cursor;

    fn round_trip(res: BlobResponse) -> BlobResponse {
        let mut buf = Cursor::new(Vec::new());
        block_on(write_response(&mut buf, &res)).unwrap();
        let mut rd = Cursor::new(buf.into_inner());
        block_on(read_response(&mut rd)).unwrap()
    }

    #[test]
    fn responses_round_trip() {
        let data = vec![7u8; CHUNK_SIZE + 3];
        let m = ChunkList::compute(&data);
        for r in [
            BlobResponse::ChunkList(m),
            BlobResponse::Chunk(Bytes::from_static(b"abc")),
            BlobResponse::NotFound,
            BlobResponse::Busy,
        ] {
            assert_eq!(round_trip(r.clone()), r);
        }
    }

    #[test]
    fn requests_round_trip() {
        for r in [
            BlobRequest::ChunkList { hash: BlobHash::of(b"x") },
            BlobRequest::Chunk { hash: BlobHash::of(b"y"), index: 77 },
        ] {
            let mut buf = Cursor::new(Vec::new());
            block_on(write_request(&mut buf, &r)).unwrap();
            let mut rd = Cursor::new(buf.into_inner());
            assert_eq!(block_on(read_request(&mut rd)).unwrap(), r);
        }
    }

    #[test]
    fn hostile_lengths_are_refused_before_allocation() {
        // A chunk claiming 4 GiB, a chunk list claiming 2^32 chunks, an unknown tag, truncation.
        let cases: Vec<Vec<u8>> = vec![
            [vec![1], u32::MAX.to_be_bytes().to_vec()].concat(),
            [vec![0], u64::MAX.to_be_bytes().to_vec(), u32::MAX.to_be_bytes().to_vec()].concat(),
            vec![9],
            vec![1, 0, 0, 0, 10, 1, 2],
            vec![],
        ];
        for bytes in cases {
            let mut rd = Cursor::new(bytes.clone());
            assert!(block_on(read_response(&mut rd)).is_err(), "{bytes:?}");
        }
    }
}
