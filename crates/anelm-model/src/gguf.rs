//! GGUF reader (versions 2 and 3): metadata key/values, tensor directory and
//! memory-mapped tensor data.
//!
//! Every length, count and offset in the file is treated as hostile: counts are
//! checked against the bytes that remain before anything is allocated, sizes are
//! computed with checked arithmetic, and every tensor's data range is validated
//! when the file is opened, so that [`GgufFile::tensor_data`] can never read out
//! of bounds.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::path::Path;

use anelm_kernels::WeightFormat;

use crate::error::ModelError;
use crate::tensor_store::{TensorStore, TensorView};

/// The four magic bytes every GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";
/// Maximum number of tensor dimensions (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays inside arrays that is accepted (guards the stack).
const MAX_ARRAY_DEPTH: usize = 8;

// GGUF metadata value type ids.
const T_U8: u32 = 0;
const T_I8: u32 = 1;
const T_U16: u32 = 2;
const T_I16: u32 = 3;
const T_U32: u32 = 4;
const T_I32: u32 = 5;
const T_F32: u32 = 6;
const T_BOOL: u32 = 7;
const T_STRING: u32 = 8;
const T_ARRAY: u32 = 9;
const T_U64: u32 = 10;
const T_I64: u32 = 11;
const T_F64: u32 = 12;

/// One metadata value of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `float32`.
    F32(f32),
    /// `bool` (stored as one byte, 0 or 1).
    Bool(bool),
    /// UTF-8 string (invalid UTF-8 is replaced with U+FFFD).
    String(String),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float64`.
    F64(f64),
    /// A typed array.
    Array(GgufArray),
}

/// A GGUF array: all elements share one type, kept as a typed vector.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    /// `uint8` elements.
    U8(Vec<u8>),
    /// `int8` elements.
    I8(Vec<i8>),
    /// `uint16` elements.
    U16(Vec<u16>),
    /// `int16` elements.
    I16(Vec<i16>),
    /// `uint32` elements.
    U32(Vec<u32>),
    /// `int32` elements.
    I32(Vec<i32>),
    /// `float32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// `uint64` elements.
    U64(Vec<u64>),
    /// `int64` elements.
    I64(Vec<i64>),
    /// `float64` elements.
    F64(Vec<f64>),
    /// Arrays of arrays (each inner array has its own element type).
    Array(Vec<GgufArray>),
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    /// True if the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The integer elements as `i64`, or `None` if this is not an integer array
    /// or a `uint64` element does not fit.
    fn to_i64s(&self) -> Option<Vec<i64>> {
        fn conv<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            GgufArray::U8(v) => conv(v, |x| Some(i64::from(x))),
            GgufArray::I8(v) => conv(v, |x| Some(i64::from(x))),
            GgufArray::U16(v) => conv(v, |x| Some(i64::from(x))),
            GgufArray::I16(v) => conv(v, |x| Some(i64::from(x))),
            GgufArray::U32(v) => conv(v, |x| Some(i64::from(x))),
            GgufArray::I32(v) => conv(v, |x| Some(i64::from(x))),
            GgufArray::U64(v) => conv(v, |x| i64::try_from(x).ok()),
            GgufArray::I64(v) => Some(v.clone()),
            _ => None,
        }
    }
}

/// Directory entry of one tensor in a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml `ne` order: `dims[0]` is the contiguous (row) length.
    pub dims: Vec<u64>,
    /// The raw ggml type id.
    pub ggml_type: u32,
    /// The format anelm runs this type as; `None` for types we don't run.
    pub format: Option<WeightFormat>,
    /// Absolute byte offset of the tensor data in the file.
    pub offset: u64,
    /// Size of the tensor data in bytes (0 for a ggml type id unknown to this
    /// reader, whose size cannot be computed).
    pub size: u64,
}

