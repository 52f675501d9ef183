//! Hugging Face safetensors model directories: a single `model.safetensors`,
//! or shards listed by `model.safetensors.index.json`.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use anelm_kernels::WeightFormat;
use safetensors::{Dtype, SafeTensors};

use crate::error::ModelError;
use crate::tensor_store::{TensorStore, TensorView};

/// File name of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The bytes of one shard.
enum ShardBytes {
    Mapped(memmap2::Mmap),
    Empty,
}

impl ShardBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            ShardBytes::Mapped(m) => m,
            ShardBytes::Empty => &[],
        }
    }
}

struct Shard {
    path: PathBuf,
    bytes: ShardBytes,
}

/// Where one tensor lives.
struct Slot {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard file (validated at open).
    start: usize,
    end: usize,
}

/// A Hugging Face model directory: `model.safetensors`, or shards listed by
/// `model.safetensors.index.json` (`weight_map`). Every shard is mmap'd once
/// and every header is validated against its file size at open.
pub struct SafetensorsDir {
    dir: PathBuf,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, Slot>,
}

impl std::fmt::Debug for SafetensorsDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsDir")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// The anelm format of a safetensors dtype, if we run it.
pub fn weight_format_of(dtype: Dtype) -> Option<WeightFormat> {
    match dtype {
        Dtype::F32 => Some(WeightFormat::F32),
        Dtype::F16 => Some(WeightFormat::F16),
        Dtype::BF16 => Some(WeightFormat::BF16),
        _ => None,
    }
}

impl SafetensorsDir {
    /// Opens the checkpoint in `dir`: the shard index if present, else
    /// `model.safetensors`.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join(INDEX_FILE);
        let single_path = dir.join(SINGLE_FILE);
        let (shard_names, weight_map) = if index_path.is_file() {
            let (names, map) = read_index(&index_path)?;
            (names, Some(map))
        } else if single_path.is_file() {
            (vec![SINGLE_FILE.to_string()], None)
        } else {
            return Err(ModelError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "neither {INDEX_FILE} nor {SINGLE_FILE} is in this directory; point at a Hugging Face model directory with safetensors weights"
                    ),
                ),
            });
        };

        let mut shards = Vec::with_capacity(shard_names.len());
        let mut tensors: BTreeMap<String, Slot> = BTreeMap::new();
        for name in &shard_names {
            let path = dir.join(name);
            let bytes = map_file(&path)?;
            let shard_idx = shards.len();
            let label = path.display().to_string();
            let (header_len, meta) = SafeTensors::read_metadata(bytes.bytes()).map_err(|e| ModelError::Invalid {
                file: label.clone(),
                what: format!("not a valid safetensors file ({e}); the shard is truncated or corrupt, re-download it"),
            })?;
            let data_start = 8usize.checked_add(header_len).ok_or_else(|| ModelError::Invalid {
                file: label.clone(),
                what: "header length overflows".to_string(),
            })?;
            let file_len = bytes.bytes().len();
            for (tname, info) in meta.tensors() {
                let (s, e) = info.data_offsets;
                let range = data_start
                    .checked_add(s)
                    .zip(data_start.checked_add(e))
                    .filter(|&(a, b)| a <= b && b <= file_len);
                let Some((start, end)) = range else {
                    return Err(ModelError::Invalid {
                        file: label.clone(),
                        what: format!(
                            "tensor `{tname}` data [{s}, {e}) lies outside the {file_len}-byte file; the shard is truncated, re-download it"
                        ),
                    });
                };
                let slot = Slot {
                    shard: shard_idx,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                };
                match tensors.entry(tname) {
                    Entry::Occupied(o) => {
                        let other = shards
                            .get(o.get().shard)
                            .map(|s: &Shard| s.path.display().to_string())
                            .unwrap_or_else(|| label.clone());
                        return Err(ModelError::Invalid {
                            file: label.clone(),
                            what: format!(
                                "tensor `{}` is also stored in {other}; the checkpoint mixes shards of different models",
                                o.key()
                            ),
                        });
                    }
                    Entry::Vacant(v) => {
                        v.insert(slot);
                    }
                }
            }
            shards.push(Shard { path, bytes });
        }

        if let Some(map) = weight_map {
            for (tname, file) in &map {
                let found = tensors
                    .get(tname)
                    .and_then(|slot| shard_names.get(slot.shard))
                    .is_some_and(|f| f == file);
                if !found {
                    return Err(ModelError::Invalid {
                        file: index_path.display().to_string(),
                        what: format!(
                            "weight_map says tensor `{tname}` is in {file}, but that shard does not contain it; the download is incomplete or mixed, re-download the model"
                        ),
                    });
                }
            }
        }

        Ok(Self {
            dir: dir.to_path_buf(),
            shards,
            tensors,
        })
    }

    /// The model directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Paths of the shard files, sorted by file name.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// The stored dtype of a tensor (including dtypes anelm does not run).
    pub fn dtype(&self, name: &str) -> Option<Dtype> {
        self.tensors.get(name).map(|s| s.dtype)
    }

    /// The stored shape of a tensor, outermost first.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|s| s.shape.as_slice())
    }
}

