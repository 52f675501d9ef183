//! A small GGUF writer for tests: builds files with any metadata and tensors,
//! and records where each field landed so tests can corrupt it precisely.
//!
//! Written independently of the reader (own type-id constants and layout code).

#![allow(dead_code)]

use anelm_model::gguf::{GgufArray, GgufValue};

/// GGUF value type ids, from the format specification.
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// ggml tensor type ids used by the tests.
pub mod ggml {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
    pub const Q4_1: u32 = 3;
    pub const Q8_0: u32 = 8;
    pub const Q4_K: u32 = 12;
    pub const Q3_K: u32 = 11;
    pub const Q5_K: u32 = 13;
    pub const Q6_K: u32 = 14;
    pub const BF16: u32 = 30;
    /// A type anelm does not run.
    pub const IQ2_XXS: u32 = 16;
}

/// One tensor to write: dims in ggml `ne` order and its raw bytes.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
}

/// Byte positions of one written key/value.
#[derive(Clone, Debug, Default)]
pub struct KvPos {
    pub key_len_at: usize,
    pub type_at: usize,
    pub value_at: usize,
}

/// Byte positions of one written tensor info.
#[derive(Clone, Debug, Default)]
pub struct TensorPos {
    pub name_len_at: usize,
    pub n_dims_at: usize,
    pub type_at: usize,
    pub offset_at: usize,
    /// Absolute position of the data.
    pub data_at: usize,
}

/// A written file and where things are in it.
#[derive(Clone, Debug)]
pub struct Built {
    pub bytes: Vec<u8>,
    pub kvs: Vec<KvPos>,
    pub tensors: Vec<TensorPos>,
    pub data_start: usize,
}

/// Builder of a GGUF file.
#[derive(Clone, Debug)]
pub struct Writer {
    pub version: u32,
    /// Written as `general.alignment` (u32) first if set; also used for layout.
    pub alignment: Option<u32>,
    pub kvs: Vec<(String, GgufValue)>,
    pub tensors: Vec<TensorSpec>,
}

