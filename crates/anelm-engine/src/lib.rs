//! The anelm engine: the Backend/Kernel seam, model forwards, sessions and sampling.

pub mod sampler;
