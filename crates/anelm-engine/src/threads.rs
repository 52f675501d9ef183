//! The engine's two thread pools, created in one place for every front end: the kernel pool
//! (`anelm_kernels::pool`, spinning workers for the matmuls, process-wide) and a rayon pool for
//! the remaining parallel loops (attention, per-lane work) that the caller installs around its
//! work.

use crate::error::{EngineError, Result};

/// Size the process-wide kernel pool to `threads` (the first caller in a process decides it)
/// and build a rayon pool of `threads` threads named `{name}-{i}`, to `install` around work.
pub fn start_pools(threads: usize, name: &'static str) -> Result<rayon::ThreadPool> {
    if threads == 0 {
        return Err(EngineError::InvalidRequest(
            "the thread count must be at least 1".into(),
        ));
    }
    anelm_kernels::pool::init_global(threads);
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .stack_size(8 << 20)
        .build()
        .map_err(|e| EngineError::InvalidRequest(format!("could not start the thread pool: {e}")))
}
