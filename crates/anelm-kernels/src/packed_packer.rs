//! Building a [`crate::packed::PackedMatrix`]'s bytes from row-major ones, a window of whole
//! row groups at a time: the same loop serves a matrix read from a file (each finished window's
//! source pages can be given back) and one whose rows are made as packing goes (load-time
//! quantisation), so neither needs the whole row-major matrix and its packed copy at once.

use crate::error::KernelError;
use crate::format::WeightFormat;
use crate::packed::{WIDE_GROUP_ROWS, has_wide_kernel, kernel_available};
use crate::weight_memory::WeightBytes;

/// About how many row-major source bytes one window holds.
const WINDOW_BYTES: usize = 1 << 20;

/// The packed bytes of a matrix being filled in, group by group.
pub(crate) struct Packer {
    fmt: WeightFormat,
    /// Rows per interleaved group.
    pub(crate) group_rows: usize,
    /// Groups in the matrix.
    pub(crate) groups: usize,
    /// Row-major source bytes of one group.
    pub(crate) group_src: usize,
    /// Groups per source window (at least one).
    pub(crate) groups_per_window: usize,
    /// Blocks per row.
    blocks: usize,
    /// Stored bytes of one row.
    row_bytes: usize,
    /// Packed bytes of one (group, block).
    group_block: usize,
    data: WeightBytes,
}

impl Packer {
    /// A zeroed packed matrix for `rows × cols` of `fmt` in groups of `group_rows`, when this CPU
    /// has a kernel for it and the rows divide into groups; `Ok(None)` otherwise.
    pub(crate) fn new(
        fmt: WeightFormat,
        rows: usize,
        cols: usize,
        group_rows: usize,
    ) -> Result<Option<Self>, KernelError> {
        let Some(row_block) = crate::packed_layout::row_block_bytes(fmt) else {
            return Ok(None);
        };
        if group_rows == 0 || !rows.is_multiple_of(group_rows) || rows == 0 || !kernel_available() {
            return Ok(None);
        }
        if group_rows == WIDE_GROUP_ROWS && !has_wide_kernel(fmt) {
            return Ok(None);
        }
        // A layout x86 has kernels for is not necessarily one the NEON kernels read.
        #[cfg(target_arch = "aarch64")]
        if !crate::packed_neon::serves(fmt) {
            return Ok(None);
        }
        let row_bytes = fmt.row_bytes(cols)?;
        let blocks = cols / fmt.block_elems();
        let groups = rows / group_rows;
        let group_block = group_rows * row_block;
        let total = groups
            .checked_mul(blocks)
            .and_then(|n| n.checked_mul(group_block))
            .ok_or(KernelError::Overflow)?;
        let group_src = group_rows.checked_mul(row_bytes).ok_or(KernelError::Overflow)?;
        Ok(Some(Self {
            fmt,
            group_rows,
            groups,
            group_src,
            groups_per_window: WINDOW_BYTES / group_src.max(1) + 1,
            blocks,
            row_bytes,
            group_block,
            data: WeightBytes::zeroed(total)?,
        }))
    }

    /// Pack the groups whose row-major bytes are `src` (whole groups), the first being `first`.
    pub(crate) fn pack_groups(&mut self, first: usize, src: &[u8]) {
        let (rb, nb, gb) = (self.row_bytes, self.blocks, self.group_block);
        let mut rows_of_group: Vec<&[u8]> = Vec::with_capacity(self.group_rows);
        for (i, group) in src.chunks_exact(self.group_src).enumerate() {
            let g = first + i;
            rows_of_group.clear();
            rows_of_group.extend(group.chunks_exact(rb));
            for b in 0..nb {
                let dst = &mut self.data[(g * nb + b) * gb..(g * nb + b + 1) * gb];
                // The wide Q8_0 kernel reads w + 128 as unsigned (see its docs).
                crate::packed_layout::pack_block(self.fmt, &rows_of_group, b, dst, self.group_rows == WIDE_GROUP_ROWS);
            }
        }
    }

    /// The packed bytes.
    pub(crate) fn finish(self) -> WeightBytes {
        self.data
    }
}