impl GgufTensorInfo {
    /// Number of elements (product of `dims`; validated not to overflow at open).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Human-readable name of the ggml type (`Q4_K`, `IQ2_XS`, or `unknown ggml type 123`).
    pub fn type_name(&self) -> String {
        ggml_type_name(self.ggml_type)
    }
}

/// Block geometry of a ggml tensor type: (name, elements per block, bytes per block).
///
/// Covers every type id ggml has defined for GGUF files, including those anelm
/// does not run, so their data ranges can be validated too.
pub fn ggml_type_layout(ggml_type: u32) -> Option<(&'static str, u64, u64)> {
    Some(match ggml_type {
        0 => ("F32", 1, 4),
        1 => ("F16", 1, 2),
        2 => ("Q4_0", 32, 18),
        3 => ("Q4_1", 32, 20),
        6 => ("Q5_0", 32, 22),
        7 => ("Q5_1", 32, 24),
        8 => ("Q8_0", 32, 34),
        9 => ("Q8_1", 32, 36),
        10 => ("Q2_K", 256, 84),
        11 => ("Q3_K", 256, 110),
        12 => ("Q4_K", 256, 144),
        13 => ("Q5_K", 256, 176),
        14 => ("Q6_K", 256, 210),
        15 => ("Q8_K", 256, 292),
        16 => ("IQ2_XXS", 256, 66),
        17 => ("IQ2_XS", 256, 74),
        18 => ("IQ3_XXS", 256, 98),
        19 => ("IQ1_S", 256, 50),
        20 => ("IQ4_NL", 32, 18),
        21 => ("IQ3_S", 256, 110),
        22 => ("IQ2_S", 256, 82),
        23 => ("IQ4_XS", 256, 136),
        24 => ("I8", 1, 1),
        25 => ("I16", 1, 2),
        26 => ("I32", 1, 4),
        27 => ("I64", 1, 8),
        28 => ("F64", 1, 8),
        29 => ("IQ1_M", 256, 56),
        30 => ("BF16", 1, 2),
        34 => ("TQ1_0", 256, 54),
        35 => ("TQ2_0", 256, 66),
        39 => ("MXFP4", 32, 17),
        _ => return None,
    })
}

/// Name of a ggml type id for messages (`Q4_K`, or `unknown ggml type 123`).
pub fn ggml_type_name(ggml_type: u32) -> String {
    match ggml_type_layout(ggml_type) {
        Some((name, _, _)) => name.to_string(),
        None => format!("unknown ggml type {ggml_type}"),
    }
}

/// Where the bytes of an open file live.
enum Backing {
    /// The mapping, and the file for positional reads (`TensorStore::read_into`).
    Mapped(memmap2::Mmap, File),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped(m, _) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// An open, fully validated GGUF file.
///
/// Metadata and the tensor directory are parsed into memory; tensor data stays
/// in the memory map (or the owned buffer given to [`GgufFile::from_bytes`]).
pub struct GgufFile {
    backing: Backing,
    label: String,
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("file", &self.label)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps the file at `path` and parses and validates it.
    ///
    /// The file must not be modified while the returned value is alive.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let io_err = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let len = file.metadata().map_err(io_err)?.len();
        let backing = if len == 0 {
            // Mapping an empty file fails on some platforms; an empty buffer
            // gives the proper "truncated header" error instead.
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and we only ever hand out shared
            // slices of it. The documented requirement is that the file is not
            // truncated or modified by another process while mapped (as for
            // every mmap-based model loader).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
            Backing::Mapped(map, file)
        };
        Self::parse(backing, path.display().to_string())
    }

