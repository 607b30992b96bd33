//! A cursor over untrusted bytes (gossip messages, heartbeats, fetched states): every read
//! checks the length first, so a decoder cannot read past the end or panic on a cut input.
//! Each decoder turns [`Short`] into its own error.

/// The input ended `missing` bytes short of a read that started at byte `at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short {
    pub at: usize,
    pub missing: usize,
}

/// Reads fields front to back.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    /// Bytes read so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        let rest = &self.bytes[self.pos..];
        if rest.len() < n {
            return Err(Short { at: self.pos, missing: n - rest.len() });
        }
        self.pos += n;
        Ok(&rest[..n])
    }

    /// The next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u16_le(&mut self) -> Result<u16, Short> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    pub fn u32_le(&mut self) -> Result<u32, Short> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64_le(&mut self) -> Result<u64, Short> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub fn u16_be(&mut self) -> Result<u16, Short> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    pub fn u64_be(&mut self) -> Result<u64, Short> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    pub fn f32_be(&mut self) -> Result<f32, Short> {
        Ok(f32::from_be_bytes(self.array()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_in_order_and_reports_where_the_input_ran_out() {
        let bytes = [1u8, 2, 0, 3, 0, 0, 0, 9];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u8(), Ok(1));
        assert_eq!(c.u16_le(), Ok(2));
        assert_eq!(c.u32_le(), Ok(3));
        assert_eq!((c.pos(), c.remaining()), (7, 1));
        // A read past the end fails without moving: the byte left is still there.
        assert_eq!(c.u64_be(), Err(Short { at: 7, missing: 7 }));
        assert_eq!(c.take(1), Ok(&[9u8][..]));
        assert_eq!(c.take(0), Ok(&[][..]));
        assert_eq!(c.u8(), Err(Short { at: 8, missing: 1 }));
        let mut c = Cursor::new(&[0x3f, 0x80, 0, 0, 0, 1]);
        assert_eq!((c.f32_be(), c.u16_be()), (Ok(1.0), Ok(1)));
    }
}
