//! `StoredMatrix`: a weight matrix kept in its file's format (mmap'd), with its shape, owned
//! together with the store that holds its bytes so kernels can outlive the loader's borrows.

use std::sync::Arc;

use anelm_kernels::WeightFormat;
use anelm_model::tensor_store::TensorStore;

use crate::error::{EngineError, Result, check_matrix_shape};

/// A row-major matrix `[rows, cols]` in its stored format.
pub struct StoredMatrix {
    _owner: Arc<dyn TensorStore>,
    ptr: *const u8,
    len: usize,
    /// Storage format of the rows.
    pub format: WeightFormat,
    /// Output channels.
    pub rows: usize,
    /// Input channels.
    pub cols: usize,
    /// Tensor name in the store.
    pub name: String,
}

// SAFETY: `ptr..ptr+len` points into the tensor bytes of `_owner`, which every `TensorStore`
// (GgufFile, SafetensorsDir) keeps in a memory map or heap buffer that is immutable and never
// moves while the store lives; the Arc keeps the store alive as long as this value.
unsafe impl Send for StoredMatrix {}
// SAFETY: the bytes are only ever read (see `Send` above).
unsafe impl Sync for StoredMatrix {}

impl StoredMatrix {
    /// Look a 2-D tensor up; a 1-D tensor is taken as one row.
    pub fn load(store: &Arc<dyn TensorStore>, name: &str) -> Result<Self> {
        let view = store.tensor(name)?;
        let (rows, cols) = match view.shape.as_slice() {
            [r, c] => (*r, *c),
            [c] => (1, *c),
            other => {
                return Err(EngineError::Config(format!(
                    "tensor '{name}' has {} dimensions, expected a matrix",
                    other.len()
                )));
            }
        };
        let expected = view.format.row_bytes(cols)?.checked_mul(rows);
        if expected != Some(view.data.len()) {
            return Err(EngineError::Config(format!(
                "tensor '{name}': {} bytes stored, but {rows}×{cols} {} needs {:?}",
                view.data.len(),
                view.format.name(),
                expected
            )));
        }
        Ok(Self {
            ptr: view.data.as_ptr(),
            len: view.data.len(),
            format: view.format,
            rows,
            cols,
            name: name.to_string(),
            _owner: Arc::clone(store),
        })
    }

    /// The stored bytes of the whole matrix.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: see the `Send` impl: the region is valid, immutable and alive while `self` is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Tell the store that `part` of this matrix's bytes will not be read for a while (a backend
    /// keeps its own copy): a memory-mapped file gives the pages back, and re-reads them if they
    /// are touched again.
    pub fn release_pages(&self, part: &[u8]) {
        self._owner.release(part);
    }

    /// The stored bytes of one row.
    pub fn row_bytes(&self, row: usize) -> Option<&[u8]> {
        let rb = self.len / self.rows.max(1);
        self.bytes().get(row * rb..(row + 1) * rb)
    }

    /// Copy row `row`'s stored bytes into `buf` through the store's positional read (see
    /// `TensorStore::read_into`): for sparse lookups such as embeddings, whose pages a packed
    /// copy already released. `None` when `row` is out of range.
    pub fn read_row<'b>(&self, row: usize, buf: &'b mut Vec<u8>) -> Option<&'b [u8]> {
        let src = self.row_bytes(row)?;
        buf.resize(src.len(), 0);
        self._owner.read_into(src, buf);
        Some(buf)
    }

    /// Require a shape, naming the tensor when it differs.
    pub fn expect_shape(&self, rows: usize, cols: usize) -> Result<()> {
        check_matrix_shape(&self.name, (self.rows, self.cols), (rows, cols))
    }

    /// Decode the whole tensor to f32 (only for small tensors such as norm weights). The caller
    /// keeps the copy, so the stored pages are released.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, dst) in out.chunks_mut(self.cols.max(1)).enumerate() {
            let src = self.row_bytes(r).unwrap_or(&[]);
            anelm_kernels::dequantize_row(self.format, src, dst)?;
        }
        self.release_pages(self.bytes());
        Ok(out)
    }
}
