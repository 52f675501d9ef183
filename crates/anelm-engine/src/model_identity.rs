//! What makes saved model state valid for a run: everything that changes the numbers a model
//! computes, as one string. The prompt cache keys its entries by it, so state written by another
//! model file, another version of the same file, another precision, backend or build is never
//! restored.

use std::fmt::Write as _;
use std::path::Path;
use std::time::UNIX_EPOCH;

use crate::loader::{LoadedModel, ModelSource};

/// Everything that changes a model's numbers, as `name=value` lines (see [`ModelIdentity::of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelIdentity(String);

impl ModelIdentity {
    /// An identity with only the engine's own parts (its version, the session state format, the
    /// CPU features and `ANELM_*` switches the kernels follow); add the model's with
    /// [`ModelIdentity::with`] or use [`ModelIdentity::of`].
    pub fn engine() -> Self {
        let features = anelm_kernels::Features::get();
        let isa: Vec<&str> = features
            .list()
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(n, _)| n)
            .collect();
        let tuning = anelm_kernels::Tuning::get().changed();
        Self(String::new())
            .with("engine", env!("CARGO_PKG_VERSION"))
            .with("entry_format", crate::prompt_cache_file::FORMAT_VERSION)
            .with("arch_target", std::env::consts::ARCH)
            .with("cpu", isa.join(","))
            .with("tuning", tuning.join(","))
    }

    /// The identity of `model` as loaded: the engine's parts, its file (canonical path, size
    /// and modification time; for a directory, every file in it), and its architecture and
    /// sizes. The caller adds what only it knows and that changes the numbers, with
    /// [`ModelIdentity::with`]: the backend or device (`cpu`, `ane-emu`, `ane`, chip), the load
    /// quantisation or dtype, ANE weight mode, and the context size.
    pub fn of(model: &LoadedModel) -> std::io::Result<Self> {
        let (kind, path) = match &model.source {
            ModelSource::Gguf(p) => ("gguf", p),
            ModelSource::SafetensorsDir(p) => ("safetensors", p),
        };
        let info = model.model.info();
        Ok(Self::engine()
            .with("source", kind)
            .with("files", files_identity(path)?)
            .with("architecture", &info.architecture)
            .with("vocab", info.vocab_size)
            .with("layers", info.n_layers)
            .with("hidden", info.hidden_size)
            .with("context_length", info.context_length))
    }

    /// This identity with one more `name=value` part (line breaks in `value` are escaped).
    pub fn with(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        let value = value.to_string().replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.0, "{name}={value}");
        self
    }

    /// The identity as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<[u8]> for ModelIdentity {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// `path|size|mtime_ns` of the file, or of every regular file of the directory (sorted by name).
fn files_identity(path: &Path) -> std::io::Result<String> {
    let path = path.canonicalize()?;
    let one = |p: &Path| -> std::io::Result<String> {
        let m = std::fs::metadata(p)?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        Ok(format!("{}|{}|{mtime}", p.display(), m.len()))
    };
    if !path.is_dir() {
        return one(&path);
    }
    let mut files: Vec<_> = std::fs::read_dir(&path)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let parts: Vec<String> = files.iter().map(|p| one(p)).collect::<std::io::Result<_>>()?;
    Ok(parts.join(";"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_lines_and_differ_when_anything_differs() {
        let a = ModelIdentity::engine().with("backend", "cpu").with("ctx", 4096);
        let b = ModelIdentity::engine().with("backend", "cpu").with("ctx", 2048);
        assert_ne!(a, b);
        assert!(a.as_str().contains("backend=cpu\nctx=4096\n"));
        assert_eq!(
            ModelIdentity::engine().with("x", "a\nb").as_str().lines().last(),
            Some("x=a\\nb")
        );
    }

    #[test]
    fn a_file_identity_changes_with_its_size_or_time() {
        let dir = std::env::temp_dir().join(format!("anelm-identity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("m.gguf");
        std::fs::write(&f, b"one").unwrap();
        let first = files_identity(&f).unwrap();
        std::fs::write(&f, b"three").unwrap();
        assert_ne!(files_identity(&f).unwrap(), first);
        let whole = files_identity(&dir).unwrap();
        assert!(whole.contains("m.gguf|5|"), "{whole}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
