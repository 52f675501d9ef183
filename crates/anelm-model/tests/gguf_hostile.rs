//! Truncated and corrupted GGUF files are errors that say what and where,
//! never panics or out-of-bounds reads.

mod gguf_writer;

use anelm_model::error::ModelError;
use anelm_model::gguf::{GgufFile, GgufValue};
use gguf_writer::{Writer, ggml, sample, ty};

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Parses and returns (byte offset, message) of the expected Malformed error.
fn malformed(bytes: Vec<u8>) -> (u64, String) {
    match GgufFile::from_bytes(bytes) {
        Err(e @ ModelError::Malformed { .. }) => {
            let msg = e.to_string();
            let ModelError::Malformed { offset, .. } = e else {
                unreachable!()
            };
            (offset, msg)
        }
        Err(other) => panic!("expected Malformed, got {other}"),
        Ok(_) => panic!("corrupt file was accepted"),
    }
}

#[test]
fn every_truncation_is_an_error() {
    for w in [sample(3, None), sample(2, Some(64))] {
        let full = w.build().bytes;
        assert!(GgufFile::from_bytes(full.clone()).is_ok());
        for len in 0..full.len() {
            let r = GgufFile::from_bytes(full[..len].to_vec());
            assert!(r.is_err(), "truncation to {len} of {} accepted", full.len());
        }
    }
}

#[test]
fn truncation_in_header_names_the_field() {
    let full = sample(3, None).build().bytes;
    let (at, msg) = malformed(full[..10].to_vec());
    assert_eq!(at, 8);
    assert!(msg.contains("tensor count"), "{msg}");
}

#[test]
fn huge_counts_are_rejected_before_allocating() {
    let b = sample(3, None).build();
    let mut x = b.bytes.clone();
    put_u64(&mut x, 8, u64::MAX);
    let (at, msg) = malformed(x);
    assert!(msg.contains("tensor count"), "{msg}");
    assert_eq!(at, 8);

    let mut x = b.bytes.clone();
    put_u64(&mut x, 16, u64::MAX);
    let (at, msg) = malformed(x);
    assert!(msg.contains("key/value count"), "{msg}");
    assert_eq!(at, 16);

    // Plausible-looking but still too large for the file.
    let mut x = b.bytes.clone();
    put_u64(&mut x, 16, 1 << 30);
    assert!(malformed(x).1.contains("key/value count"));
}

#[test]
fn huge_string_length() {
    let b = sample(3, None).build();
    let at = b.kvs[1].key_len_at;
    let mut x = b.bytes.clone();
    put_u64(&mut x, at, u64::MAX / 2);
    let (off, msg) = malformed(x);
    assert_eq!(off, at as u64);
    assert!(msg.contains("claims"), "{msg}");

    // String *value* length.
    let kv = &b.kvs[sample(3, None).kv_index("t.str")];
    let mut x = b.bytes.clone();
    put_u64(&mut x, kv.value_at, 1 << 40);
    let (off, msg) = malformed(x);
    assert_eq!(off, kv.value_at as u64);
    assert!(msg.contains("t.str"), "{msg}");
}

#[test]
fn huge_array_length() {
    let w = Writer::new(3).kv(
        "tokenizer.ggml.tokens",
        GgufValue::Array(anelm_model::gguf::GgufArray::String(vec!["a".into()])),
    );
    let b = w.build();
    let mut x = b.bytes.clone();
    // value: elem type (4) then count (8).
    put_u64(&mut x, b.kvs[0].value_at + 4, u64::MAX);
    let (off, msg) = malformed(x);
    assert_eq!(off, (b.kvs[0].value_at + 4) as u64);
    assert!(msg.contains("tokenizer.ggml.tokens"), "{msg}");
    assert!(msg.contains("elements"), "{msg}");
}

#[test]
fn bad_value_type_ids() {
    let b = sample(3, None).build();
    let mut x = b.bytes.clone();
    put_u32(&mut x, b.kvs[2].type_at, 13);
    let (_, msg) = malformed(x);
    assert!(msg.contains("unknown value type id 13"), "{msg}");

    let mut x = b.bytes.clone();
    put_u32(&mut x, b.kvs[2].type_at, u32::MAX);
    assert!(malformed(x).1.contains("unknown value type"));

    // Array element type.
    let arr = &b.kvs[sample(3, None).kv_index("t.arr.i32")];
    let mut x = b.bytes.clone();
    put_u32(&mut x, arr.value_at, 99);
    let (_, msg) = malformed(x);
    assert!(msg.contains("element type id 99"), "{msg}");
}

#[test]
fn misaligned_tensor_offset() {
    let b = sample(3, None).build();
    let t = &b.tensors[1];
    let mut x = b.bytes.clone();
    let rel = (t.data_at - b.data_start) as u64;
    put_u64(&mut x, t.offset_at, rel + 4);
    let (off, msg) = malformed(x);
    assert_eq!(off, t.offset_at as u64);
    assert!(msg.contains("not a multiple of the alignment"), "{msg}");
}

