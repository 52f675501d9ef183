//! Giving the resident pages of part of a read-only file mapping back to the page cache
//! (`TensorStore::release` of the memory-mapped stores).

/// How far beyond a released range the pages are also dropped: twice Linux's default
/// fault-around window.
#[cfg(unix)]
const RELEASE_MARGIN: usize = 128 << 10;

/// Drop the resident pages of `bytes` (and of [`RELEASE_MARGIN`] either side) from `map`, when
/// `bytes` lies inside it; otherwise, or where the call fails, nothing happens. Reads stay valid:
/// touched again, the pages are read from the file.
pub(crate) fn release(map: &memmap2::Mmap, bytes: &[u8]) {
    #[cfg(unix)]
    {
        let base = map.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        if start >= base && start + bytes.len() <= base + map.len() && !bytes.is_empty() {
            // Linux maps up to 64 KiB of cached pages around each faulting one ("fault-around"),
            // so reading one tensor also mapped the edges of its neighbours; give those back too
            // (a neighbour still in use just faults them in again).
            let from = (start - base).saturating_sub(RELEASE_MARGIN);
            let to = (start - base + bytes.len() + RELEASE_MARGIN).min(map.len());
            // SAFETY: a read-only file mapping: MADV_DONTNEED drops the resident pages and the
            // next access reads the same bytes from the file again, so every live borrow of the
            // mapping keeps seeing the same data. A failure only leaves pages resident.
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, from, to - from) };
        }
    }
    #[cfg(not(unix))]
    let _ = (map, bytes);
}
