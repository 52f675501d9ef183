//! Errors of the numeric kernels: a caller's shape or size mistake, or memory the system would
//! not give; never a panic.

/// What a kernel rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A row length is not a whole number of blocks.
    #[error("{format}: {elems} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        /// Format name.
        format: &'static str,
        /// Elements asked for.
        elems: usize,
        /// Block size of the format.
        block: usize,
    },
    /// A buffer has the wrong length.
    #[error("{what}: expected {expected} {unit}, got {got}")]
    Size {
        /// Which buffer.
        what: &'static str,
        /// Length required.
        expected: usize,
        /// Length given.
        got: usize,
        /// Unit of the lengths.
        unit: &'static str,
    },
    /// Activations prepared for another weight format or width.
    #[error("activations were quantised for {prepared_for} × {prepared_cols} columns, not {wanted} × {wanted_cols}")]
    ActivationMismatch {
        /// Format the activations were prepared for.
        prepared_for: &'static str,
        /// Their width.
        prepared_cols: usize,
        /// Format of the weights.
        wanted: &'static str,
        /// Width of the weights.
        wanted_cols: usize,
    },
    /// A size computation overflowed.
    #[error("size overflow")]
    Overflow,
    /// The system refused memory for weights (the message says how much and why).
    #[error("{0}")]
    OutOfMemory(String),
    /// The requested instruction set does not run on this CPU.
    #[error("the {isa} kernels do not run on this CPU (use Isa::best())")]
    IsaUnavailable {
        /// Its name.
        isa: &'static str,
    },
    /// A packed matrix's group layout has no kernel on the requested instruction set.
    #[error("a matrix packed in groups of {group_rows} rows runs on the avx2+vnni (AVX-512) kernels only, not {isa}")]
    PackedLayout {
        /// Rows per group of the matrix.
        group_rows: usize,
        /// The instruction set asked for.
        isa: &'static str,
    },
}

pub(crate) fn check_len(
    what: &'static str,
    expected: usize,
    got: usize,
    unit: &'static str,
) -> Result<(), KernelError> {
    if expected == got {
        Ok(())
    } else {
        Err(KernelError::Size {
            what,
            expected,
            got,
            unit,
        })
    }
}