    /// Parses a GGUF file held in memory (for tests, fuzzing and embedded data).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, ModelError> {
        Self::parse(Backing::Owned(bytes), "in-memory GGUF".to_string())
    }

    fn parse(backing: Backing, label: String) -> Result<Self, ModelError> {
        let parsed = parse_layout(backing.bytes(), &label)?;
        let file = Self {
            backing,
            label,
            version: parsed.version,
            metadata: parsed.metadata,
            key_index: parsed.key_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
        };
        // The metadata (a vocabulary is megabytes of strings) now lives in owned values: its
        // mapped pages are not read again.
        let header_len = usize::try_from(file.data_start)
            .unwrap_or(0)
            .min(file.backing.bytes().len());
        file.release(&file.backing.bytes()[..header_len]);
        Ok(file)
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The path (or description) this file was opened from, for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// All metadata key/value pairs in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of a metadata key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        let &i = self.key_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        match self.get(key)? {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer value of any width or signedness, if it is non-negative.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        match *self.get(key)? {
            GgufValue::U8(v) => Some(u64::from(v)),
            GgufValue::U16(v) => Some(u64::from(v)),
            GgufValue::U32(v) => Some(u64::from(v)),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// An integer value that fits in `u32`.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get_u64(key).and_then(|v| u32::try_from(v).ok())
    }

    /// A float value (`F32`, `F64`, or an integer converted to `f32`).
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        match *self.get(key)? {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            GgufValue::U8(v) => Some(f32::from(v)),
            GgufValue::I8(v) => Some(f32::from(v)),
            GgufValue::U16(v) => Some(f32::from(v)),
            GgufValue::I16(v) => Some(f32::from(v)),
            GgufValue::U32(v) => Some(v as f32),
            GgufValue::I32(v) => Some(v as f32),
            GgufValue::U64(v) => Some(v as f32),
            GgufValue::I64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A boolean value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        match *self.get(key)? {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string array (e.g. `tokenizer.ggml.tokens`).
    pub fn get_string_array(&self, key: &str) -> Option<&[String]> {
        match self.get(key)? {
            GgufValue::Array(GgufArray::String(v)) => Some(v),
            _ => None,
        }
    }

    /// A boolean array (e.g. `qwen35.attention.recurrent_layers`).
    pub fn get_bool_array(&self, key: &str) -> Option<&[bool]> {
        match self.get(key)? {
            GgufValue::Array(GgufArray::Bool(v)) => Some(v),
            _ => None,
        }
    }

    /// A float array (`F32` or `F64` elements), as `f32`.
    pub fn get_f32_array(&self, key: &str) -> Option<Vec<f32>> {
        match self.get(key)? {
            GgufValue::Array(GgufArray::F32(v)) => Some(v.clone()),
            GgufValue::Array(GgufArray::F64(v)) => Some(v.iter().map(|&x| x as f32).collect()),
            _ => None,
        }
    }

    /// An integer array of any element type, if every element fits in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        match self.get(key)? {
            GgufValue::Array(a) => a.to_i64s()?.into_iter().map(|x| i32::try_from(x).ok()).collect(),
            _ => None,
        }
    }

    /// `general.architecture` (e.g. `llama`, `qwen3`).
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// Alignment of the tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset where the tensor data section starts.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The directory entry of a tensor.
    pub fn tensor_info(&self, name: &str) -> Option<&GgufTensorInfo> {
        let &i = self.tensor_index.get(name)?;
        self.tensors.get(i)
    }

    /// The raw bytes of a tensor of this file (range validated at open).
    ///
    /// An `info` that does not describe a range inside this file (e.g. one
    /// taken from another file) yields an empty slice rather than a panic.
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        let bytes = self.backing.bytes();
        let range = usize::try_from(info.offset).ok().and_then(|start| {
            let end = start.checked_add(usize::try_from(info.size).ok()?)?;
            Some(start..end)
        });
        range.and_then(|r| bytes.get(r)).unwrap_or(&[])
    }
}

