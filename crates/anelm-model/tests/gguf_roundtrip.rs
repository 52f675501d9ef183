//! GGUF files built by an independent test writer read back exactly.

mod gguf_writer;

use anelm_kernels::WeightFormat;
use anelm_model::error::ModelError;
use anelm_model::gguf::{GgufArray, GgufFile, GgufValue};
use anelm_model::tensor_store::TensorStore;
use gguf_writer::{Writer, ggml, sample};

fn roundtrip(w: &Writer) {
    let built = w.build();
    let f = GgufFile::from_bytes(built.bytes.clone()).unwrap();
    assert_eq!(f.version(), w.version);
    let align = u64::from(w.alignment.unwrap_or(32));
    assert_eq!(f.alignment(), align);
    assert_eq!(f.data_start(), built.data_start as u64);
    assert_eq!(f.data_start() % align, 0);

    // Metadata: same pairs, same order.
    assert_eq!(f.metadata(), w.all_kvs().as_slice());
    for (k, v) in w.all_kvs() {
        assert_eq!(f.get(&k), Some(&v), "{k}");
    }

    // Tensors: directory and bytes.
    assert_eq!(f.tensors().len(), w.tensors.len());
    for (i, spec) in w.tensors.iter().enumerate() {
        let info = f.tensor_info(&spec.name).unwrap();
        assert_eq!(&f.tensors()[i], info, "file order");
        assert_eq!(info.dims, spec.dims);
        assert_eq!(info.ggml_type, spec.ggml_type);
        assert_eq!(info.offset, built.tensors[i].data_at as u64);
        assert_eq!(info.offset % align, 0);
        assert_eq!(info.size, spec.data.len() as u64, "{}", spec.name);
        assert_eq!(f.tensor_data(info), spec.data.as_slice(), "{}", spec.name);
        assert_eq!(info.format, WeightFormat::from_ggml_type(spec.ggml_type));
    }
}

#[test]
fn v3_default_alignment() {
    roundtrip(&sample(3, None));
}

#[test]
fn v2_default_alignment() {
    roundtrip(&sample(2, None));
}

#[test]
fn custom_alignments() {
    for a in [1, 8, 64, 256] {
        roundtrip(&sample(3, Some(a)));
        roundtrip(&sample(2, Some(a)));
    }
}

#[test]
fn metadata_only_file() {
    let w = Writer::new(3).kv("general.architecture", GgufValue::String("qwen3".into()));
    roundtrip(&w);
    let f = GgufFile::from_bytes(w.build().bytes).unwrap();
    assert_eq!(f.architecture(), Some("qwen3"));
    assert!(f.tensor_names().is_empty());
}

#[test]
fn typed_getters() {
    let f = GgufFile::from_bytes(sample(3, None).build().bytes).unwrap();
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.get_u64("t.u8"), Some(200));
    assert_eq!(f.get_u64("t.u16"), Some(60_000));
    assert_eq!(f.get_u32("t.u32"), Some(4_000_000_000));
    assert_eq!(f.get_u64("t.u64"), Some(u64::MAX - 1));
    assert_eq!(f.get_u32("t.u64"), None, "does not fit u32");
    assert_eq!(f.get_u64("t.i8"), None, "negative");
    assert_eq!(f.get_u64("t.i16"), None, "negative");
    assert_eq!(f.get_f32("t.f32"), Some(1e-5));
    assert_eq!(f.get_f32("t.f64"), Some(10000.5));
    assert_eq!(f.get_f32("t.u16"), Some(60_000.0));
    assert_eq!(f.get_f32("t.str"), None);
    assert_eq!(f.get_bool("t.bool"), Some(true));
    assert_eq!(f.get_bool("t.u8"), None);
    assert_eq!(f.get_str("t.str"), Some("héllo ✓"));
    assert_eq!(f.get_str("missing"), None);
    assert_eq!(
        f.get_string_array("t.arr.str"),
        Some(&["a".to_string(), String::new(), "Ġthe".to_string()][..])
    );
    assert_eq!(f.get_string_array("t.arr.i32"), None);
    assert_eq!(f.get_f32_array("t.arr.f32"), Some(vec![0.5, -1.25]));
    assert_eq!(f.get_f32_array("t.arr.f64"), Some(vec![2.5]));
    assert_eq!(f.get_f32_array("t.arr.i32"), None);
    assert_eq!(f.get_i32_array("t.arr.i32"), Some(vec![1, -2, 3]));
    assert_eq!(f.get_i32_array("t.arr.u8"), Some(vec![1, 2, 255]));
    assert_eq!(f.get_i32_array("t.arr.i16"), Some(vec![-7, 7]));
    assert_eq!(f.get_i32_array("t.arr.u64"), None, "2^40 does not fit i32");
    assert_eq!(f.get_i32_array("t.arr.f32"), None);
    assert_eq!(f.get_i32_array("t.arr.empty"), Some(vec![]));
    match f.get("t.arr.nested") {
        Some(GgufValue::Array(GgufArray::Array(v))) => {
            assert_eq!(v.len(), 3);
            assert_eq!(v[2], GgufArray::Array(vec![GgufArray::F32(vec![3.0])]));
        }
        other => panic!("nested array read back as {other:?}"),
    }
}

