//! MIL programs for Apple's Neural Engine: an IR, the exact text dialect the ANE compiler
//! accepts (printer and parser), and the weight blob (BLOBFILE) container.
//!
//! anelm lowers each kernel to a MIL program (text) plus one weight file per tensor. The
//! real ANE receives the text and the blob bytes; so does the emulator, which parses them
//! back with [`parse_program`] and validates blobs with [`read_blob`]. Both directions live
//! here so that the two paths agree byte for byte.
//!
//! ```
//! use anelm_mil::{FunctionBuilder, Opset, Program, TensorType};
//! let mut f = FunctionBuilder::new("main", Opset::Ios16);
//! let x = f.input("x", TensorType::surface(64, 32)).unwrap();
//! let w = f.blob("W", TensorType::fp16([128, 64, 1, 1]), "@model_path/weights/weight.bin").unwrap();
//! let y = f.linear("y", &x, &w).unwrap();
//! f.output(&y).unwrap();
//! let text = Program::new(vec![f.finish().unwrap()]).to_string();
//! assert!(text.starts_with("program(1.0)\n"));
//! assert_eq!(anelm_mil::parse_program(&text).unwrap().to_string(), text);
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod blob;
mod builder;
mod check;
mod error;
mod infer;
mod ir;
mod lexer;
mod literal;
mod parser;
mod printer;
mod types;
mod weights;

pub use blob::{
    BLOB_MAGIC, BlobData, CHUNK_HEADER_LEN, DATA_OFFSET, FILE_HEADER_LEN, WeightBlob, read_blob, write_blob,
    write_fp16_blob, write_int8_blob,
};
pub use builder::{BLOB_OFFSET, ConvParams, FunctionBuilder};
pub use check::is_identifier;
pub use error::{BlobError, BuildError, ParseError};
pub use ir::{
    Argument, BlobRef, COREMLC_VERSION, Function, OpKind, Operand, Opset, Program, ProgramVersion, Statement, Value,
};
pub use literal::{Literal, TensorData};
pub use parser::parse_program;
pub use printer::{print_literal, print_program, print_statement, print_type};
pub use types::{DType, TensorType};
pub use weights::WeightFiles;

/// Re-export of the fp16 type used for fp16 literals and payloads.
pub use half::f16;