impl TensorStore for SafetensorsDir {
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        let (key, slot) = self
            .tensors
            .get_key_value(name)
            .ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })?;
        let format = weight_format_of(slot.dtype).ok_or_else(|| ModelError::UnsupportedFormat {
            tensor: key.clone(),
            format: format!("safetensors dtype {:?}", slot.dtype),
        })?;
        let data = self
            .shards
            .get(slot.shard)
            .and_then(|s| s.bytes.bytes().get(slot.start..slot.end))
            .unwrap_or(&[]);
        Ok(TensorView {
            name: key,
            format,
            shape: slot.shape.clone(),
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn tensor_names(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }

    /// Gives the pages back (see [`TensorStore::release`]); used where the weights were copied
    /// into another form, such as load-time quantisation.
    fn release(&self, bytes: &[u8]) {
        for shard in &self.shards {
            if let ShardBytes::Mapped(map) = &shard.bytes {
                crate::mapped_pages::release(map, bytes);
            }
        }
    }
}

fn map_file(path: &Path) -> Result<ShardBytes, ModelError> {
    let io_err = |source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    if file.metadata().map_err(io_err)?.len() == 0 {
        return Ok(ShardBytes::Empty);
    }
    // SAFETY: read-only map handed out only as shared slices; the shard must
    // not be truncated or rewritten by another process while the directory is
    // open (the usual contract of mmap-based loaders).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err)?;
    Ok(ShardBytes::Mapped(map))
}

/// Reads the shard index: distinct shard file names (sorted) and the
/// tensor → shard map.
fn read_index(path: &Path) -> Result<(Vec<String>, BTreeMap<String, String>), ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    let invalid = |what: String| ModelError::Invalid {
        file: path.display().to_string(),
        what,
    };
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| invalid("no `weight_map` object; the index is corrupt".to_string()))?;
    let mut names: Vec<String> = Vec::new();
    let mut weight_map = BTreeMap::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| invalid(format!("weight_map entry for `{tensor}` is not a file name string")))?;
        let mut comps = Path::new(file).components();
        let plain = matches!(comps.next(), Some(Component::Normal(_))) && comps.next().is_none();
        if !plain {
            return Err(invalid(format!(
                "weight_map entry for `{tensor}` is `{file}`, which is not a plain file name in the model directory"
            )));
        }
        if !names.iter().any(|n| n == file) {
            names.push(file.to_string());
        }
        weight_map.insert(tensor.clone(), file.to_string());
    }
    names.sort();
    if names.is_empty() {
        return Err(invalid("weight_map is empty; the index lists no tensors".to_string()));
    }
    Ok((names, weight_map))
}