impl TensorStore for GgufFile {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })?;
        let format = info.format.ok_or_else(|| ModelError::UnsupportedFormat {
            tensor: info.name.clone(),
            format: match ggml_type_layout(info.ggml_type) {
                Some((tname, _, _)) => format!("ggml type {tname} (id {})", info.ggml_type),
                None => format!("unknown ggml type id {}", info.ggml_type),
            },
        })?;
        let shape = info
            .dims
            .iter()
            .rev()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| ModelError::Invalid {
                file: self.label.clone(),
                what: format!(
                    "tensor `{}` has dimensions {:?} too large for this platform",
                    info.name, info.dims
                ),
            })?;
        Ok(TensorView {
            name: &info.name,
            format,
            shape,
            data: self.tensor_data(info),
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.tensor_index.contains_key(name)
    }

    fn tensor_names(&self) -> Vec<&str> {
        self.tensors.iter().map(|t| t.name.as_str()).collect()
    }

    fn release(&self, bytes: &[u8]) {
        if let Backing::Mapped(map, _) = &self.backing {
            crate::mapped_pages::release(map, bytes);
        }
    }

    fn read_into(&self, bytes: &[u8], out: &mut [u8]) {
        #[cfg(unix)]
        if let Backing::Mapped(map, file) = &self.backing {
            use std::os::unix::fs::FileExt;
            let (base, start) = (map.as_ptr() as usize, bytes.as_ptr() as usize);
            if start >= base
                && start + bytes.len() <= base + map.len()
                && out.len() == bytes.len()
                && file.read_exact_at(out, (start - base) as u64).is_ok()
            {
                return;
            }
        }
        // Not mapped, or the read failed: the mapping holds the same bytes.
        out.copy_from_slice(bytes);
    }
}

/// Everything parsed from a file except the bytes themselves.
struct Layout {
    version: u32,
    metadata: Vec<(String, GgufValue)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_start: u64,
}

