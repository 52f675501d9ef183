//! A prompt cache that outlives the process: the state of long prompt prefixes (KV rows, and for
//! hybrid models the recurrent state at the same boundary) saved under a directory, one file per
//! prefix, and restored into a session after a restart so a request sharing the prefix prefills
//! only the rest.
//!
//! - **Crash safety.** An entry is written to a temporary file in the same directory, synced,
//!   renamed over its final name and the directory synced: a crash at any instant leaves the old
//!   state or the new one. Leftover temporary files are deleted at open.
//! - **Checks.** Each file carries a model identity key ([`ModelIdentity`](crate::ModelIdentity)),
//!   the prefix's token ids and CRC32s (`prompt_cache_file.rs`). At open the index is rebuilt
//!   from headers only; an entry with a bad header, a length other than its header says
//!   (torn) or another model's key is deleted. Before use the whole file is checked; a corrupt
//!   entry, or one a session refuses, is deleted and never used.
//! - **Budget.** Entries are evicted least recently used first (last use is the file's
//!   modification time, so the order survives restarts) to keep the directory within its byte
//!   budget; an entry larger than the budget is not written.
//! - **Writes happen on a background thread**: [`PromptCache::store`] serialises the state in
//!   memory and queues it; when the queue is full the entry is dropped, not waited for.
//! - Files are readable by the user alone (0600, directory 0700) on unix.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::SystemTime;

use crate::prompt_cache_file::{EXTENSION, Entry, entry_len, file_name, final_crc, header_bytes, read_header};
use crate::session::Session;

/// How a prompt cache is sized and what it keeps.
#[derive(Clone, Debug)]
pub struct PromptCacheOptions {
    /// Most bytes the entries may take on disk.
    pub max_bytes: u64,
    /// Shortest prefix (in tokens) worth saving; shorter ones prefill about as fast as they load.
    pub min_tokens: usize,
    /// Entries that may wait for the writer thread; more are dropped. Each holds its state in
    /// memory until written.
    pub queue: usize,
    /// Also save every long prompt (less its last token) when its prefill reaches that point,
    /// not only prefixes two requests were seen to share. Off suits a stream of long unique
    /// prompts (a batch of distinct documents), whose entries would only churn the budget.
    pub save_prompts: bool,
}

impl Default for PromptCacheOptions {
    fn default() -> Self {
        Self {
            max_bytes: 4 << 30,
            min_tokens: 256,
            queue: 4,
            save_prompts: true,
        }
    }
}

/// A point-in-time copy of the cache's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromptCacheStats {
    /// Bytes of the entries on disk.
    pub bytes: u64,
    /// Entries on disk.
    pub entries: u64,
    /// Lookups that restored a prefix.
    pub hits: u64,
    /// Lookups that found nothing usable.
    pub misses: u64,
    /// Prompt tokens restored instead of prefilled.
    pub tokens_restored: u64,
    /// Entries deleted as unusable: torn, corrupt, another model's, or refused by the session.
    pub discarded: u64,
    /// Entries evicted to stay within the budget.
    pub evicted: u64,
    /// Entries written.
    pub writes: u64,
    /// Writes that failed (disk full, permissions: see the log).
    pub write_failures: u64,
    /// Entries not written because the writer was behind or the entry exceeds the budget.
    pub dropped: u64,
}

/// Why the cache could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum PromptCacheError {
    /// The directory could not be created or read.
    #[error(
        "prompt cache directory {path}: {source}; check that it is writable by this user, choose another --data-dir, or run with --no-prompt-cache"
    )]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The writer thread could not start.
    #[error("could not start the prompt cache writer thread: {0}; run with --no-prompt-cache")]
    Thread(std::io::Error),
}

#[derive(Debug)]
struct IndexEntry {
    tokens: Vec<u32>,
    bytes: u64,
    last_used: SystemTime,
    rewindable: bool,
}

#[derive(Debug, Default)]
struct Index {
    entries: HashMap<String, IndexEntry>,
    /// Names queued for the writer.
    pending: HashSet<String>,
    total: u64,
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    tokens_restored: AtomicU64,
    discarded: AtomicU64,
    evicted: AtomicU64,
    writes: AtomicU64,
    write_failures: AtomicU64,
    dropped: AtomicU64,
}

struct Shared {
    dir: PathBuf,
    key: Vec<u8>,
    opts: PromptCacheOptions,
    index: Mutex<Index>,
    counters: Counters,
}

