//! The compile cache: one marker file per compiled program identifier, load-without-compile
//! first, recompile when that fails (`ane-runtime.md` §2.2 steps 5–7).
//!
//! The compiled program itself is kept by whoever compiled it (the OS ANE service on a Mac; the
//! emulator keeps nothing but the marker, which vouches that these exact bytes were validated).
//! A marker only says "this identifier compiled and loaded before, so try `load` directly". The
//! decision logic ([`compile_or_load`]) is pure and shared by the real and the emulated device.

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Environment variable that overrides the cache root (`$ANELM_CACHE_DIR/ane`).
pub const CACHE_DIR_ENV: &str = "ANELM_CACHE_DIR";

/// Markers under a cache root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    dir: PathBuf,
}

/// What [`compile_or_load`] did for one program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CacheOutcome {
    /// A marker existed and load-without-compile succeeded.
    Loaded,
    /// No marker: compiled, loaded, marker written.
    Compiled,
    /// A marker existed but loading without compile failed: marker removed, compiled again.
    Recompiled,
    /// Caching is off: compiled and loaded, no marker touched.
    Uncached,
}

impl CacheOutcome {
    /// Whether the compiler ran.
    pub fn compiled(self) -> bool {
        !matches!(self, CacheOutcome::Loaded)
    }
}

impl fmt::Display for CacheOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CacheOutcome::Loaded => "cache load",
            CacheOutcome::Compiled => "compiled",
            CacheOutcome::Recompiled => "stale marker, recompiled",
            CacheOutcome::Uncached => "compiled (cache off)",
        })
    }
}

impl CompileCache {
    /// Markers under `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into() }
    }

    /// The user cache: `$ANELM_CACHE_DIR/ane`, else `~/Library/Caches/anelm/ane` on macOS,
    /// `$XDG_CACHE_HOME/anelm/ane` or `~/.cache/anelm/ane` elsewhere. `None` without a home.
    pub fn user_default() -> Option<Self> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(root) = env(CACHE_DIR_ENV) {
            return Some(CompileCache::new(root.join("ane")));
        }
        let home = env("HOME");
        let root = if cfg!(target_os = "macos") {
            home.map(|h| h.join("Library/Caches"))
        } else {
            env("XDG_CACHE_HOME").or_else(|| home.map(|h| h.join(".cache")))
        }?;
        Some(CompileCache::new(root.join("anelm").join("ane")))
    }

    /// The directory markers live in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The marker of `id`: `<dir>/compiled_markers/<id>.ok`. `None` if `id` is not a plain
    /// identifier (only ASCII letters, digits, `-` and `_`; never a path).
    pub fn marker_path(&self, id: &str) -> Option<PathBuf> {
        let plain = !id.is_empty()
            && id.len() <= 128
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        plain.then(|| self.dir.join("compiled_markers").join(format!("{id}.ok")))
    }

    /// Whether `id` has a marker.
    pub fn has_marker(&self, id: &str) -> bool {
        self.marker_path(id).is_some_and(|p| p.is_file())
    }

    /// Record that `id` compiled and loaded (content `ok`, written atomically).
    pub fn write_marker(&self, id: &str) -> io::Result<()> {
        let path = self
            .marker_path(id)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("bad cache identifier {id:?}")))?;
        let parent = path.parent().unwrap_or(&self.dir);
        fs::create_dir_all(parent)?;
        let tmp = parent.join(format!(".{id}.{}.tmp", std::process::id()));
        fs::write(&tmp, b"ok")?;
        fs::rename(&tmp, &path)
    }

    /// Forget `id` (no error if it had no marker).
    pub fn remove_marker(&self, id: &str) -> io::Result<()> {
        match self.marker_path(id) {
            Some(p) => match fs::remove_file(p) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }

    /// Number of markers (for `anelm compile` reports).
    pub fn marker_count(&self) -> usize {
        fs::read_dir(self.dir.join("compiled_markers")).map_or(0, |rd| {
            rd.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "ok"))
                .count()
        })
    }
}

/// Compile a program through the cache: with a marker for `id`, try `load_without_compile`
/// first; if there is none, or that fails (the marker is removed), `compile_and_load`, then
/// write the marker. With `cache = None` only `compile_and_load` runs. A marker that cannot be
/// written does not fail the compile (the cache is an optimisation).
pub fn compile_or_load<T, E>(
    cache: Option<&CompileCache>,
    id: &str,
    load_without_compile: impl FnOnce() -> Result<T, E>,
    compile_and_load: impl FnOnce() -> Result<T, E>,
) -> Result<(T, CacheOutcome), E> {
    let Some(cache) = cache else {
        return compile_and_load().map(|t| (t, CacheOutcome::Uncached));
    };
    let mut outcome = CacheOutcome::Compiled;
    if cache.has_marker(id) {
        match load_without_compile() {
            Ok(t) => return Ok((t, CacheOutcome::Loaded)),
            Err(_) => {
                let _ = cache.remove_marker(id);
                outcome = CacheOutcome::Recompiled;
            }
        }
    }
    match compile_and_load() {
        Ok(t) => {
            let _ = cache.write_marker(id);
            Ok((t, outcome))
        }
        Err(e) => {
            let _ = cache.remove_marker(id);
            Err(e)
        }
    }
}

/// A content identifier for a program: SHA-256 over `salt` (device and its settings), the MIL
/// text and every weight file (path and bytes, in path order), as 64 hex digits. Identical
/// programs with identical weights get identical identifiers across runs and models.
pub fn content_id<'a>(salt: &str, mil_text: &str, weights: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut h = Sha256::new();
    let mut field = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(salt.as_bytes());
    field(mil_text.as_bytes());
    for (path, bytes) in weights {
        field(path.as_bytes());
        field(bytes);
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
