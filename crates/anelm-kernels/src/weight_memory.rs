//! Memory for repacked weights: large anonymous mappings, advised for transparent huge pages on
//! Linux, that many matrices share back to back.
//!
//! A decode step streams every weight once. With 4 KiB pages that stream crosses a page (and a
//! TLB entry, and a hardware-prefetch boundary) every 4 KiB; a matrix in its own heap allocation
//! (69–553 KB for SmolLM2) can never sit in a 2 MiB page. Packing the matrices one after another
//! into 2 MiB-aligned regions of a shared mapping lets the kernel back them with huge pages and
//! makes a forward pass's weights one mostly contiguous stream (measured in
//! `docs/field-guide.md`: +11–13 % single-stream decode on the 2-core EPYC VM).
//!
//! A mapping is freed when the last matrix placed in it is dropped. Untouched parts of a
//! mapping are address space only: resident memory grows with what is written, rounded up to
//! one huge page per mapping at most.

use std::sync::{Arc, Mutex};

use crate::error::KernelError;

/// Address space reserved per shared mapping; a larger request gets a mapping of its own.
const REGION: usize = 32 << 20;

/// Huge-page size (x86-64 and most aarch64 Linux kernels); also the alignment of a region's
/// first allocation.
const HUGE_PAGE: usize = 2 << 20;

/// Alignment of every allocation inside a region (a cache line, so no two matrices share one).
const ALIGN: usize = 64;

/// One anonymous mapping and the base address writes go through.
struct Region {
    map: memmap2::MmapMut,
    /// `map`'s first byte, taken through `as_mut_ptr` once, so writes into disjoint allocations
    /// do not need `&mut` to the whole mapping.
    base: *mut u8,
}

// SAFETY: the mapping is plain memory owned by `map`; `base` only addresses it, and every
// allocation hands out a disjoint range of it (see `WeightBytes::zeroed`).
unsafe impl Send for Region {}
// SAFETY: see `Send`; after its allocation is filled, a range is only read.
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> Result<Self, KernelError> {
        let mut map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|e| KernelError::OutOfMemory(format!("could not map {len} bytes for packed weights: {e}")))?;
        #[cfg(target_os = "linux")]
        {
            // A hint: with transparent huge pages off (`never`) the call fails, and 4 KiB pages
            // serve the same bytes.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let base = map.as_mut_ptr();
        Ok(Self { map, base })
    }
}

/// A filled-once byte range in a shared mapping (the storage of a `PackedMatrix`).
pub struct WeightBytes {
    region: Arc<Region>,
    offset: usize,
    len: usize,
}

impl WeightBytes {
    /// `len` zeroed bytes, placed after the previous allocation when they fit in its mapping.
    pub fn zeroed(len: usize) -> Result<Self, KernelError> {
        static CURRENT: Mutex<Option<(Arc<Region>, usize)>> = Mutex::new(None);
        let mut current = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((region, used)) = current.as_mut() {
            let at = used.next_multiple_of(ALIGN);
            if at.checked_add(len).is_some_and(|end| end <= region.map.len()) {
                *used = at + len;
                return Ok(Self {
                    region: region.clone(),
                    offset: at,
                    len,
                });
            }
        }
        // A new mapping, with room to start on a huge-page boundary.
        let size = len
            .checked_add(HUGE_PAGE)
            .ok_or(KernelError::Overflow)?
            .max(REGION)
            .next_multiple_of(HUGE_PAGE);
        let region = Arc::new(Region::new(size)?);
        let at = (region.base as usize).next_multiple_of(HUGE_PAGE) - region.base as usize;
        if len > REGION / 2 {
            // A matrix this large fills its mapping; keep the next ones in the open region.
            return Ok(Self {
                region,
                offset: at,
                len,
            });
        }
        *current = Some((region.clone(), at + len));
        Ok(Self {
            region,
            offset: at,
            len,
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `offset + len ≤ map.len()` (checked in `zeroed`); the mapping lives while
        // `region` does; no `&mut` to this range exists while `&self` is borrowed.
        unsafe { std::slice::from_raw_parts(self.region.base.add(self.offset), self.len) }
    }

    /// The bytes, for filling.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; this range belongs to this value alone (no other allocation
        // overlaps it), and `&mut self` excludes every other borrow of it.
        unsafe { std::slice::from_raw_parts_mut(self.region.base.add(self.offset), self.len) }
    }
}

impl std::ops::Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for WeightBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Clone for WeightBytes {
    /// A copy in fresh weight memory. Panics only when the system refuses the memory (where a
    /// `Vec` clone would abort).
    fn clone(&self) -> Self {
        match Self::zeroed(self.len) {
            Ok(mut copy) => {
                copy.copy_from_slice(self);
                copy
            }
            Err(e) => panic!("could not copy packed weights: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_disjoint_aligned_and_zeroed() {
        let mut a = WeightBytes::zeroed(1000).expect("a");
        let mut b = WeightBytes::zeroed(3).expect("b");
        let big = WeightBytes::zeroed(REGION).expect("big");
        let c = WeightBytes::zeroed(5000).expect("c");
        for w in [&a, &b, &big, &c] {
            assert_eq!(w.as_ptr() as usize % ALIGN, 0);
            assert!(w.iter().all(|&x| x == 0));
        }
        assert_eq!(
            big.as_ptr() as usize % HUGE_PAGE,
            0,
            "a region's first allocation starts a huge page"
        );
        a.fill(1);
        b.fill(2);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        let ranges = [&a, &b, &big, &c].map(|w| (w.as_ptr() as usize, w.as_ptr() as usize + w.len()));
        for (i, x) in ranges.iter().enumerate() {
            for y in &ranges[i + 1..] {
                assert!(x.1 <= y.0 || y.1 <= x.0, "{x:?} overlaps {y:?}");
            }
        }
        let copy = a.clone();
        assert_eq!(&copy[..], &a[..]);
        assert_ne!(copy.as_ptr(), a.as_ptr());
    }

    #[test]
    fn empty_allocations_work() {
        let e = WeightBytes::zeroed(0).expect("empty");
        assert!(e.is_empty());
    }
}