enum Job {
    Write {
        name: String,
        tokens: Vec<u32>,
        rewindable: bool,
        payload: Vec<u8>,
    },
    Touch(String),
    Flush(SyncSender<()>),
}

/// The on-disk prompt cache of one model (see the module docs). Share it as an `Arc`; dropping
/// the last one waits for queued writes.
pub struct PromptCache {
    shared: Arc<Shared>,
    tx: Mutex<Option<SyncSender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PromptCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptCache")
            .field("dir", &self.shared.dir)
            .field("stats", &self.stats())
            .finish()
    }
}

impl PromptCache {
    /// Open (creating it if needed) the cache under `dir` for the model whose identity is
    /// `key` (e.g. a [`ModelIdentity`](crate::ModelIdentity)): the index is rebuilt from the
    /// entries' headers; unusable entries and other models' entries are deleted, and the
    /// least recently used ones beyond the budget evicted.
    pub fn open(
        dir: impl Into<PathBuf>,
        key: impl AsRef<[u8]>,
        opts: PromptCacheOptions,
    ) -> Result<Self, PromptCacheError> {
        let dir = dir.into();
        let dir_err = |source| PromptCacheError::Dir {
            path: dir.clone(),
            source,
        };
        create_private_dir(&dir).map_err(dir_err)?;
        let shared = Arc::new(Shared {
            dir: dir.clone(),
            key: key.as_ref().to_vec(),
            opts,
            index: Mutex::new(Index::default()),
            counters: Counters::default(),
        });
        shared.rescan().map_err(dir_err)?;
        let gone = shared.evict_to(&mut shared.lock(), shared.opts.max_bytes);
        shared.delete(gone);
        let (tx, rx) = sync_channel(shared.opts.queue.max(1));
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("anelm-prompt-cache".into())
                .spawn(move || writer_loop(&shared, &rx))
                .map_err(PromptCacheError::Thread)?
        };
        Ok(Self {
            shared,
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// The directory it keeps its files in.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Its options.
    pub fn options(&self) -> &PromptCacheOptions {
        &self.shared.opts
    }

    /// Current counters.
    pub fn stats(&self) -> PromptCacheStats {
        let c = &self.shared.counters;
        let (bytes, entries) = {
            let index = self.shared.lock();
            (index.total, index.entries.len() as u64)
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PromptCacheStats {
            bytes,
            entries,
            hits: get(&c.hits),
            misses: get(&c.misses),
            tokens_restored: get(&c.tokens_restored),
            discarded: get(&c.discarded),
            evicted: get(&c.evicted),
            writes: get(&c.writes),
            write_failures: get(&c.write_failures),
            dropped: get(&c.dropped),
        }
    }

    /// Whether the prefix `tokens` is stored or queued to be.
    pub fn contains(&self, tokens: &[u32]) -> bool {
        let name = self.shared.name_of(tokens);
        let index = self.shared.lock();
        index.pending.contains(&name) || index.entries.get(&name).is_some_and(|e| e.tokens == tokens)
    }

    /// The longest stored prefix usable for `prompt` at no more than `max_len` positions,
    /// without reading it: an entry whose tokens are a prefix of the prompt, or for a
    /// [rewindable](Session::prefix_rewindable) entry the part it shares with the prompt.
    pub fn longest_prefix(&self, prompt: &[u32], max_len: usize) -> Option<usize> {
        self.candidates(prompt, max_len, 0).first().map(|(_, n)| *n)
    }

    /// Entries usable for `prompt` at more than `better_than` positions, longest first.
    fn candidates(&self, prompt: &[u32], max_len: usize, better_than: usize) -> Vec<(String, usize)> {
        let index = self.shared.lock();
        let mut found: Vec<(String, usize)> = index
            .entries
            .iter()
            .filter_map(|(name, e)| {
                let common = crate::scheduler::common_prefix(&e.tokens, prompt);
                let usable = if e.rewindable {
                    common.min(max_len)
                } else if common == e.tokens.len() && common <= max_len {
                    common
                } else {
                    0
                };
                (usable > better_than && usable >= self.shared.opts.min_tokens.max(1)).then(|| (name.clone(), usable))
            })
            .collect();
        found.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        found
    }

    /// Restore into `session` the longest stored prefix of `prompt` that gives it more than
    /// `better_than` positions and at most `max_len`, and return the positions it now holds.
    /// Each candidate is read and checked in full first; one that fails a check, or that the
    /// session refuses, is deleted and the next one tried. `None` (a miss) leaves the session
    /// as it was.
    pub fn restore_into(
        &self,
        session: &mut Session,
        prompt: &[u32],
        max_len: usize,
        better_than: usize,
    ) -> Option<usize> {
        let c = &self.shared.counters;
        for (name, usable) in self.candidates(prompt, max_len, better_than) {
            let path = self.shared.dir.join(&name);
            let entry = match std::fs::read(&path).map_err(Into::into).and_then(Entry::parse) {
                Ok(e) => e,
                Err(e) => {
                    self.shared.discard(&name, &e.to_string());
                    continue;
                }
            };
            let h = &entry.header;
            if h.key != self.shared.key
                || self.shared.name_of(&h.tokens) != name
                || !prompt.starts_with(&h.tokens[..usable])
            {
                self.shared.discard(&name, "its header does not match its index entry");
                continue;
            }
            match session.restore_prefix(&h.tokens, entry.payload(), usable) {
                Ok(kept) => {
                    c.hits.fetch_add(1, Ordering::Relaxed);
                    c.tokens_restored.fetch_add(kept as u64, Ordering::Relaxed);
                    self.touch(&name);
                    return Some(kept);
                }
                Err(e) => self.shared.discard(&name, &e.to_string()),
            }
        }
        c.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Save the state of `session` after its first `len` positions, if that prefix is at least
    /// [`PromptCacheOptions::min_tokens`] long, not already stored or queued, and held by the
    /// session (see [`Session::encode_prefix`]). The state is serialised here and written by
    /// the background thread; returns whether it was queued.
    pub fn store(&self, session: &Session, len: usize) -> bool {
        if len < self.shared.opts.min_tokens || len > session.len() {
            return false;
        }
        let tokens = &session.tokens()[..len];
        let name = self.shared.name_of(tokens);
        {
            let index = self.shared.lock();
            if index.pending.contains(&name) {
                return false;
            }
            if index.entries.get(&name).is_some_and(|e| e.tokens == tokens) {
                drop(index);
                self.touch(&name);
                return false;
            }
        }
        let Some(payload) = session.encode_prefix(len) else {
            return false;
        };
        let size = entry_len(self.shared.key.len(), tokens.len(), payload.len());
        if size > self.shared.opts.max_bytes {
            self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.shared.lock().pending.insert(name.clone());
        let job = Job::Write {
            name: name.clone(),
            tokens: tokens.to_vec(),
            rewindable: session.prefix_rewindable(),
            payload,
        };
        if self.send(job).is_ok() {
            return true;
        }
        self.shared.lock().pending.remove(&name);
        self.shared.counters.dropped.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Mark an entry used now (its file's modification time, for the LRU order).
    fn touch(&self, name: &str) {
        if let Some(e) = self.shared.lock().entries.get_mut(name) {
            e.last_used = SystemTime::now();
        }
        let _ = self.send(Job::Touch(name.to_string()));
    }

    fn send(&self, job: Job) -> Result<(), ()> {
        let guard = self.tx.lock().map_err(|_| ())?;
        let tx = guard.as_ref().ok_or(())?;
        match tx.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(()),
        }
    }

    /// Wait until every queued write is on disk.
    pub fn flush(&self) {
        let (ack_tx, ack_rx) = sync_channel(1);
        let sent = match self.tx.lock() {
            Ok(guard) => guard.as_ref().is_some_and(|tx| tx.send(Job::Flush(ack_tx)).is_ok()),
            Err(_) => false,
        };
        if sent {
            let _ = ack_rx.recv();
        }
    }

    /// Delete every entry file (and leftover temporary file) under `dir` without opening a
    /// cache: for `anelm cache clear`, which knows no model. Returns how many entries were
    /// deleted; a missing directory has none. A server running on the directory meanwhile finds
    /// its entries gone at its next lookup and counts them as discarded.
    pub fn clear_dir(dir: &Path) -> std::io::Result<usize> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut n = 0;
        for dirent in entries {
            let name = dirent?.file_name().to_string_lossy().into_owned();
            if name.ends_with(&format!(".{EXTENSION}")) {
                remove_if_exists(&dir.join(&name))?;
                n += usize::from(!name.starts_with(".tmp-"));
            }
        }
        Ok(n)
    }

    /// Delete every entry (after the queued writes land) and return how many were deleted.
    pub fn clear(&self) -> std::io::Result<usize> {
        self.flush();
        let mut index = self.shared.lock();
        let names: Vec<String> = index.entries.keys().cloned().collect();
        for name in &names {
            remove_if_exists(&self.shared.dir.join(name))?;
        }
        index.entries.clear();
        index.total = 0;
        Ok(names.len())
    }
}

impl Drop for PromptCache {
    fn drop(&mut self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut w) = self.writer.lock()
            && let Some(handle) = w.take()
        {
            let _ = handle.join();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn name_of(&self, tokens: &[u32]) -> String {
        file_name(&self.key, tokens)
    }

    /// Rebuild the index from the directory: headers only; unusable and foreign entries and
    /// leftover temporary files are deleted.
    fn rescan(&self) -> std::io::Result<()> {
        let mut index = self.lock();
        index.entries.clear();
        index.total = 0;
        for dirent in std::fs::read_dir(&self.dir)? {
            let Ok(dirent) = dirent else { continue };
            let name = dirent.file_name().to_string_lossy().into_owned();
            let path = dirent.path();
            if name.starts_with(".tmp-") && name.ends_with(EXTENSION) {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if !name.ends_with(&format!(".{EXTENSION}")) {
                continue;
            }
            match self.read_index_entry(&path, &name) {
                Ok(e) => {
                    index.total += e.bytes;
                    index.entries.insert(name, e);
                }
                Err(why) => {
                    tracing::info!(file = %path.display(), "prompt cache: discarding an entry: {why}");
                    let _ = std::fs::remove_file(&path);
                    self.counters.discarded.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    fn read_index_entry(&self, path: &Path, name: &str) -> Result<IndexEntry, String> {
        let mut f = File::open(path).map_err(|e| e.to_string())?;
        let meta = f.metadata().map_err(|e| e.to_string())?;
        let h = read_header(&mut f, meta.len()).map_err(|e| e.to_string())?;
        if h.key != self.key {
            return Err(
                "written for another model identity (another model file, version, precision or backend)".into(),
            );
        }
        if self.name_of(&h.tokens) != name {
            return Err("its name does not match its tokens".into());
        }
        Ok(IndexEntry {
            tokens: h.tokens,
            bytes: meta.len(),
            last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            rewindable: h.rewindable,
        })
    }

    /// Delete an unusable entry.
    fn discard(&self, name: &str, why: &str) {
        tracing::info!(entry = name, "prompt cache: discarding an entry: {why}");
        {
            let mut index = self.lock();
            if let Some(e) = index.entries.remove(name) {
                index.total = index.total.saturating_sub(e.bytes);
            }
        }
        let _ = std::fs::remove_file(self.dir.join(name));
        self.counters.discarded.fetch_add(1, Ordering::Relaxed);
    }

    /// Evict least recently used entries from the index until the total is at most `budget`;
    /// returns their names, whose files [`Shared::delete`] removes once the lock is released
    /// (the step loop takes it too, and must not wait on the disk).
    #[must_use]
    fn evict_to(&self, index: &mut Index, budget: u64) -> Vec<String> {
        let mut gone = Vec::new();
        while index.total > budget {
            let Some(lru) = index
                .entries
                .iter()
                .min_by(|a, b| a.1.last_used.cmp(&b.1.last_used).then_with(|| a.0.cmp(b.0)))
                .map(|(n, _)| n.clone())
            else {
                break;
            };
            if let Some(e) = index.entries.remove(&lru) {
                index.total = index.total.saturating_sub(e.bytes);
            }
            self.counters.evicted.fetch_add(1, Ordering::Relaxed);
            gone.push(lru);
        }
        gone
    }

    /// Delete evicted entries' files (outside the index lock).
    fn delete(&self, names: Vec<String>) {
        for name in names {
            if let Err(e) = remove_if_exists(&self.dir.join(&name)) {
                tracing::warn!(entry = name, "prompt cache: could not evict an entry: {e}");
            }
        }
    }

    fn write(&self, name: &str, tokens: &[u32], rewindable: bool, payload: &[u8]) -> std::io::Result<()> {
        let header = header_bytes(&self.key, tokens, rewindable, payload.len());
        let size = entry_len(self.key.len(), tokens.len(), payload.len());
        let gone = {
            let mut index = self.lock();
            if let Some(old) = index.entries.remove(name) {
                index.total = index.total.saturating_sub(old.bytes);
            }
            self.evict_to(&mut index, self.opts.max_bytes.saturating_sub(size))
        };
        self.delete(gone);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}-{name}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| -> std::io::Result<()> {
            let mut f = private_file(&tmp)?;
            f.write_all(&header)?;
            f.write_all(payload)?;
            f.write_all(&final_crc(&header, payload).to_le_bytes())?;
            f.sync_all()?;
            drop(f);
            std::fs::rename(&tmp, self.dir.join(name))?;
            // Makes the rename durable. Where the file system refuses to sync a directory the
            // entry may be missing after a power loss — the old state, never a torn one.
            if let Err(e) = sync_dir(&self.dir) {
                tracing::debug!("prompt cache: could not sync the directory: {e}");
            }
            Ok(())
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        let mut index = self.lock();
        index.total += size;
        index.entries.insert(
            name.to_string(),
            IndexEntry {
                tokens: tokens.to_vec(),
                bytes: size,
                last_used: SystemTime::now(),
                rewindable,
            },
        );
        // Another writer's entry may have landed meanwhile (never beyond the budget for long).
        let gone = self.evict_to(&mut index, self.opts.max_bytes);
        drop(index);
        self.delete(gone);
        Ok(())
    }
}

fn writer_loop(shared: &Shared, rx: &Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        match job {
            Job::Write {
                name,
                tokens,
                rewindable,
                payload,
            } => {
                match shared.write(&name, &tokens, rewindable, &payload) {
                    Ok(()) => shared.counters.writes.fetch_add(1, Ordering::Relaxed),
                    Err(e) => {
                        tracing::warn!(entry = name, "prompt cache: could not write an entry: {e}");
                        shared.counters.write_failures.fetch_add(1, Ordering::Relaxed)
                    }
                };
                shared.lock().pending.remove(&name);
            }
            Job::Touch(name) => {
                let path = shared.dir.join(&name);
                if let Ok(f) = OpenOptions::new().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
            }
            Job::Flush(ack) => {
                let _ = ack.send(());
            }
        }
    }
}

fn remove_if_exists(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Create `dir` (and missing parents) readable by the user alone.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        b.mode(0o700);
        b.create(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
    }
    #[cfg(not(unix))]
    b.create(dir)
}

/// A new file readable and writable by the user alone.
fn private_file(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600);
    }
    o.open(path)
}

/// Make a rename in `dir` durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_cache::KvCache;
    use crate::session::RecurrentLayer;

    /// A fresh directory under the system temp dir, removed on drop.
    pub(crate) struct TempDir(pub PathBuf);

    impl TempDir {
        pub(crate) fn new(tag: &str) -> Self {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "anelm-pc-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&p);
            Self(p)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn opts(max_bytes: u64) -> PromptCacheOptions {
        PromptCacheOptions {
            max_bytes,
            min_tokens: 8,
            queue: 4,
            save_prompts: true,
        }
    }

    /// A hybrid-shaped session holding `tokens` (KV rows and recurrent state derived from them).
    fn session_with(tokens: &[u32], recurrent: bool) -> Session {
        let kv = KvCache::new(2, 4).with_heads(2);
        let rec = if recurrent {
            vec![RecurrentLayer::zeros(3, 6), RecurrentLayer::default()]
        } else {
            Vec::new()
        };
        let mut s = Session::with_recurrent(kv, rec, 1024);
        for &t in tokens {
            let row: Vec<f32> = (0..4).map(|i| t as f32 * 0.5 + i as f32).collect();
            for l in &mut s.kv.layers {
                l.reserve_step(1, 4);
                l.push(&row, &row);
            }
            if recurrent {
                s.recurrent[0].state.iter_mut().for_each(|x| *x = *x * 0.9 + t as f32);
            }
            s.push_tokens(&[t]);
        }
        s
    }

    fn empty(recurrent: bool) -> Session {
        session_with(&[], recurrent)
    }

    fn prompt(seed: u32, n: usize) -> Vec<u32> {
        (0..n as u32).map(|i| (i * 7 + seed * 13) % 97 + 1).collect()
    }

    fn entry_files(dir: &Path) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == EXTENSION))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_stored_prefix_is_found_after_a_restart_and_restores_bit_for_bit() {
        let dir = TempDir::new("restart");
        let p = prompt(1, 40);
        let src = session_with(&p, true);
        {
            let cache = PromptCache::open(&dir.0, b"model-a", opts(1 << 20)).unwrap();
            assert!(cache.store(&src, 40));
            assert!(!cache.store(&src, 40), "queued once");
            cache.flush();
            assert!(cache.contains(&p));
            assert!(!cache.store(&src, 4), "shorter than min_tokens");
            let s = cache.stats();
            assert_eq!((s.entries, s.writes), (1, 1));
            assert!(s.bytes > 40 * 4 * 2 * 2 * 4);
        }
        // A new process: the index is rebuilt from the file.
        let cache = PromptCache::open(&dir.0, b"model-a", opts(1 << 20)).unwrap();
        let mut longer = p.clone();
        longer.extend([5, 6, 7]);
        assert_eq!(cache.longest_prefix(&longer, 42), Some(40));
        assert_eq!(
            cache.longest_prefix(&longer, 39),
            None,
            "recurrent: only the whole entry"
        );
        assert_eq!(cache.longest_prefix(&prompt(2, 40), 40), None);
        let mut d = empty(true);
        assert_eq!(cache.restore_into(&mut d, &longer, 42, 0), Some(40));
        assert_eq!(d.tokens(), src.tokens());
        assert_eq!(d.recurrent, src.recurrent);
        assert_eq!(d.encode_prefix(40), src.encode_prefix(40), "bit for bit");
        let s = cache.stats();
        assert_eq!((s.hits, s.tokens_restored, s.misses), (1, 40, 0));
        // Nothing better than what the session already has: a miss, the session untouched.
        assert_eq!(cache.restore_into(&mut d, &longer, 42, 40), None);
        assert_eq!(cache.stats().misses, 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&dir.0), 0o700);
            for f in entry_files(&dir.0) {
                assert_eq!(mode(&f), 0o600);
            }
        }
    }

    #[test]
    fn an_attention_only_entry_serves_any_shared_part_of_it() {
        let dir = TempDir::new("rewind");
        let cache = PromptCache::open(&dir.0, b"m", opts(1 << 20)).unwrap();
        let p = prompt(3, 30);
        let src = session_with(&p, false);
        assert!(cache.store(&src, 30));
        cache.flush();
        // Same first 20 tokens, then different.
        let mut other = p[..20].to_vec();
        other.extend([99, 98, 97]);
        assert_eq!(cache.longest_prefix(&other, 22), Some(20));
        let mut d = session_with(&[1, 2, 3], false);
        assert_eq!(cache.restore_into(&mut d, &other, 22, 0), Some(20));
        assert_eq!(d.encode_prefix(20), src.encode_prefix(20));
    }

    #[test]
    fn torn_corrupt_and_foreign_entries_are_discarded_never_used() {
        let dir = TempDir::new("bad");
        let (a, b, c) = (prompt(1, 20), prompt(2, 20), prompt(3, 20));
        {
            let cache = PromptCache::open(&dir.0, b"model-a", opts(1 << 20)).unwrap();
            for p in [&a, &b, &c] {
                assert!(cache.store(&session_with(p, true), 20));
            }
            cache.flush();
            assert_eq!(cache.stats().entries, 3);
        }
        let name = |p: &[u32]| dir.0.join(file_name(b"model-a", p));
        // a: torn (the tail of the write never landed).
        let fa = name(&a);
        let len = std::fs::metadata(&fa).unwrap().len();
        File::options()
            .write(true)
            .open(&fa)
            .unwrap()
            .set_len(len - 100)
            .unwrap();
        // b: one flipped payload byte.
        let fb = name(&b);
        let mut bytes = std::fs::read(&fb).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x10;
        std::fs::write(&fb, bytes).unwrap();
        // A leftover temporary file of a write a crash interrupted.
        std::fs::write(dir.0.join(format!(".tmp-1-2-x.{EXTENSION}")), b"half").unwrap();
        let cache = PromptCache::open(&dir.0, b"model-a", opts(1 << 20)).unwrap();
        assert_eq!(cache.stats().discarded, 1, "the torn entry, at open from its header");
        assert!(!fa.exists());
        assert_eq!(entry_files(&dir.0).len(), 2);
        assert!(!dir.0.join(format!(".tmp-1-2-x.{EXTENSION}")).exists());
        // The corrupt payload is found when it is about to be used.
        let mut d = empty(true);
        assert_eq!(cache.restore_into(&mut d, &b, 20, 0), None);
        assert!(d.is_empty());
        assert!(!fb.exists());
        assert_eq!(cache.stats().discarded, 2);
        assert_eq!(cache.restore_into(&mut d, &c, 20, 0), Some(20));
        drop(cache);
        // Another model's identity: c is discarded, not used.
        let other = PromptCache::open(&dir.0, b"model-b", opts(1 << 20)).unwrap();
        assert_eq!(other.stats().discarded, 1);
        assert_eq!(other.stats().entries, 0);
        assert_eq!(other.restore_into(&mut empty(true), &c, 20, 0), None);
        assert!(entry_files(&dir.0).is_empty());
    }

    #[test]
    fn a_session_of_another_shape_refuses_an_entry_and_it_is_discarded() {
        let dir = TempDir::new("shape");
        let cache = PromptCache::open(&dir.0, b"same-key", opts(1 << 20)).unwrap();
        let p = prompt(4, 16);
        assert!(cache.store(&session_with(&p, true), 16));
        cache.flush();
        let mut wrong = empty(false);
        assert_eq!(cache.restore_into(&mut wrong, &p, 16, 0), None);
        assert_eq!(cache.stats().discarded, 1);
        assert_eq!(cache.stats().entries, 0);
    }

    #[test]
    fn the_budget_evicts_least_recently_used_entries_first_and_clear_empties() {
        let dir = TempDir::new("lru");
        let p: Vec<Vec<u32>> = (0..4).map(|i| prompt(10 + i, 24)).collect();
        let size = {
            let probe = PromptCache::open(&dir.0, b"k", opts(1 << 20)).unwrap();
            assert!(probe.store(&session_with(&p[0], false), 24));
            probe.flush();
            let s = probe.stats().bytes;
            probe.clear().unwrap();
            s
        };
        // Room for three entries.
        let cache = PromptCache::open(&dir.0, b"k", opts(3 * size + size / 2)).unwrap();
        for q in &p[..3] {
            assert!(cache.store(&session_with(q, false), 24));
            cache.flush();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Use the oldest: the second becomes least recently used.
        assert_eq!(cache.restore_into(&mut empty(false), &p[0], 24, 0), Some(24));
        cache.flush();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(cache.store(&session_with(&p[3], false), 24));
        cache.flush();
        let s = cache.stats();
        assert_eq!((s.entries, s.evicted), (3, 1));
        assert!(s.bytes <= 3 * size + size / 2);
        assert!(cache.contains(&p[0]) && !cache.contains(&p[1]) && cache.contains(&p[2]) && cache.contains(&p[3]));
        drop(cache);
        // The order survives a restart (file times), and a smaller budget evicts at open.
        let cache = PromptCache::open(&dir.0, b"k", opts(size + size / 2)).unwrap();
        assert_eq!(cache.stats().entries, 1);
        assert!(cache.contains(&p[3]), "the most recently used one stays");
        // An entry larger than the whole budget is not written.
        let tiny = PromptCache::open(&dir.0, b"k", opts(size / 2)).unwrap();
        assert_eq!(tiny.stats().entries, 0);
        assert!(!tiny.store(&session_with(&p[1], false), 24));
        assert_eq!(tiny.stats().dropped, 1);
        drop((cache, tiny));
        let cache = PromptCache::open(&dir.0, b"k", opts(1 << 20)).unwrap();
        assert!(cache.store(&session_with(&p[1], false), 24));
        assert_eq!(cache.clear().unwrap(), 1);
        assert_eq!(cache.stats().entries, 0);
        assert!(entry_files(&dir.0).is_empty());
        // Clearing the directory without a cache (no model known), under a running one.
        assert!(cache.store(&session_with(&p[2], false), 24));
        cache.flush();
        std::fs::write(dir.0.join("unrelated.txt"), b"kept").unwrap();
        assert_eq!(PromptCache::clear_dir(&dir.0).unwrap(), 1);
        assert!(entry_files(&dir.0).is_empty() && dir.0.join("unrelated.txt").exists());
        assert_eq!(cache.restore_into(&mut empty(false), &p[2], 24, 0), None);
        assert_eq!(cache.stats().entries, 0, "the running cache drops the vanished entry");
        assert_eq!(PromptCache::clear_dir(&dir.0.join("missing")).unwrap(), 0);
    }
}
