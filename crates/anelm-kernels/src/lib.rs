//! CPU numerics: tensor formats, quantisation blocks, dequantisation and dot/matmul.
