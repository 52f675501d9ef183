//! Property tests: arbitrary and mutated GGUF bytes never panic, and whatever
//! is accepted only exposes in-bounds data.

mod gguf_writer;

use anelm_model::gguf::GgufFile;
use anelm_model::tensor_store::TensorStore;
use proptest::prelude::*;

/// If a file is accepted, every accessor must work without panicking and the
/// tensor data must have exactly the validated size.
fn exercise(f: &GgufFile) {
    for (k, _) in f.metadata() {
        let _ = (f.get_str(k), f.get_u64(k), f.get_f32(k), f.get_bool(k));
        let _ = (f.get_string_array(k), f.get_f32_array(k), f.get_i32_array(k));
    }
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len() as u64, t.size);
        if let Ok(v) = f.tensor(&t.name) {
            assert_eq!(v.data.len() as u64, t.size);
        }
    }
    assert!(f.alignment().is_power_of_two());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(f) = GgufFile::from_bytes(bytes) {
            exercise(&f);
        }
    }

    #[test]
    fn arbitrary_bytes_after_valid_header_never_panic(
        version in 2u32..=3,
        n_tensors in 0u64..4,
        n_kv in 0u64..4,
        tail in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b.extend(tail);
        if let Ok(f) = GgufFile::from_bytes(b) {
            exercise(&f);
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        version in 2u32..=3,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let mut b = gguf_writer::sample(version, None).build().bytes;
        for (i, v) in edits {
            let at = i.index(b.len());
            b[at] = v;
        }
        if truncate {
            b.truncate(cut.index(b.len()));
        }
        if let Ok(f) = GgufFile::from_bytes(b) {
            exercise(&f);
        }
    }

    #[test]
    fn mutated_header_words_never_panic(
        word in any::<prop::sample::Index>(),
        value in prop_oneof![Just(u64::MAX), Just(0u64), Just(1u64 << 63), any::<u64>()],
    ) {
        let mut b = gguf_writer::sample(3, None).build().bytes;
        let header_end = b.len().min(2048) - 8;
        let at = word.index(header_end);
        b[at..at + 8].copy_from_slice(&value.to_le_bytes());
        if let Ok(f) = GgufFile::from_bytes(b) {
            exercise(&f);
        }
    }
}
