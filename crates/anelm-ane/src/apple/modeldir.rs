//! The on-disk side of a kernel: the model directory the framework expects (ane-runtime.md
//! §2.2 step 4, ane-hardware.md §1.2 step 3).
//!
//! `<tmp>/<hexId>/model.mil` holds the MIL text, and every weight file is written to
//! `<tmp>/<hexId>/<key without @model_path/>` (e.g. `weights/wq.bin`), `weights/` included even
//! when there are none. `<tmp>/<hexId>` is the model's own `localModelPath` where it answers
//! (`NSTemporaryDirectory()` + `hexStringIdentifier` in the iOS 18.2 framework). The identifier is
//! three SHA-256 hex digests joined by `_` (MIL text, weights, options: 194 characters), so it is
//! accepted as any safe single path component up to [`MAX_IDENTIFIER_BYTES`]. The compile-cache
//! markers are [`crate::CompileCache`]'s.

use std::fs;
use std::path::{Path, PathBuf};

use anelm_mil::WeightFiles;

use super::error::AppleError;
use super::foundation::relative_weight_path;

/// File name of the MIL text in a model directory.
pub const MODEL_MIL: &str = "model.mil";

/// The files of a program's model directory, relative to it, with their bytes: `model.mil`
/// first, then each weight file in key order.
pub fn model_dir_files<'a>(
    mil_text: &'a str,
    weights: &'a WeightFiles,
) -> Result<Vec<(PathBuf, &'a [u8])>, AppleError> {
    let mut files = vec![(PathBuf::from(MODEL_MIL), mil_text.as_bytes())];
    for (key, bytes) in weights.iter() {
        files.push((PathBuf::from(relative_weight_path(key)?), bytes));
    }
    Ok(files)
}

/// Write (or rewrite) the model directory `dir` for a program: `weights/`, `model.mil`, each
/// weight file.
pub fn write_model_dir(dir: &Path, mil_text: &str, weights: &WeightFiles) -> Result<(), AppleError> {
    write_model_dir_with(dir, mil_text, weights, |p, b| fs::write(p, b))
}

/// [`write_model_dir`] with each file written by `write` (the device passes its runtime's).
pub(crate) fn write_model_dir_with(
    dir: &Path,
    mil_text: &str,
    weights: &WeightFiles,
    mut write: impl FnMut(&Path, &[u8]) -> std::io::Result<()>,
) -> Result<(), AppleError> {
    let files = model_dir_files(mil_text, weights)?;
    let wdir = dir.join("weights");
    fs::create_dir_all(&wdir).map_err(|e| AppleError::io("create", &wdir, &e))?;
    for (rel, bytes) in files {
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| AppleError::io("create", parent, &e))?;
        }
        write(&path, bytes).map_err(|e| AppleError::io("write", &path, &e))?;
    }
    Ok(())
}

/// Remove a model directory (missing is fine).
pub fn remove_model_dir(dir: &Path) -> Result<(), AppleError> {
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(AppleError::io("remove", dir, &e)),
    }
}

/// Longest identifier accepted as a directory name: 255 bytes, the file-name limit of APFS and
/// most file systems.
pub const MAX_IDENTIFIER_BYTES: usize = 255;

/// Whether `id` can name the model directory: a safe single path component — non-empty, at most
/// [`MAX_IDENTIFIER_BYTES`] bytes, not `.` or `..`, no `/`, `\`, NUL or control character. The
/// framework's `hexStringIdentifier` (`<sha256>_<sha256>_<sha256>`, 194 bytes) qualifies.
pub fn usable_identifier(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_IDENTIFIER_BYTES
        && id != "."
        && id != ".."
        && !id.chars().any(|c| c == '/' || c == '\\' || c.is_control())
}

/// The model directory of a model whose identifier is `id`: the model's own `localModelPath` when
/// it answers with an absolute path whose last component is `id` (what the framework reads and
/// removes), else `<temp_root>/<id>`. Fails with advice when `id` cannot name a directory; there
/// is no substitute name, because the compiler reads the directory named by the identifier.
pub fn model_dir(id: Option<&str>, local_model_path: Option<PathBuf>, temp_root: &Path) -> Result<PathBuf, AppleError> {
    let id = match id {
        Some(id) if usable_identifier(id) => id,
        other => {
            let got = match other {
                None => "no identifier".to_string(),
                Some(id) => format!("{:?} ({} bytes)", id.chars().take(80).collect::<String>(), id.len()),
            };
            return Err(AppleError::Identifier(got));
        }
    };
    let own = local_model_path.filter(|p| p.is_absolute() && p.file_name().is_some_and(|n| n == id));
    Ok(own.unwrap_or_else(|| temp_root.join(id)))
}

