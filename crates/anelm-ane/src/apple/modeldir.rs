//! The on-disk side of a kernel: the model directory the framework expects (ane-runtime.md
//! §2.2 step 4, ane-hardware.md §1.2 step 3).
//!
//! `<tmp>/<hexId>/model.mil` holds the MIL text, and every weight file is written to
//! `<tmp>/<hexId>/<key without @model_path/>` (e.g. `weights/wq.bin`), `weights/` included even
//! when there are none. The compile-cache markers are [`crate::CompileCache`]'s.

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
    let files = model_dir_files(mil_text, weights)?;
    let wdir = dir.join("weights");
    fs::create_dir_all(&wdir).map_err(|e| AppleError::io("create", &wdir, &e))?;
    for (rel, bytes) in files {
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(|e| AppleError::io("create", parent, &e))?;
        }
        fs::write(&path, bytes).map_err(|e| AppleError::io("write", &path, &e))?;
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

/// An identifier usable as a directory and marker name: non-empty, at most 128 characters of
/// `[0-9A-Za-z_-]`. The framework's `hexStringIdentifier` is hex; a UUID string qualifies too.
pub fn usable_identifier(id: Option<String>) -> Option<String> {
    let id = id?;
    let ok =
        !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    ok.then_some(id)
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
mod tests {
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

    #[test]
    fn identifiers() {
        assert_eq!(usable_identifier(Some("9f3A".into())).as_deref(), Some("9f3A"));
        assert_eq!(
            usable_identifier(Some("E621E1F8-C36C-495A-93FC-0C247A3E6E5F".into())).as_deref(),
            Some("E621E1F8-C36C-495A-93FC-0C247A3E6E5F")
        );
        assert_eq!(usable_identifier(None), None);
        assert_eq!(usable_identifier(Some(String::new())), None);
        assert_eq!(usable_identifier(Some("../x".into())), None);
        assert_eq!(usable_identifier(Some("a b".into())), None);
        assert_eq!(usable_identifier(Some("a".repeat(129))), None);
    }
}
