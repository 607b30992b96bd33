//! atoll-net's blob protocol `/atoll/blob/1`: `wire::read_request` (what a server reads
//! from any peer) and `wire::read_response` (what a fetcher reads from a source), driven
//! with `futures::executor::block_on` over a `futures::io::Cursor`. Decoded values must
//! re-encode to the bytes that were read; decoded chunk lists are checked with
//! `root` / `verify` / `verify_chunk` as the fetcher does.
#![no_main]

use atoll_net::blob::wire::{
    read_request, read_response, write_request, write_response, BlobResponse,
};
use atoll_net::blob::{chunk_count, chunk_range, BlobHash, MAX_CHUNKS};
use futures::executor::block_on;
use futures::io::Cursor;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let mut rd = Cursor::new(rest);
    if mode & 1 == 0 {
        if let Ok(req) = block_on(read_request(&mut rd)) {
            let used = rd.position() as usize;
            assert!(used <= 37);
            let mut out = Cursor::new(Vec::new());
            let n = block_on(write_request(&mut out, &req)).expect("write to a Vec");
            assert_eq!(&out.into_inner()[..], &rest[..used]);
            assert_eq!(n, used);
        }
        return;
    }
    let Ok(res) = block_on(read_response(&mut rd)) else { return };
    let used = rd.position() as usize;
    let mut out = Cursor::new(Vec::new());
    let n = block_on(write_response(&mut out, &res)).expect("write to a Vec");
    assert_eq!(&out.into_inner()[..], &rest[..used]);
    assert_eq!(n, used);
    let _ = res.payload_len();
    if let BlobResponse::ChunkList(m) = &res {
        assert!(m.chunk_cvs.len() <= MAX_CHUNKS);
        assert_eq!(m.chunk_count(), chunk_count(m.size));
        let root = m.root();
        assert!(root.is_some(), "read_response checked the bounds root() checks");
        let _ = m.verify(&BlobHash([0; 32]));
        if let Some(root) = root {
            assert!(m.verify(&root));
        }
        // Chunks of this blob, as a fetcher checks them: index from the input, bytes empty
        // or the right length of zeros (only for small chunks, to keep runs fast).
        let index = (mode >> 1) as usize;
        for i in [0, index, m.chunk_cvs.len().saturating_sub(1), m.chunk_cvs.len(), usize::MAX] {
            let _ = m.verify_chunk(i, &[]);
            if i < m.chunk_cvs.len() {
                let r = chunk_range(m.size, i);
                let len = (r.end - r.start) as usize;
                if len <= 4096 {
                    let _ = m.verify_chunk(i, &vec![0u8; len]);
                }
            }
        }
    }
});