impl Writer {
    pub fn new(version: u32) -> Self {
        Self {
            version,
            alignment: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    pub fn kv(mut self, key: &str, v: GgufValue) -> Self {
        self.kvs.push((key.to_string(), v));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> Self {
        self.tensors.push(TensorSpec {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            data,
        });
        self
    }

    /// All key/values as they will appear in the file (alignment first).
    pub fn all_kvs(&self) -> Vec<(String, GgufValue)> {
        let mut out = Vec::new();
        if let Some(a) = self.alignment {
            out.push(("general.alignment".to_string(), GgufValue::U32(a)));
        }
        out.extend(self.kvs.iter().cloned());
        out
    }

    /// Index of `key` among [`Writer::all_kvs`] (and so in `Built::kvs`).
    pub fn kv_index(&self, key: &str) -> usize {
        self.all_kvs()
            .iter()
            .position(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no key {key}"))
    }

    pub fn build(&self) -> Built {
        // Invalid alignments are still written (for error tests); lay out with 32.
        let align = self.alignment.filter(|a| a.is_power_of_two()).unwrap_or(32) as usize;
        let kvs = self.all_kvs();
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend(self.version.to_le_bytes());
        b.extend((self.tensors.len() as u64).to_le_bytes());
        b.extend((kvs.len() as u64).to_le_bytes());
        let mut kv_pos = Vec::new();
        for (k, v) in &kvs {
            let key_len_at = b.len();
            put_str(&mut b, k);
            let type_at = b.len();
            b.extend(type_of(v).to_le_bytes());
            let value_at = b.len();
            put_value(&mut b, v);
            kv_pos.push(KvPos {
                key_len_at,
                type_at,
                value_at,
            });
        }
        // Relative offsets: each tensor starts at an aligned position.
        let mut rel = Vec::new();
        let mut cursor = 0usize;
        for t in &self.tensors {
            rel.push(cursor);
            cursor = (cursor + t.data.len()).next_multiple_of(align);
        }
        let mut t_pos = Vec::new();
        for (t, &off) in self.tensors.iter().zip(&rel) {
            let name_len_at = b.len();
            put_str(&mut b, &t.name);
            let n_dims_at = b.len();
            b.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                b.extend(d.to_le_bytes());
            }
            let type_at = b.len();
            b.extend(t.ggml_type.to_le_bytes());
            let offset_at = b.len();
            b.extend((off as u64).to_le_bytes());
            t_pos.push(TensorPos {
                name_len_at,
                n_dims_at,
                type_at,
                offset_at,
                data_at: 0,
            });
        }
        let data_start = b.len().next_multiple_of(align);
        if !self.tensors.is_empty() {
            b.resize(data_start, 0);
        }
        for (i, (t, &off)) in self.tensors.iter().zip(&rel).enumerate() {
            b.resize(data_start + off, 0);
            t_pos[i].data_at = b.len();
            b.extend_from_slice(&t.data);
        }
        Built {
            bytes: b,
            kvs: kv_pos,
            tensors: t_pos,
            data_start,
        }
    }
}

pub fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

pub fn type_of(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => ty::U8,
        GgufValue::I8(_) => ty::I8,
        GgufValue::U16(_) => ty::U16,
        GgufValue::I16(_) => ty::I16,
        GgufValue::U32(_) => ty::U32,
        GgufValue::I32(_) => ty::I32,
        GgufValue::F32(_) => ty::F32,
        GgufValue::Bool(_) => ty::BOOL,
        GgufValue::String(_) => ty::STRING,
        GgufValue::U64(_) => ty::U64,
        GgufValue::I64(_) => ty::I64,
        GgufValue::F64(_) => ty::F64,
        GgufValue::Array(_) => ty::ARRAY,
    }
}

fn put_value(b: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => b.extend(x.to_le_bytes()),
        GgufValue::I8(x) => b.extend(x.to_le_bytes()),
        GgufValue::U16(x) => b.extend(x.to_le_bytes()),
        GgufValue::I16(x) => b.extend(x.to_le_bytes()),
        GgufValue::U32(x) => b.extend(x.to_le_bytes()),
        GgufValue::I32(x) => b.extend(x.to_le_bytes()),
        GgufValue::F32(x) => b.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => b.push(u8::from(*x)),
        GgufValue::String(s) => put_str(b, s),
        GgufValue::U64(x) => b.extend(x.to_le_bytes()),
        GgufValue::I64(x) => b.extend(x.to_le_bytes()),
        GgufValue::F64(x) => b.extend(x.to_le_bytes()),
        GgufValue::Array(a) => put_array(b, a),
    }
}

fn put_array(b: &mut Vec<u8>, a: &GgufArray) {
    macro_rules! fixed {
        ($t:expr, $v:expr) => {{
            b.extend(($t as u32).to_le_bytes());
            b.extend(($v.len() as u64).to_le_bytes());
            for x in $v {
                b.extend(x.to_le_bytes());
            }
        }};
    }
    match a {
        GgufArray::U8(v) => fixed!(ty::U8, v),
        GgufArray::I8(v) => fixed!(ty::I8, v),
        GgufArray::U16(v) => fixed!(ty::U16, v),
        GgufArray::I16(v) => fixed!(ty::I16, v),
        GgufArray::U32(v) => fixed!(ty::U32, v),
        GgufArray::I32(v) => fixed!(ty::I32, v),
        GgufArray::F32(v) => fixed!(ty::F32, v),
        GgufArray::U64(v) => fixed!(ty::U64, v),
        GgufArray::I64(v) => fixed!(ty::I64, v),
        GgufArray::F64(v) => fixed!(ty::F64, v),
        GgufArray::Bool(v) => {
            b.extend(ty::BOOL.to_le_bytes());
            b.extend((v.len() as u64).to_le_bytes());
            b.extend(v.iter().map(|&x| u8::from(x)));
        }
        GgufArray::String(v) => {
            b.extend(ty::STRING.to_le_bytes());
            b.extend((v.len() as u64).to_le_bytes());
            for s in v {
                put_str(b, s);
            }
        }
        GgufArray::Array(v) => {
            b.extend(ty::ARRAY.to_le_bytes());
            b.extend((v.len() as u64).to_le_bytes());
            for inner in v {
                put_array(b, inner);
            }
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift), so tensors have distinct contents.
pub fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// A representative file: every value type, nested and string arrays, and
/// tensors of several formats (including one anelm does not run).
pub fn sample(version: u32, alignment: Option<u32>) -> Writer {
    let mut w = Writer::new(version);
    w.alignment = alignment;
    w.kv("general.architecture", GgufValue::String("llama".into()))
        .kv("t.u8", GgufValue::U8(200))
        .kv("t.i8", GgufValue::I8(-100))
        .kv("t.u16", GgufValue::U16(60_000))
        .kv("t.i16", GgufValue::I16(-30_000))
        .kv("t.u32", GgufValue::U32(4_000_000_000))
        .kv("t.i32", GgufValue::I32(-2_000_000_000))
        .kv("t.f32", GgufValue::F32(1e-5))
        .kv("t.bool", GgufValue::Bool(true))
        .kv("t.str", GgufValue::String("héllo ✓".into()))
        .kv("t.u64", GgufValue::U64(u64::MAX - 1))
        .kv("t.i64", GgufValue::I64(i64::MIN + 1))
        .kv("t.f64", GgufValue::F64(10000.5))
        .kv(
            "t.arr.str",
            GgufValue::Array(GgufArray::String(vec!["a".into(), String::new(), "Ġthe".into()])),
        )
        .kv("t.arr.f32", GgufValue::Array(GgufArray::F32(vec![0.5, -1.25])))
        .kv("t.arr.f64", GgufValue::Array(GgufArray::F64(vec![2.5])))
        .kv("t.arr.i32", GgufValue::Array(GgufArray::I32(vec![1, -2, 3])))
        .kv("t.arr.u8", GgufValue::Array(GgufArray::U8(vec![1, 2, 255])))
        .kv("t.arr.i8", GgufValue::Array(GgufArray::I8(vec![-1])))
        .kv("t.arr.u16", GgufValue::Array(GgufArray::U16(vec![65535])))
        .kv("t.arr.i16", GgufValue::Array(GgufArray::I16(vec![-7, 7])))
        .kv("t.arr.u32", GgufValue::Array(GgufArray::U32(vec![9, 10])))
        .kv("t.arr.u64", GgufValue::Array(GgufArray::U64(vec![1 << 40])))
        .kv("t.arr.i64", GgufValue::Array(GgufArray::I64(vec![-(1 << 40)])))
        .kv("t.arr.bool", GgufValue::Array(GgufArray::Bool(vec![true, false])))
        .kv("t.arr.empty", GgufValue::Array(GgufArray::U32(vec![])))
        .kv(
            "t.arr.nested",
            GgufValue::Array(GgufArray::Array(vec![
                GgufArray::I32(vec![1, 2]),
                GgufArray::String(vec!["x".into()]),
                GgufArray::Array(vec![GgufArray::F32(vec![3.0])]),
            ])),
        )
        .tensor("token_embd.weight", &[64, 3], ggml::Q8_0, bytes(3 * 2 * 34, 1))
        .tensor("blk.0.attn_norm.weight", &[64], ggml::F32, bytes(64 * 4, 2))
        .tensor("blk.0.ffn_up.weight", &[32, 5], ggml::Q4_1, bytes(5 * 20, 3))
        .tensor("blk.0.half", &[3, 2, 2], ggml::F16, bytes(12 * 2, 4))
        .tensor("blk.0.kq", &[256, 2], ggml::Q4_K, bytes(2 * 144, 5))
        .tensor("blk.0.q5k", &[256], ggml::Q5_K, bytes(176, 6))
        .tensor("blk.0.q3k", &[256], ggml::Q3_K, bytes(110, 8))
        .tensor("blk.0.iq2xxs", &[256], ggml::IQ2_XXS, bytes(66, 9))
        .tensor("output.weight", &[256, 1, 1, 2], ggml::Q6_K, bytes(2 * 210, 7))
}
