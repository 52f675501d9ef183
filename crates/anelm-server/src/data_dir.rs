//! The data directory: where work that must outlive the process lives (the job database of the
//! Files and Batch APIs, the prompt cache). One server at a time owns a directory (an exclusive
//! lock on `lock`), created readable by the user alone.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

/// Why the data directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// It could not be created or opened.
    #[error("cannot use the data directory {path}: {source} (pass --data-dir DIR with a writable directory)")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Another process holds it.
    #[error(
        "the data directory {0} is in use by another anelm server: stop that one, or give this one its own --data-dir"
    )]
    Locked(PathBuf),
    /// No home directory to put the default in.
    #[error("no default data directory (neither $XDG_DATA_HOME nor $HOME is set): pass --data-dir DIR")]
    NoDefault,
}

/// The platform's usual per-user data place for anelm: `~/Library/Application Support/anelm`
/// on macOS, `$XDG_DATA_HOME/anelm` (default `~/.local/share/anelm`) elsewhere.
pub fn default_data_dir() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
    if cfg!(target_os = "macos") {
        return home.map(|h| h.join("Library/Application Support/anelm"));
    }
    match std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        Some(x) => Some(PathBuf::from(x).join("anelm")),
        None => home.map(|h| h.join(".local/share/anelm")),
    }
}

/// An opened, locked data directory.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// Held open for the lock's sake.
    _lock: File,
}

impl DataDir {
    /// Create `path` (mode 0700) if needed and take its lock.
    pub fn open(path: &Path) -> Result<Self, DataDirError> {
        let io = |source| DataDirError::Io {
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(path).map_err(io)?;
        restrict(path, 0o700).map_err(io)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.join("lock"))
            .map_err(io)?;
        match try_lock(&lock) {
            Ok(true) => {}
            Ok(false) => return Err(DataDirError::Locked(path.to_path_buf())),
            Err(e) => return Err(io(e)),
        }
        Ok(Self {
            path: path.to_path_buf(),
            _lock: lock,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The job database's file.
    pub fn jobs_db(&self) -> PathBuf {
        self.path.join("jobs.sqlite")
    }

    /// Where the prompt cache keeps its entries.
    pub fn prompt_cache(&self) -> PathBuf {
        prompt_cache_dir(&self.path)
    }
}

/// Where the prompt cache of the data directory `data_dir` keeps its entries (readable without
/// taking the directory's lock, for `anelm cache`).
pub fn prompt_cache_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("prompt-cache")
}

/// Take an exclusive advisory lock on `file` without waiting: false when another open file
/// holds it (released when the file is closed, also by a crash).
fn try_lock(file: &File) -> std::io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock(2) on a descriptor `file` owns and keeps open for the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            Ok(false)
        } else {
            Err(e)
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        Ok(true)
    }
}

/// Set `path`'s permission bits (unix; elsewhere a no-op).
pub fn restrict(path: &Path, mode: u32) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_server_per_directory() {
        let dir = std::env::temp_dir().join(crate::job_store::new_id("anelm-datadir-test-"));
        let a = DataDir::open(&dir).expect("first open");
        assert!(matches!(DataDir::open(&dir), Err(DataDirError::Locked(_))));
        drop(a);
        let b = DataDir::open(&dir).expect("reopened once released");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(b.path()).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700);
        }
        drop(b);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
