//! Safetensors model directories (single file and sharded) read back; broken
//! directories are clear errors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use anelm_kernels::WeightFormat;
use anelm_model::error::ModelError;
use anelm_model::safetensors_dir::SafetensorsDir;
use anelm_model::tensor_store::TensorStore;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "anelm-st-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// (name, dtype, shape, bytes)
type Spec = (&'static str, Dtype, Vec<usize>, Vec<u8>);

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn write_shard(path: &Path, specs: &[Spec]) {
    let views: Vec<(String, TensorView<'_>)> = specs
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    let bytes = safetensors::serialize(views, None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn shard_a() -> Vec<Spec> {
    vec![
        ("model.embed_tokens.weight", Dtype::BF16, vec![4, 3], pattern(24, 1)),
        ("model.norm.weight", Dtype::F32, vec![3], pattern(12, 2)),
    ]
}

fn shard_b() -> Vec<Spec> {
    vec![
        (
            "model.layers.0.mlp.up_proj.weight",
            Dtype::F16,
            vec![2, 3],
            pattern(12, 3),
        ),
        ("position_ids", Dtype::I64, vec![2], pattern(16, 4)),
    ]
}

fn check_specs(d: &SafetensorsDir, specs: &[Spec]) {
    for (name, dtype, shape, bytes) in specs {
        assert!(d.contains(name));
        assert_eq!(d.dtype(name), Some(*dtype));
        assert_eq!(d.shape(name), Some(shape.as_slice()));
        let expect = match dtype {
            Dtype::F32 => Some(WeightFormat::F32),
            Dtype::F16 => Some(WeightFormat::F16),
            Dtype::BF16 => Some(WeightFormat::BF16),
            _ => None,
        };
        match (d.tensor(name), expect) {
            (Ok(v), Some(fmt)) => {
                assert_eq!(v.format, fmt);
                assert_eq!(&v.shape, shape);
                assert_eq!(v.data, bytes.as_slice(), "{name}");
                assert_eq!(v.name, *name);
            }
            (Err(ModelError::UnsupportedFormat { tensor, format }), None) => {
                assert_eq!(tensor, *name);
                assert!(format.contains(&format!("{dtype:?}")), "{format}");
            }
            (other, _) => panic!("{name}: unexpected {other:?}"),
        }
    }
}

fn write_index(dir: &Path, map: &[(&str, &str)]) {
    let wm: HashMap<&str, &str> = map.iter().copied().collect();
    let json = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": wm });
    std::fs::write(dir.join("model.safetensors.index.json"), json.to_string()).unwrap();
}

fn sharded(dir: &Path) {
    write_shard(&dir.join("model-00001-of-00002.safetensors"), &shard_a());
    write_shard(&dir.join("model-00002-of-00002.safetensors"), &shard_b());
    let mut map = Vec::new();
    for (n, ..) in shard_a() {
        map.push((n, "model-00001-of-00002.safetensors"));
    }
    for (n, ..) in shard_b() {
        map.push((n, "model-00002-of-00002.safetensors"));
    }
    write_index(dir, &map);
}

#[test]
fn single_file_reads_back() {
    let t = TempDir::new("single");
    let mut all = shard_a();
    all.extend(shard_b());
    write_shard(&t.path().join("model.safetensors"), &all);
    let d = SafetensorsDir::open(t.path()).unwrap();
    assert_eq!(d.dir(), t.path());
    assert_eq!(d.shard_paths().len(), 1);
    check_specs(&d, &all);
    let mut names: Vec<&str> = all.iter().map(|s| s.0).collect();
    names.sort();
    assert_eq!(d.tensor_names(), names);
    assert!(matches!(
        d.tensor("lm_head.weight"),
        Err(ModelError::MissingTensor { name }) if name == "lm_head.weight"
    ));
    assert!(!d.contains("lm_head.weight"));
}

#[test]
fn sharded_reads_back() {
    let t = TempDir::new("sharded");
    sharded(t.path());
    let d = SafetensorsDir::open(t.path()).unwrap();
    assert_eq!(d.shard_paths().len(), 2);
    check_specs(&d, &shard_a());
    check_specs(&d, &shard_b());
    assert_eq!(d.tensor_names().len(), 4);
}

#[test]
fn index_wins_over_single_file() {
    let t = TempDir::new("both");
    sharded(t.path());
    // A stray single file with other contents must be ignored.
    write_shard(
        &t.path().join("model.safetensors"),
        &[("stray", Dtype::F32, vec![1], pattern(4, 9))],
    );
    let d = SafetensorsDir::open(t.path()).unwrap();
    assert!(!d.contains("stray"));
    assert!(d.contains("model.norm.weight"));
}

#[test]
fn truncated_shard_is_an_error() {
    let t = TempDir::new("trunc");
    sharded(t.path());
    let p = t.path().join("model-00002-of-00002.safetensors");
    let full = std::fs::read(&p).unwrap();
    for cut in [full.len() - 1, full.len() / 2, 9, 4, 0] {
        std::fs::write(&p, &full[..cut]).unwrap();
        let e = SafetensorsDir::open(t.path()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ModelError::Invalid { .. }), "{msg}");
        assert!(msg.contains("model-00002-of-00002.safetensors"), "{msg}");
    }
}

#[test]
fn missing_shard_is_an_error() {
    let t = TempDir::new("missing");
    sharded(t.path());
    std::fs::remove_file(t.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = SafetensorsDir::open(t.path()).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }), "{e}");
    assert!(e.to_string().contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn index_naming_wrong_shard_is_an_error() {
    let t = TempDir::new("wrong");
    sharded(t.path());
    write_index(
        t.path(),
        &[
            ("model.norm.weight", "model-00002-of-00002.safetensors"),
            ("model.embed_tokens.weight", "model-00001-of-00002.safetensors"),
        ],
    );
    let e = SafetensorsDir::open(t.path()).unwrap_err().to_string();
    assert!(e.contains("model.norm.weight"), "{e}");
}

#[test]
fn index_with_path_escape_is_rejected() {
    let t = TempDir::new("escape");
    sharded(t.path());
    write_index(t.path(), &[("x", "../model-00001-of-00002.safetensors")]);
    let e = SafetensorsDir::open(t.path()).unwrap_err().to_string();
    assert!(e.contains("not a plain file name"), "{e}");
}

#[test]
fn malformed_index_is_an_error() {
    let t = TempDir::new("badindex");
    std::fs::write(t.path().join("model.safetensors.index.json"), "{ not json").unwrap();
    assert!(matches!(SafetensorsDir::open(t.path()), Err(ModelError::Json { .. })));
    std::fs::write(t.path().join("model.safetensors.index.json"), r#"{"metadata":{}}"#).unwrap();
    let e = SafetensorsDir::open(t.path()).unwrap_err().to_string();
    assert!(e.contains("weight_map"), "{e}");
}

#[test]
fn duplicate_tensor_across_shards_is_an_error() {
    let t = TempDir::new("dup");
    write_shard(&t.path().join("a.safetensors"), &shard_a());
    write_shard(&t.path().join("b.safetensors"), &shard_a());
    write_index(
        t.path(),
        &[
            ("model.norm.weight", "a.safetensors"),
            ("model.embed_tokens.weight", "b.safetensors"),
        ],
    );
    let e = SafetensorsDir::open(t.path()).unwrap_err().to_string();
    assert!(e.contains("also stored in"), "{e}");
}

#[test]
fn empty_dir_is_an_error() {
    let t = TempDir::new("empty");
    let e = SafetensorsDir::open(t.path()).unwrap_err().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn corrupted_header_offsets_are_errors() {
    let t = TempDir::new("hdr");
    let p = t.path().join("model.safetensors");
    write_shard(&p, &shard_a());
    let mut bytes = std::fs::read(&p).unwrap();
    // Rewrite the header with a data range past the end (same length header).
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let bad = header.replacen("[0,", "[9,", 1);
    assert_ne!(bad, header, "header layout changed; {header}");
    bytes[8..8 + n].copy_from_slice(bad.as_bytes());
    std::fs::write(&p, &bytes).unwrap();
    assert!(SafetensorsDir::open(t.path()).is_err());
}

#[test]
fn safetensors_dir_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<SafetensorsDir>();
}
