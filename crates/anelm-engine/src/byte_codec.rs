//! Little-endian encoding of the few value kinds saved session state is made of, with a reader
//! that checks every length against the bytes left before it reads or allocates (the bytes come
//! from disk and may be anything).

/// The bytes ended before a value that was expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the data ends early: {wanted} more bytes were expected at offset {at}")]
pub struct Truncated {
    /// Offset of the value that did not fit.
    pub at: usize,
    /// Bytes it needed.
    pub wanted: usize,
}

pub(crate) fn put_u8(out: &mut Vec<u8>, v: u8) {
    out.push(v);
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_usize(out: &mut Vec<u8>, v: usize) {
    put_u64(out, v as u64);
}

pub(crate) fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(4 * v.len());
    for x in v {
        out.extend_from_slice(&x.to_bits().to_le_bytes());
    }
}

pub(crate) fn put_u16s(out: &mut Vec<u8>, v: &[u16]) {
    out.reserve(2 * v.len());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

pub(crate) fn put_u32s(out: &mut Vec<u8>, v: &[u32]) {
    out.reserve(4 * v.len());
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Reads values in order from a byte slice; every read checks the length first.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Truncated> {
        if n > self.remaining() {
            return Err(Truncated { at: self.at, wanted: n });
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, Truncated> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn u32(&mut self) -> Result<u32, Truncated> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, Truncated> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count or length stored as u64; one that does not fit a `usize` cannot be satisfied by
    /// the bytes left either, so it reads as truncated.
    pub(crate) fn usize(&mut self) -> Result<usize, Truncated> {
        let at = self.at;
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| Truncated { at, wanted: usize::MAX })
    }

    /// `n` values of `width` bytes, checked before anything is allocated.
    fn values(&mut self, n: usize, width: usize) -> Result<&'a [u8], Truncated> {
        let bytes = n.checked_mul(width).ok_or(Truncated {
            at: self.at,
            wanted: usize::MAX,
        })?;
        self.take(bytes)
    }

    pub(crate) fn f32s(&mut self, n: usize) -> Result<Vec<f32>, Truncated> {
        let b = self.values(n, 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_bits(u32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect())
    }

    pub(crate) fn u16s(&mut self, n: usize) -> Result<Vec<u16>, Truncated> {
        let b = self.values(n, 2)?;
        Ok(b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect())
    }

    pub(crate) fn u32s(&mut self, n: usize) -> Result<Vec<u32>, Truncated> {
        let b = self.values(n, 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_short_input_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        put_u8(&mut out, 7);
        put_u32(&mut out, 0xdead_beef);
        put_usize(&mut out, 1 << 40);
        put_f32s(&mut out, &[1.5, -0.0, f32::NAN]);
        put_u16s(&mut out, &[1, 65535]);
        put_u32s(&mut out, &[9]);
        let mut r = Reader::new(&out);
        assert_eq!(r.u8(), Ok(7));
        assert_eq!(r.u32(), Ok(0xdead_beef));
        assert_eq!(r.usize(), Ok(1 << 40));
        let f = r.f32s(3).unwrap();
        assert_eq!(f[0], 1.5);
        assert_eq!(f[1].to_bits(), (-0.0f32).to_bits());
        assert!(f[2].is_nan());
        assert_eq!(r.u16s(2), Ok(vec![1, 65535]));
        assert_eq!(r.u32s(1), Ok(vec![9]));
        assert_eq!(r.remaining(), 0);
        assert!(r.u8().is_err());
        // A huge count fails before allocating.
        let mut r = Reader::new(&out);
        assert!(r.f32s(usize::MAX / 2).is_err());
    }
}