/// A bounds-checked little-endian cursor whose errors carry the byte offset.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, at: usize, what: impl Into<String>) -> ModelError {
        ModelError::Malformed {
            file: self.file.to_string(),
            offset: at as u64,
            what: what.into(),
        }
    }

    fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let slice = self
            .pos
            .checked_add(n)
            .and_then(|end| self.buf.get(self.pos..end))
            .ok_or_else(|| {
                self.err(
                    self.pos,
                    format!(
                        "file ends while reading {what}: needs {n} bytes, only {} left",
                        self.remaining()
                    ),
                )
            })?;
        self.pos += n;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string's raw bytes: u64 length, then that many bytes.
    fn string_bytes(&mut self, what: &str) -> Result<&'a [u8], ModelError> {
        let at = self.pos;
        let len = self.u64(&format!("length of {what}"))?;
        let remaining = self.remaining();
        let len = usize::try_from(len).ok().filter(|&l| l <= remaining).ok_or_else(|| {
            self.err(
                at,
                format!("{what} claims {len} bytes but only {remaining} remain in the file"),
            )
        })?;
        self.take(len, what)
    }

    /// A string that must be valid UTF-8 (keys, tensor names).
    fn strict_string(&mut self, what: &str) -> Result<String, ModelError> {
        let at = self.pos;
        let bytes = self.string_bytes(what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| self.err(at, format!("{what} is not valid UTF-8 ({e})")))
    }

    /// A string value (invalid UTF-8 is replaced, as tokenizer vocabularies
    /// from some converters contain stray bytes).
    fn lossy_string(&mut self, what: &str) -> Result<String, ModelError> {
        let bytes = self.string_bytes(what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// `count` fixed-size elements of `size` bytes, decoded by `f`.
    fn fixed<T, const N: usize>(
        &mut self,
        count: usize,
        what: &str,
        f: impl Fn([u8; N]) -> T,
    ) -> Result<Vec<T>, ModelError> {
        let at = self.pos;
        let n_bytes = count
            .checked_mul(N)
            .ok_or_else(|| self.err(at, format!("{what}: {count} elements overflow the size")))?;
        let bytes = self.take(n_bytes, what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect())
    }

    fn bool_byte(&self, at: usize, b: u8, key: &str) -> Result<bool, ModelError> {
        match b {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(self.err(at, format!("bool value of `{key}` is {other}, but must be 0 or 1"))),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue, ModelError> {
        let at = self.pos;
        let what = format!("value of `{key}`");
        Ok(match ty {
            T_U8 => GgufValue::U8(u8::from_le_bytes(self.array(&what)?)),
            T_I8 => GgufValue::I8(i8::from_le_bytes(self.array(&what)?)),
            T_U16 => GgufValue::U16(u16::from_le_bytes(self.array(&what)?)),
            T_I16 => GgufValue::I16(i16::from_le_bytes(self.array(&what)?)),
            T_U32 => GgufValue::U32(u32::from_le_bytes(self.array(&what)?)),
            T_I32 => GgufValue::I32(i32::from_le_bytes(self.array(&what)?)),
            T_F32 => GgufValue::F32(f32::from_le_bytes(self.array(&what)?)),
            T_U64 => GgufValue::U64(u64::from_le_bytes(self.array(&what)?)),
            T_I64 => GgufValue::I64(i64::from_le_bytes(self.array(&what)?)),
            T_F64 => GgufValue::F64(f64::from_le_bytes(self.array(&what)?)),
            T_BOOL => {
                let [b] = self.array::<1>(&what)?;
                GgufValue::Bool(self.bool_byte(at, b, key)?)
            }
            T_STRING => GgufValue::String(self.lossy_string(&what)?),
            T_ARRAY => GgufValue::Array(self.array_value(key, depth)?),
            other => {
                return Err(self.err(
                    at.saturating_sub(4),
                    format!("`{key}` has unknown value type id {other} (valid: 0..=12)"),
                ));
            }
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<GgufArray, ModelError> {
        let at = self.pos;
        if depth >= MAX_ARRAY_DEPTH {
            return Err(self.err(at, format!("`{key}` nests arrays deeper than {MAX_ARRAY_DEPTH} levels")));
        }
        let elem_ty = self.u32(&format!("element type of array `{key}`"))?;
        let count_at = self.pos;
        let count = self.u64(&format!("length of array `{key}`"))?;
        // Smallest encoding of one element: checks the count against the
        // remaining bytes before anything is allocated.
        let min_size: u64 = match elem_ty {
            T_U8 | T_I8 | T_BOOL => 1,
            T_U16 | T_I16 => 2,
            T_U32 | T_I32 | T_F32 => 4,
            T_U64 | T_I64 | T_F64 | T_STRING => 8,
            T_ARRAY => 12,
            other => {
                return Err(self.err(
                    at,
                    format!("array `{key}` has unknown element type id {other} (valid: 0..=12)"),
                ));
            }
        };
        let remaining = self.remaining();
        let count = count
            .checked_mul(min_size)
            .filter(|&need| need <= remaining as u64)
            .and_then(|_| usize::try_from(count).ok())
            .ok_or_else(|| {
                self.err(
                    count_at,
                    format!(
                        "array `{key}` claims {count} elements (at least {min_size} bytes each) but only {remaining} bytes remain in the file"
                    ),
                )
            })?;
        let what = format!("elements of array `{key}`");
        Ok(match elem_ty {
            T_U8 => GgufArray::U8(self.fixed(count, &what, u8::from_le_bytes)?),
            T_I8 => GgufArray::I8(self.fixed(count, &what, i8::from_le_bytes)?),
            T_U16 => GgufArray::U16(self.fixed(count, &what, u16::from_le_bytes)?),
            T_I16 => GgufArray::I16(self.fixed(count, &what, i16::from_le_bytes)?),
            T_U32 => GgufArray::U32(self.fixed(count, &what, u32::from_le_bytes)?),
            T_I32 => GgufArray::I32(self.fixed(count, &what, i32::from_le_bytes)?),
            T_F32 => GgufArray::F32(self.fixed(count, &what, f32::from_le_bytes)?),
            T_U64 => GgufArray::U64(self.fixed(count, &what, u64::from_le_bytes)?),
            T_I64 => GgufArray::I64(self.fixed(count, &what, i64::from_le_bytes)?),
            T_F64 => GgufArray::F64(self.fixed(count, &what, f64::from_le_bytes)?),
            T_BOOL => {
                let start = self.pos;
                let raw = self.fixed(count, &what, |[b]: [u8; 1]| b)?;
                let mut out = Vec::with_capacity(raw.len());
                for (i, b) in raw.into_iter().enumerate() {
                    out.push(self.bool_byte(start + i, b, key)?);
                }
                GgufArray::Bool(out)
            }
            T_STRING => {
                let mut out = Vec::with_capacity(count);
                for i in 0..count {
                    out.push(self.lossy_string(&format!("element {i} of array `{key}`"))?);
                }
                GgufArray::String(out)
            }
            _ => {
                // T_ARRAY (other types were rejected above).
                let mut out = Vec::with_capacity(count);
                for _ in 0..count {
                    out.push(self.array_value(key, depth + 1)?);
                }
                GgufArray::Array(out)
            }
        })
    }
}

fn parse_layout(bytes: &[u8], label: &str) -> Result<Layout, ModelError> {
    let mut r = Reader {
        buf: bytes,
        pos: 0,
        file: label,
    };
    let magic = r.take(4, "the GGUF magic")?;
    if magic != MAGIC {
        return Err(r.err(
            0,
            format!("magic is {magic:02x?}, not \"GGUF\"; this is not a GGUF file"),
        ));
    }
    let version = r.u32("the version")?;
    if version == 1 {
        return Err(ModelError::UnsupportedVersion {
            file: label.to_string(),
            version,
        });
    }
    if version != 2 && version != 3 {
        return Err(r.err(
            4,
            format!(
                "version field is {version} ({version:#010x}); only 2 and 3 exist (a byte-swapped value means a big-endian file, which is not supported)"
            ),
        ));
    }
    let tensor_count_at = r.pos;
    let tensor_count = r.u64("the tensor count")?;
    let kv_count_at = r.pos;
    let kv_count = r.u64("the metadata key/value count")?;

    // Each key/value needs at least 8 (key length) + 4 (type) + 1 bytes, each
    // tensor info at least 8 + 4 + 4 + 8. Cap counts by what the file can hold.
    let check_count = |count: u64, min: u64, at: usize, what: &str| -> Result<usize, ModelError> {
        let remaining = r.remaining() as u64;
        count
            .checked_mul(min)
            .filter(|&need| need <= remaining)
            .and_then(|_| usize::try_from(count).ok())
            .ok_or_else(|| {
                r.err(
                    at,
                    format!("{what} is {count}, but only {remaining} bytes remain (at least {min} per entry)"),
                )
            })
    };
    let kv_count = check_count(kv_count, 13, kv_count_at, "the metadata key/value count")?;
    let tensor_count = check_count(tensor_count, 24, tensor_count_at, "the tensor count")?;

    let mut metadata = Vec::with_capacity(kv_count);
    let mut key_index = HashMap::with_capacity(kv_count);
    let mut alignment_at = 0usize;
    for i in 0..kv_count {
        let key_at = r.pos;
        let key = r.strict_string(&format!("metadata key {i}"))?;
        let ty = r.u32(&format!("value type of `{key}`"))?;
        if key == "general.alignment" {
            alignment_at = r.pos;
        }
        let value = r.value(ty, &key, 0)?;
        match key_index.entry(key.clone()) {
            Entry::Occupied(_) => {
                return Err(r.err(key_at, format!("metadata key `{key}` appears twice")));
            }
            Entry::Vacant(e) => {
                e.insert(metadata.len());
            }
        }
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment").and_then(|&i| metadata.get(i)) {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => {
            let a = match *v {
                GgufValue::U8(x) => Some(u64::from(x)),
                GgufValue::U16(x) => Some(u64::from(x)),
                GgufValue::U32(x) => Some(u64::from(x)),
                GgufValue::U64(x) => Some(x),
                GgufValue::I32(x) => u64::try_from(x).ok(),
                GgufValue::I64(x) => u64::try_from(x).ok(),
                _ => None,
            };
            match a {
                Some(a) if a.is_power_of_two() => a,
                _ => {
                    return Err(r.err(
                        alignment_at,
                        format!("general.alignment is {v:?}; it must be a nonzero power of two"),
                    ));
                }
            }
        }
    };

    struct Pending {
        info: GgufTensorInfo,
        rel_offset: u64,
        offset_at: usize,
        info_at: usize,
    }
    let mut pending = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let info_at = r.pos;
        let name = r.strict_string(&format!("name of tensor {i}"))?;
        let dims_at = r.pos;
        let n_dims = r.u32(&format!("n_dims of tensor `{name}`"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(r.err(
                dims_at,
                format!("tensor `{name}` has {n_dims} dimensions; at most {MAX_DIMS} are allowed"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(r.u64(&format!("dimension {d} of tensor `{name}`"))?);
        }
        let type_at = r.pos;
        let ggml_type = r.u32(&format!("type of tensor `{name}`"))?;
        let offset_at = r.pos;
        let rel_offset = r.u64(&format!("data offset of tensor `{name}`"))?;

        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                r.err(
                    dims_at,
                    format!("tensor `{name}` dimensions {dims:?} overflow the element count"),
                )
            })?;
        let size = match ggml_type_layout(ggml_type) {
            None => 0,
            Some((tname, block_elems, block_bytes)) => {
                let row = dims.first().copied().unwrap_or(1);
                if row % block_elems != 0 {
                    return Err(r.err(
                        type_at,
                        format!(
                            "tensor `{name}` is {tname} (blocks of {block_elems}) but its row length {row} is not a multiple of {block_elems}"
                        ),
                    ));
                }
                (n_elements / block_elems).checked_mul(block_bytes).ok_or_else(|| {
                    r.err(
                        dims_at,
                        format!("tensor `{name}` byte size overflows ({dims:?} as {tname})"),
                    )
                })?
            }
        };
        match tensor_index.entry(name.clone()) {
            Entry::Occupied(_) => {
                return Err(r.err(info_at, format!("tensor `{name}` appears twice")));
            }
            Entry::Vacant(e) => {
                e.insert(pending.len());
            }
        }
        pending.push(Pending {
            info: GgufTensorInfo {
                name,
                dims,
                ggml_type,
                format: WeightFormat::from_ggml_type(ggml_type),
                offset: 0,
                size,
            },
            rel_offset,
            offset_at,
            info_at,
        });
    }

    let file_len = bytes.len() as u64;
    let header_end = r.pos as u64;
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| r.err(r.pos, "data section start overflows"))?;
    if !pending.is_empty() && data_start > file_len {
        return Err(r.err(
            r.pos,
            format!(
                "the tensor data section should start at byte {data_start} (aligned to {alignment}) but the file has only {file_len} bytes"
            ),
        ));
    }

    let mut tensors = Vec::with_capacity(pending.len());
    for p in pending {
        let mut info = p.info;
        if p.rel_offset % alignment != 0 {
            return Err(r.err(
                p.offset_at,
                format!(
                    "tensor `{}` data offset {} is not a multiple of the alignment {alignment}",
                    info.name, p.rel_offset
                ),
            ));
        }
        let start = data_start.checked_add(p.rel_offset);
        let end = start.and_then(|s| s.checked_add(info.size));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => info.offset = s,
            _ => {
                return Err(r.err(
                    p.offset_at,
                    format!(
                        "tensor `{}` (described at byte {}) has data at {}+{} with {} bytes, past the end of the {file_len}-byte file",
                        info.name, p.info_at, data_start, p.rel_offset, info.size
                    ),
                ));
            }
        }
        tensors.push(info);
    }

    Ok(Layout {
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minimal header: magic, version, counts.
    fn header(version: u32, tensors: u64, kvs: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(tensors.to_le_bytes());
        b.extend(kvs.to_le_bytes());
        b
    }

    fn push_str(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    }

    #[test]
    fn empty_file_parses() {
        let f = GgufFile::from_bytes(header(3, 0, 0)).unwrap();
        assert_eq!(f.version(), 3);
        assert!(f.metadata().is_empty());
        assert!(f.tensors().is_empty());
        assert_eq!(f.alignment(), DEFAULT_ALIGNMENT);
    }

    #[test]
    fn v1_is_rejected_by_version() {
        let e = GgufFile::from_bytes(header(1, 0, 0)).unwrap_err();
        assert!(matches!(e, ModelError::UnsupportedVersion { version: 1, .. }), "{e}");
    }

    #[test]
    fn bad_magic_names_offset_zero() {
        let mut b = header(3, 0, 0);
        b[0] = b'X';
        let e = GgufFile::from_bytes(b).unwrap_err();
        assert!(matches!(e, ModelError::Malformed { offset: 0, .. }), "{e}");
    }

    #[test]
    fn bool_must_be_zero_or_one() {
        let mut b = header(3, 0, 1);
        push_str(&mut b, "k");
        b.extend(T_BOOL.to_le_bytes());
        b.push(2);
        let e = GgufFile::from_bytes(b).unwrap_err().to_string();
        assert!(e.contains("0 or 1"), "{e}");
    }

    #[test]
    fn deep_nesting_is_rejected_not_stack_overflow() {
        let mut b = header(3, 0, 1);
        push_str(&mut b, "deep");
        b.extend(T_ARRAY.to_le_bytes());
        for _ in 0..10_000 {
            b.extend(T_ARRAY.to_le_bytes());
            b.extend(1u64.to_le_bytes());
        }
        b.extend(T_U8.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        let e = GgufFile::from_bytes(b).unwrap_err().to_string();
        assert!(e.contains("deeper"), "{e}");
    }

    #[test]
    fn integer_getters_convert_and_refuse() {
        let mut b = header(3, 0, 3);
        push_str(&mut b, "neg");
        b.extend(T_I32.to_le_bytes());
        b.extend((-5i32).to_le_bytes());
        push_str(&mut b, "big");
        b.extend(T_U64.to_le_bytes());
        b.extend((u64::from(u32::MAX) + 1).to_le_bytes());
        push_str(&mut b, "ints");
        b.extend(T_ARRAY.to_le_bytes());
        b.extend(T_U64.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(7u64.to_le_bytes());
        b.extend(u64::MAX.to_le_bytes());
        let f = GgufFile::from_bytes(b).unwrap();
        assert_eq!(f.get_u64("neg"), None);
        assert_eq!(f.get_f32("neg"), Some(-5.0));
        assert_eq!(f.get_u64("big"), Some(1 << 32));
        assert_eq!(f.get_u32("big"), None);
        assert_eq!(f.get_i32_array("ints"), None, "u64::MAX does not fit i32");
        assert_eq!(f.get_str("neg"), None);
    }

    #[test]
    fn layout_table_matches_kernel_formats() {
        for id in 0..64u32 {
            if let Some(fmt) = WeightFormat::from_ggml_type(id) {
                let (_, be, bb) = ggml_type_layout(id).unwrap();
                assert_eq!(fmt.block_elems() as u64, be, "{}", fmt.name());
                assert_eq!(fmt.block_bytes() as u64, bb, "{}", fmt.name());
            }
        }
    }
}
