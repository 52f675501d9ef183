//! The seam the engine loads weights through, for both GGUF files and
//! safetensors directories.

use anelm_kernels::WeightFormat;

use crate::error::ModelError;

/// A borrowed view of one stored tensor.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    /// The tensor's name in its file.
    pub name: &'a str,
    /// The stored element / block format.
    pub format: WeightFormat,
    /// Dimensions outermost first, like PyTorch: a matrix is `[rows, cols]`.
    /// For GGUF this is the ggml `ne` order reversed.
    pub shape: Vec<usize>,
    /// The raw stored bytes (not necessarily aligned in memory).
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements (product of `shape`; 1 for a scalar).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A source of named tensors, implemented by [`crate::gguf::GgufFile`] and
/// [`crate::safetensors_dir::SafetensorsDir`].
pub trait TensorStore: Send + Sync {
    /// The tensor called `name`; `MissingTensor` if absent, `UnsupportedFormat`
    /// if it is stored in a format anelm cannot run.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError>;

    /// Whether a tensor called `name` exists (whatever its format).
    fn contains(&self, name: &str) -> bool;

    /// Names of all tensors (file order for GGUF, sorted for safetensors).
    fn tensor_names(&self) -> Vec<&str>;

    /// A hint that `bytes` (a tensor's data from [`TensorStore::tensor`]) will not be read for a
    /// while, e.g. after a backend copied them into its own layout: a memory-mapped store hands
    /// the pages back to the page cache (they are read from the file again if ever touched), so
    /// the process does not hold the weights twice. Reads stay valid; the default does nothing.
    fn release(&self, _bytes: &[u8]) {}

    /// Copy `bytes` (part of a tensor's data from [`TensorStore::tensor`]) into `out`, of the
    /// same length, without making the pages resident: a memory-mapped store reads the file at
    /// that offset, so a sparse reader (one embedding row per token) does not fault ranges of
    /// released pages back into the process. The default copies from memory.
    fn read_into(&self, bytes: &[u8], out: &mut [u8]) {
        out.copy_from_slice(bytes);
    }
}