#[test]
fn tensor_beyond_eof() {
    let b = sample(3, None).build();
    let t = &b.tensors[2];
    let mut x = b.bytes.clone();
    let past = (x.len() as u64).next_multiple_of(32);
    put_u64(&mut x, t.offset_at, past);
    let (off, msg) = malformed(x);
    assert_eq!(off, t.offset_at as u64);
    assert!(msg.contains("past the end"), "{msg}");

    // Offset so large that data_start + offset overflows.
    let mut x = b.bytes.clone();
    put_u64(&mut x, t.offset_at, u64::MAX - 31);
    assert!(malformed(x).1.contains("past the end"));

    // Dimension grown so the size runs past EOF.
    let mut x = b.bytes.clone();
    put_u64(&mut x, t.n_dims_at + 4 + 8, 1 << 20);
    assert!(malformed(x).1.contains("past the end"));
}

#[test]
fn too_many_dims() {
    let b = sample(3, None).build();
    let t = &b.tensors[0];
    let mut x = b.bytes.clone();
    put_u32(&mut x, t.n_dims_at, 5);
    let (off, msg) = malformed(x);
    assert_eq!(off, t.n_dims_at as u64);
    assert!(msg.contains("5 dimensions"), "{msg}");
}

#[test]
fn dims_overflow() {
    let w = Writer::new(3).tensor("big", &[1 << 32, 1 << 32, 4], ggml::F32, vec![0; 4]);
    let (_, msg) = malformed(w.build().bytes);
    assert!(msg.contains("overflow"), "{msg}");

    let w = Writer::new(3).tensor("big", &[u64::MAX], ggml::F32, vec![0; 4]);
    assert!(malformed(w.build().bytes).1.contains("big"));
}

#[test]
fn row_not_multiple_of_block() {
    let w = Writer::new(3).tensor("q", &[33, 1], ggml::Q8_0, vec![0; 68]);
    let (_, msg) = malformed(w.build().bytes);
    assert!(msg.contains("not a multiple of 32"), "{msg}");
}

#[test]
fn duplicate_keys_and_tensors() {
    let w = Writer::new(3).kv("a", GgufValue::U8(1)).kv("a", GgufValue::U8(2));
    let (_, msg) = malformed(w.build().bytes);
    assert!(msg.contains("`a` appears twice"), "{msg}");

    let w = Writer::new(3)
        .tensor("t", &[1], ggml::F32, vec![0; 4])
        .tensor("t", &[1], ggml::F32, vec![0; 4]);
    let (_, msg) = malformed(w.build().bytes);
    assert!(msg.contains("`t` appears twice"), "{msg}");
}

#[test]
fn bad_alignment_values() {
    for a in [0u32, 3, 48] {
        let mut w = Writer::new(3);
        w.alignment = Some(a);
        let b = w.build();
        let (off, msg) = malformed(b.bytes);
        assert_eq!(off, b.kvs[0].value_at as u64);
        assert!(msg.contains("power of two"), "alignment {a}: {msg}");
    }
    let w = Writer::new(3).kv("general.alignment", GgufValue::String("32".into()));
    let e = GgufFile::from_bytes(w.build().bytes).unwrap_err().to_string();
    assert!(e.contains("general.alignment"), "{e}");
}

#[test]
fn versions_and_magic() {
    let b = sample(3, None).build().bytes;
    let mut x = b.clone();
    put_u32(&mut x, 4, 1);
    let e = GgufFile::from_bytes(x).unwrap_err();
    assert!(matches!(e, ModelError::UnsupportedVersion { version: 1, .. }));
    assert!(e.to_string().contains("2 and 3"));

    for v in [0u32, 4, 0x0300_0000] {
        let mut x = b.clone();
        put_u32(&mut x, 4, v);
        let (off, msg) = malformed(x);
        assert_eq!(off, 4);
        assert!(msg.contains("version"), "{msg}");
    }

    let mut x = b.clone();
    x[..4].copy_from_slice(b"GGML");
    let (off, msg) = malformed(x);
    assert_eq!(off, 0);
    assert!(msg.contains("not a GGUF file"), "{msg}");
}

#[test]
fn invalid_utf8_key_and_name() {
    let b = Writer::new(3).kv("ab", GgufValue::U8(1)).build();
    let mut x = b.bytes.clone();
    x[b.kvs[0].key_len_at + 8] = 0xff;
    assert!(malformed(x).1.contains("UTF-8"));

    let b = Writer::new(3).tensor("ab", &[1], ggml::F32, vec![0; 4]).build();
    let mut x = b.bytes.clone();
    x[b.tensors[0].name_len_at + 8] = 0xff;
    assert!(malformed(x).1.contains("UTF-8"));
}

#[test]
fn invalid_utf8_string_value_is_replaced_not_rejected() {
    let b = Writer::new(3).kv("k", GgufValue::String("ab".into())).build();
    let mut x = b.bytes.clone();
    x[b.kvs[0].value_at + 8] = 0xff;
    let f = GgufFile::from_bytes(x).unwrap();
    assert_eq!(f.get_str("k"), Some("\u{fffd}b"));
}

#[test]
fn bad_type_id_constant_sanity() {
    // The writer's constants follow the spec; one spot check against a hand-built file.
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.extend(1u64.to_le_bytes());
    b.push(b'k');
    b.extend(ty::F64.to_le_bytes());
    b.extend(2.5f64.to_le_bytes());
    let f = GgufFile::from_bytes(b).unwrap();
    assert_eq!(f.get("k"), Some(&GgufValue::F64(2.5)));
}
