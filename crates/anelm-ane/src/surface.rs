//! ANE I/O surfaces: fp16 tensors `[1, C, 1, W]` (W = 32 lanes for every anelm kernel).
//!
//! Element (c, lane) lives at halfword `c·W + lane` (`ane-runtime.md` §2.4, §5): each channel
//! row is one contiguous run of W halfwords, with no padding. A lane carries one token (prefill)
//! or one session (decode), so up to 32 vectors share one dispatch. Every f32 → fp16 conversion
//! here rounds to nearest even (the C++ system truncates on some paths; we do not).

use half::f16;

use crate::error::SurfaceError;

/// Lanes (innermost dimension W) of every runtime surface anelm emits. The hardware needs W ≥ 32
/// on runtime inputs (`ane-hardware.md` §3.8).
pub const LANES: usize = 32;

/// f32 → fp16, round to nearest even (overflow gives ±inf, NaN stays NaN).
pub fn f32_to_fp16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// fp16 → f32 (exact).
pub fn fp16_to_f32(h: f16) -> f32 {
    h.to_f32()
}

/// A dense fp16 tensor `[1, channels, 1, lanes]`, as the IOSurface holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Surface {
    channels: usize,
    lanes: usize,
    data: Vec<f16>,
}

impl Surface {
    /// A zeroed `[1, channels, 1, 32]` surface.
    pub fn new(channels: usize) -> Self {
        Surface::with_lanes(channels, LANES)
    }

    /// A zeroed `[1, channels, 1, lanes]` surface (for programs declaring W other than 32).
    pub fn with_lanes(channels: usize, lanes: usize) -> Self {
        Surface {
            channels,
            lanes,
            data: vec![f16::ZERO; channels.saturating_mul(lanes)],
        }
    }

    /// A surface from raw halfwords in `c·lanes + lane` order.
    pub fn from_halves(channels: usize, lanes: usize, data: Vec<f16>) -> Result<Self, SurfaceError> {
        if Some(data.len()) != channels.checked_mul(lanes) {
            return Err(SurfaceError::Length {
                expected: channels.saturating_mul(lanes),
                found: data.len(),
                what: "halfwords",
            });
        }
        Ok(Surface { channels, lanes, data })
    }

    /// A surface from little-endian bytes (what an IOSurface holds): `channels·lanes·2` bytes.
    pub fn from_bytes(channels: usize, lanes: usize, bytes: &[u8]) -> Result<Self, SurfaceError> {
        let n = channels.saturating_mul(lanes);
        if Some(bytes.len()) != n.checked_mul(2) {
            return Err(SurfaceError::Length {
                expected: n.saturating_mul(2),
                found: bytes.len(),
                what: "bytes",
            });
        }
        let data = bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok(Surface { channels, lanes, data })
    }

    /// Pack up to `lanes` vectors of `channels` values each: vector b goes to lane b (rounded to
    /// nearest even), lanes past `vectors.len()` are zero.
    pub fn pack(channels: usize, vectors: &[&[f32]]) -> Result<Self, SurfaceError> {
        let mut s = Surface::new(channels);
        if vectors.len() > s.lanes {
            return Err(SurfaceError::TooManyLanes {
                requested: vectors.len(),
                lanes: s.lanes,
            });
        }
        for (lane, v) in vectors.iter().enumerate() {
            s.write_lane(lane, v)?;
        }
        Ok(s)
    }

    /// The first `n` lanes as f32 vectors of `channels` values each.
    pub fn unpack(&self, n: usize) -> Result<Vec<Vec<f32>>, SurfaceError> {
        if n > self.lanes {
            return Err(SurfaceError::TooManyLanes {
                requested: n,
                lanes: self.lanes,
            });
        }
        (0..n).map(|lane| self.read_lane(lane)).collect()
    }

    /// Channels (C).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Lanes (W).
    pub fn lanes(&self) -> usize {
        self.lanes
    }

    /// Size in bytes (`C × W × 2`), the IOSurface allocation.
    pub fn byte_len(&self) -> usize {
        self.data.len() * 2
    }

    /// Halfwords in `c·W + lane` order.
    pub fn halves(&self) -> &[f16] {
        &self.data
    }

    /// Mutable halfwords in `c·W + lane` order.
    pub fn halves_mut(&mut self) -> &mut [f16] {
        &mut self.data
    }

