//! Host surfaces reused across dispatches, so that a decode step allocates and zeroes no
//! surface per dispatch (issue 38: the per-dispatch host cost is on the critical path).
//!
//! A surface taken for input remembers how many lanes its last user wrote; the next user writes
//! its own lanes and zeroes only the stale ones past them, so every dispatch sees exactly the
//! surface a fresh zeroed one would have given (bit-identical results, whatever the programs do
//! across lanes). Output surfaces are overwritten whole by the device and need no clearing.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use half::f16;

use crate::error::SurfaceError;
use crate::surface::{LANES, Surface};

/// Surfaces kept per channel count (a step's largest concurrent need is a few per kernel).
const KEEP_PER_SHAPE: usize = 4;

/// Bytes of idle surfaces kept in all (beyond this they are dropped, not pooled).
const KEEP_BYTES: usize = 64 << 20;

/// A pooled surface and the lanes its last writer filled (lanes at and past this are zero).
#[derive(Debug)]
pub(crate) struct Pooled {
    pub(crate) surface: Surface,
    written: usize,
}

impl Pooled {
    /// Lanes `start..start + n` of the lane-major `v` (`channels` per lane) into lanes `0..n`
    /// (round to nearest even); lanes `n..` zero, as in a fresh surface.
    pub(crate) fn pack(&mut self, v: &[f32], channels: usize, start: usize, n: usize) -> Result<(), SurfaceError> {
        for j in 0..n {
            let lane = start + j;
            self.surface.write_lane(j, &v[lane * channels..(lane + 1) * channels])?;
        }
        if self.written > n {
            let w = self.surface.lanes();
            for row in self.surface.halves_mut().chunks_exact_mut(w) {
                row[n..self.written].fill(f16::ZERO);
            }
        }
        self.written = n;
        Ok(())
    }

    /// Mark every lane written (after a whole-surface copy into it).
    pub(crate) fn mark_full(&mut self) {
        self.written = self.surface.lanes();
    }
}

#[derive(Default)]
struct Idle {
    by_channels: HashMap<usize, Vec<Pooled>>,
    bytes: usize,
}

static IDLE: Mutex<Option<Idle>> = Mutex::new(None);

fn idle() -> MutexGuard<'static, Option<Idle>> {
    IDLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `[1, channels, 1, 32]` surface: a pooled one when one is idle, else a fresh zeroed one.
pub(crate) fn take(channels: usize) -> Pooled {
    let reused = idle().as_mut().and_then(|i| {
        let s = i.by_channels.get_mut(&channels)?.pop()?;
        i.bytes -= s.surface.byte_len();
        Some(s)
    });
    reused.unwrap_or_else(|| Pooled {
        surface: Surface::new(channels),
        written: 0,
    })
}

/// Hand a surface back for reuse.
pub(crate) fn give(s: Pooled) {
    if s.surface.lanes() != LANES {
        return;
    }
    let mut g = idle();
    let i = g.get_or_insert_with(Idle::default);
    let bytes = s.surface.byte_len();
    let list = i.by_channels.entry(s.surface.channels()).or_default();
    if list.len() < KEEP_PER_SHAPE && i.bytes + bytes <= KEEP_BYTES {
        i.bytes += bytes;
        list.push(s);
    }
}

/// An output surface (its contents are overwritten by the device).
pub(crate) fn take_output(channels: usize) -> Pooled {
    let mut s = take(channels);
    s.mark_full();
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_surface_equals_a_fresh_one() {
        let channels = 3;
        let v: Vec<f32> = (0..channels * 40).map(|i| i as f32 * 0.5 + 1.0).collect();
        let mut s = take(channels);
        s.pack(&v, channels, 0, 32).unwrap();
        give(s);
        // Fewer lanes next time: the stale lanes are zero again, as in a fresh surface.
        let mut again = take(channels);
        again.pack(&v, channels, 5, 2).unwrap();
        let mut fresh = Surface::new(channels);
        for j in 0..2 {
            fresh.write_lane(j, &v[(5 + j) * channels..(6 + j) * channels]).unwrap();
        }
        assert_eq!(again.surface, fresh);
        give(again);
        let mut out = take_output(channels);
        out.surface.halves_mut().fill(f16::ONE);
        give(out);
        // A surface handed back after a full overwrite is cleared lane by lane on next use.
        let mut next = take(channels);
        next.pack(&v, channels, 0, 1).unwrap();
        let mut fresh = Surface::new(channels);
        fresh.write_lane(0, &v[..channels]).unwrap();
        assert_eq!(next.surface, fresh);
    }
}