#[test]
fn tensor_store_views() {
    let w = sample(3, Some(64));
    let f = GgufFile::from_bytes(w.build().bytes).unwrap();
    let names: Vec<&str> = w.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(f.tensor_names(), names);

    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.format, WeightFormat::Q8_0);
    assert_eq!(emb.shape, vec![3, 64], "shape is ne reversed");
    assert_eq!(emb.data, w.tensors[0].data.as_slice());
    assert_eq!(emb.name, "token_embd.weight");

    let h = f.tensor("blk.0.half").unwrap();
    assert_eq!(h.format, WeightFormat::F16);
    assert_eq!(h.shape, vec![2, 2, 3]);

    let o = f.tensor("output.weight").unwrap();
    assert_eq!(o.format, WeightFormat::Q6_K);
    assert_eq!(o.shape, vec![2, 1, 1, 256]);
    assert_eq!(f.tensor("blk.0.ffn_up.weight").unwrap().format, WeightFormat::Q4_1);
    assert_eq!(f.tensor("blk.0.kq").unwrap().format, WeightFormat::Q4_K);

    assert_eq!(f.tensor("blk.0.q5k").unwrap().format, WeightFormat::Q5_K);

    assert_eq!(f.tensor("blk.0.q3k").unwrap().format, WeightFormat::Q3_K);

    // Present but in a format we don't run: the error names the tensor and its type.
    assert!(f.contains("blk.0.iq2xxs"));
    assert_eq!(f.tensor_info("blk.0.iq2xxs").unwrap().format, None);
    match f.tensor("blk.0.iq2xxs") {
        Err(ModelError::UnsupportedFormat { tensor, format }) => {
            assert_eq!(tensor, "blk.0.iq2xxs");
            assert!(format.contains("IQ2_XXS"), "{format}");
        }
        other => panic!("expected UnsupportedFormat, got {other:?}"),
    }

    assert!(!f.contains("nope"));
    assert!(matches!(
        f.tensor("nope"),
        Err(ModelError::MissingTensor { name }) if name == "nope"
    ));
}

#[test]
fn unknown_ggml_type_is_listed_but_unsupported() {
    let w =
        Writer::new(3)
            .tensor("weird", &[4], 250, vec![])
            .tensor("ok", &[2], ggml::F32, vec![1, 2, 3, 4, 5, 6, 7, 8]);
    let f = GgufFile::from_bytes(w.build().bytes).unwrap();
    let info = f.tensor_info("weird").unwrap();
    assert_eq!(info.format, None);
    assert_eq!(info.ggml_type, 250);
    let e = f.tensor("weird").unwrap_err().to_string();
    assert!(e.contains("250"), "{e}");
    assert_eq!(f.tensor("ok").unwrap().data, &[1, 2, 3, 4, 5, 6, 7, 8]);
}

#[test]
fn open_from_disk_matches_from_bytes() {
    let built = sample(3, None).build();
    let path = std::env::temp_dir().join(format!("anelm-gguf-rt-{}.gguf", std::process::id()));
    std::fs::write(&path, &built.bytes).unwrap();
    let f = GgufFile::open(&path);
    let _ = std::fs::remove_file(&path);
    let f = f.unwrap();
    let g = GgufFile::from_bytes(built.bytes).unwrap();
    assert_eq!(f.metadata(), g.metadata());
    assert_eq!(f.tensors(), g.tensors());
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t), g.tensor_data(t));
    }
    // Released pages read back the same, through the mapping and through positional reads
    // (the file is already unlinked: the open handle still reads it).
    for t in f.tensors() {
        let Ok(view) = f.tensor(&t.name) else { continue };
        f.release(view.data);
        assert_eq!(view.data, g.tensor_data(t), "{} after release", t.name);
        for part in [view.data, &view.data[view.data.len() / 2..], &view.data[..0]] {
            let mut out = vec![0u8; part.len()];
            f.read_into(part, &mut out);
            assert_eq!(out, part, "{} read_into", t.name);
        }
    }
    let e = GgufFile::open(std::path::Path::new("/definitely/not/here.gguf")).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }), "{e}");
    assert!(e.to_string().contains("/definitely/not/here.gguf"));
}

#[test]
fn gguf_file_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<GgufFile>();
}