    /// Little-endian bytes, as written to an IOSurface.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.data.iter().flat_map(|h| h.to_le_bytes()).collect()
    }

    /// Halfword index of (c, lane).
    pub fn index(&self, c: usize, lane: usize) -> Result<usize, SurfaceError> {
        if c >= self.channels || lane >= self.lanes {
            return Err(SurfaceError::OutOfRange {
                channel: c,
                lane,
                channels: self.channels,
                lanes: self.lanes,
            });
        }
        Ok(c * self.lanes + lane)
    }

    /// Element (c, lane) as f32.
    pub fn get(&self, c: usize, lane: usize) -> Result<f32, SurfaceError> {
        Ok(self.data[self.index(c, lane)?].to_f32())
    }

    /// Set element (c, lane), rounding to nearest even.
    pub fn set(&mut self, c: usize, lane: usize, v: f32) -> Result<(), SurfaceError> {
        let i = self.index(c, lane)?;
        self.data[i] = f32_to_fp16(v);
        Ok(())
    }

    /// Write one vector of exactly `channels` values into `lane` (round to nearest even).
    pub fn write_lane(&mut self, lane: usize, v: &[f32]) -> Result<(), SurfaceError> {
        if lane >= self.lanes {
            return Err(SurfaceError::TooManyLanes {
                requested: lane + 1,
                lanes: self.lanes,
            });
        }
        if v.len() != self.channels {
            return Err(SurfaceError::Length {
                expected: self.channels,
                found: v.len(),
                what: "values in a lane",
            });
        }
        for (c, &x) in v.iter().enumerate() {
            self.data[c * self.lanes + lane] = f32_to_fp16(x);
        }
        Ok(())
    }

    /// Read one lane as `channels` f32 values.
    pub fn read_lane(&self, lane: usize) -> Result<Vec<f32>, SurfaceError> {
        if lane >= self.lanes {
            return Err(SurfaceError::TooManyLanes {
                requested: lane + 1,
                lanes: self.lanes,
            });
        }
        Ok((0..self.channels)
            .map(|c| self.data[c * self.lanes + lane].to_f32())
            .collect())
    }

    /// Copy channels `[0, src.channels())` of every lane of `src` into this surface starting at
    /// channel `at` (how the chunked FFN packs x ‖ accumulator into one input).
    pub fn copy_channels_from(&mut self, at: usize, src: &Surface) -> Result<(), SurfaceError> {
        if src.lanes != self.lanes || at.checked_add(src.channels).is_none_or(|end| end > self.channels) {
            return Err(SurfaceError::Length {
                expected: self.channels.saturating_sub(at),
                found: src.channels,
                what: "channels to copy (lanes must match too)",
            });
        }
        let start = at * self.lanes;
        self.data[start..start + src.data.len()].copy_from_slice(&src.data);
        Ok(())
    }

    /// Set every element to zero.
    pub fn clear(&mut self) {
        self.data.fill(f16::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_channel_major_lane_minor() {
        let a = [1.0f32, 2.0, 3.0];
        let b = [-1.0f32, -2.0, -3.0];
        let s = Surface::pack(3, &[&a, &b]).unwrap();
        assert_eq!(s.byte_len(), 3 * 32 * 2);
        assert_eq!(s.halves()[32].to_f32(), 2.0);
        assert_eq!(s.halves()[2 * 32 + 1].to_f32(), -3.0);
        assert_eq!(s.halves()[2], f16::ZERO);
        assert_eq!(s.unpack(2).unwrap(), vec![a.to_vec(), b.to_vec()]);
        let bytes = s.to_bytes();
        assert_eq!(&bytes[64..66], &f16::from_f32(2.0).to_le_bytes());
        assert_eq!(Surface::from_bytes(3, 32, &bytes).unwrap(), s);
    }

    #[test]
    fn rounds_to_nearest_even() {
        // 1 + 2^-11 is exactly halfway between 1 and 1 + 2^-10: ties go to the even mantissa (1).
        let tie = 1.0 + f32::powi(2.0, -11);
        assert_eq!(f32_to_fp16(tie).to_f32(), 1.0);
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even): rounds up.
        let tie_up = 1.0 + 3.0 * f32::powi(2.0, -11);
        assert_eq!(f32_to_fp16(tie_up).to_f32(), 1.0 + f32::powi(2.0, -9));
        // Just above a tie rounds up; truncation would not.
        assert_eq!(f32_to_fp16(1.000_49).to_f32(), 1.0 + f32::powi(2.0, -10));
        assert_eq!(f32_to_fp16(70000.0).to_f32(), f32::INFINITY);
    }

    #[test]
    fn refuses_bad_shapes() {
        assert!(Surface::pack(2, &[&[1.0]]).is_err());
        let v = [0.0f32; 2];
        let many: Vec<&[f32]> = (0..33).map(|_| &v[..]).collect();
        assert!(Surface::pack(2, &many).is_err());
        let s = Surface::new(2);
        assert!(s.read_lane(32).is_err());
        assert!(s.get(2, 0).is_err());
        assert!(Surface::from_bytes(2, 32, &[0; 10]).is_err());
    }
}