#[cfg(test)]
pub(crate) fn test_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "anelm-apple-test-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&d);
    d
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn weights() -> WeightFiles {
        let mut w = WeightFiles::new();
        w.insert("@model_path/weights/w_up.bin", vec![7; 200]);
        w.insert("@model_path/weights/w_down.bin", vec![8; 130]);
        w
    }

    #[test]
    fn model_dir_lists_mil_then_weights_without_prefix() {
        let w = weights();
        let files = model_dir_files("program(1.0)", &w).unwrap();
        let names: Vec<String> = files.iter().map(|(p, _)| p.display().to_string()).collect();
        assert_eq!(names, ["model.mil", "weights/w_down.bin", "weights/w_up.bin"]);
        assert_eq!(files[0].1, b"program(1.0)");
        assert_eq!(files[2].1.len(), 200);
    }

    #[test]
    fn model_dir_is_written_and_removed() {
        let root = test_dir("modeldir");
        let dir = root.join("abc123");
        write_model_dir(&dir, "program(1.0)\n", &weights()).unwrap();
        assert_eq!(fs::read(dir.join("model.mil")).unwrap(), b"program(1.0)\n");
        assert_eq!(fs::read(dir.join("weights/w_up.bin")).unwrap(), vec![7; 200]);
        assert_eq!(fs::read(dir.join("weights/w_down.bin")).unwrap(), vec![8; 130]);
        // No weights: the weights/ directory still exists.
        let empty = root.join("noweights");
        write_model_dir(&empty, "x", &WeightFiles::new()).unwrap();
        assert!(empty.join("weights").is_dir());
        remove_model_dir(&dir).unwrap();
        assert!(!dir.exists());
        remove_model_dir(&dir).unwrap();
        let _ = fs::remove_dir_all(root);
    }

    #[test]
    fn bad_keys_never_reach_the_disk() {
        let root = test_dir("badkey");
        let mut w = WeightFiles::new();
        w.insert("@model_path/../escape.bin", vec![1]);
        assert!(matches!(
            write_model_dir(&root.join("x"), "m", &w),
            Err(AppleError::BadWeightKey(_))
        ));
        assert!(!root.join("escape.bin").exists());
        let _ = fs::remove_dir_all(root);
    }

    /// The framework's identifier: three SHA-256 hex digests joined by `_`.
    pub(crate) fn hex_identifier() -> String {
        format!("{}_{}_{}", "a1".repeat(32), "b2".repeat(32), "c3".repeat(32))
    }

    #[test]
    fn identifiers() {
        assert_eq!(hex_identifier().len(), 194);
        assert!(usable_identifier(&hex_identifier()));
        assert!(usable_identifier("9f3A"));
        assert!(usable_identifier(&"a".repeat(255)));
        assert!(!usable_identifier(&"a".repeat(256)));
        assert!(!usable_identifier(""));
        assert!(!usable_identifier("."));
        assert!(!usable_identifier(".."));
        assert!(!usable_identifier("../x"));
        assert!(!usable_identifier("a/b"));
        assert!(!usable_identifier("a\\b"));
        assert!(!usable_identifier("a\nb"));
        assert!(!usable_identifier("a\0b"));
    }

    #[test]
    fn the_directory_is_the_models_own_path_when_it_answers() {
        let id = hex_identifier();
        let root = Path::new("/tmp/anelm-root");
        assert_eq!(model_dir(Some(&id), None, root).unwrap(), root.join(&id));
        let own = PathBuf::from("/private/var/folders/xy/T").join(&id);
        assert_eq!(model_dir(Some(&id), Some(own.clone()), root).unwrap(), own);
        // A path that is not the model's directory is ignored.
        for odd in ["relative/x", "/elsewhere/other-name"] {
            let odd = PathBuf::from(odd.replace('x', &id));
            assert_eq!(model_dir(Some(&id), Some(odd), root).unwrap(), root.join(&id));
        }
        let e = model_dir(None, None, root).unwrap_err().to_string();
        assert!(e.contains("hexStringIdentifier") && e.contains("no identifier"), "{e}");
        let e = model_dir(Some("../../etc"), None, root).unwrap_err().to_string();
        assert!(e.contains("\"../../etc\""), "{e}");
        assert!(model_dir(Some(&"f".repeat(300)), None, root).is_err());
    }
}
