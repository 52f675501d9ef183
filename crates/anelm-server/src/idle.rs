//! The live model and idle sleep. A server that runs for hours in the background should not
//! hold a model it is not using: with `--idle-unload SECS` the model, its sessions' caches and
//! (on a Mac) its Neural Engine programs are released after that long without requests, and the
//! next request loads them again (from the compile cache) while it waits.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use anelm_engine::{LoadedModel, SchedulerConfig};

use crate::Ready;

/// Loads the model again after a sleep: the model and the scheduler settings, or why not.
pub type Loader = Arc<dyn Fn() -> Result<(Arc<LoadedModel>, SchedulerConfig), String> + Send + Sync>;

/// The model being served, when there is one, and what happens while it sleeps.
#[derive(Default)]
pub struct Live {
    slot: RwLock<Option<Arc<Ready>>>,
    /// Released for idleness (the next request reloads it).
    sleeping: AtomicBool,
    last_activity: Mutex<Option<Instant>>,
    /// Serialises reloads: concurrent requests wait for one.
    reloading: tokio::sync::Mutex<()>,
    /// Loads performed after a sleep.
    pub reloads: AtomicU64,
    /// How long the last reload took, in milliseconds.
    pub last_reload_ms: AtomicU64,
    /// Sleeps so far.
    pub sleeps: AtomicU64,
    /// The idle time `--idle-unload` gave (set when it is on).
    pub idle_after: OnceLock<Duration>,
    /// The idle time the last Ollama request asked for (`keep_alive`) in place of
    /// `idle_after`, until the model next sleeps: `Some(None)` keeps it loaded.
    keep_alive: Mutex<Option<Option<Duration>>>,
}

impl Live {
    /// The model, if it is loaded.
    pub fn get(&self) -> Option<Arc<Ready>> {
        self.slot.read().ok().and_then(|s| s.clone())
    }

    /// Make `ready` the live model; false if one already was.
    pub fn set(&self, ready: Ready) -> bool {
        let Ok(mut slot) = self.slot.write() else {
            return false;
        };
        if slot.is_some() {
            return false;
        }
        *slot = Some(Arc::new(ready));
        self.sleeping.store(false, Ordering::Release);
        true
    }

    /// Whether the model was released for idleness.
    pub fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Acquire)
    }

    /// A request arrived now.
    pub fn touch(&self) {
        if let Ok(mut t) = self.last_activity.lock() {
            *t = Some(Instant::now());
        }
    }

    fn idle_for(&self) -> Duration {
        self.last_activity
            .lock()
            .ok()
            .and_then(|t| t.map(|t| t.elapsed()))
            .unwrap_or(Duration::ZERO)
    }

    /// Ask for the model to be released after `keep` without requests (`None`: never) instead
    /// of the `--idle-unload` time, until it next sleeps; `None` (an Ollama request without
    /// `keep_alive`) goes back to the server's own.
    pub fn set_keep_alive(&self, keep: Option<Option<Duration>>) {
        if let Ok(mut k) = self.keep_alive.lock() {
            *k = keep;
        }
    }

    /// How long an idle model stays loaded: the last `keep_alive`, else `after`; `None`: for
    /// good.
    pub fn idle_limit(&self, after: Option<Duration>) -> Option<Duration> {
        match self.keep_alive.lock().ok().and_then(|k| *k) {
            Some(keep) => keep,
            None => after,
        }
    }

    /// How long until an idle model is released (`after`: the `--idle-unload` time, if on);
    /// `None`: never.
    pub fn expires_in(&self, after: Option<Duration>) -> Option<Duration> {
        self.idle_limit(after).map(|d| d.saturating_sub(self.idle_for()))
    }

    /// Release the model if it has been idle for `after` (or the last `keep_alive`) with
    /// nothing running or queued; returns whether it did. The scheduler is stopped (its thread
    /// joined) here.
    pub fn sleep_if_idle(&self, after: Duration) -> bool {
        let Some(r) = self.get() else { return false };
        let m = r.scheduler.metrics();
        let busy = m.busy_sessions.load(Ordering::Relaxed) + m.queue_depth.load(Ordering::Relaxed);
        if busy > 0 {
            // Work in progress counts as activity: the idle time starts when it ends.
            self.touch();
            return false;
        }
        match self.idle_limit(Some(after)) {
            Some(limit) if self.idle_for() >= limit => {}
            _ => return false,
        }
        self.set_keep_alive(None);
        let taken = match self.slot.write() {
            Ok(mut slot) => slot.take(),
            Err(_) => return false,
        };
        self.sleeping.store(true, Ordering::Release);
        if let Some(r) = taken {
            r.scheduler.shutdown(false);
        }
        self.sleeps.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The live model, loading it again with `loader` if it sleeps (one reload at a time).
    pub async fn wake(&self, loader: &Loader) -> Result<Arc<Ready>, String> {
        if let Some(r) = self.get() {
            return Ok(r);
        }
        let _one = self.reloading.lock().await;
        if let Some(r) = self.get() {
            return Ok(r);
        }
        let t0 = Instant::now();
        let load = loader.clone();
        let (model, cfg) = tokio::task::spawn_blocking(move || load())
            .await
            .map_err(|e| format!("the reload failed: {e}"))??;
        let scheduler = anelm_engine::Scheduler::start(model.clone(), cfg).map_err(|e| e.to_string())?;
        self.set(Ready { model, scheduler });
        self.reloads.fetch_add(1, Ordering::Relaxed);
        self.last_reload_ms
            .store(t0.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.get()
            .ok_or_else(|| "the model was released again during its reload".into())
    }
}

/// This process's resident memory in bytes, where the system tells (Linux `/proc`).
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_replaces_the_idle_time_until_reset() {
        let live = Live::default();
        let after = Some(Duration::from_secs(600));
        assert_eq!(live.idle_limit(after), after);
        assert_eq!(live.idle_limit(None), None);
        live.set_keep_alive(Some(Some(Duration::ZERO)));
        assert_eq!(live.idle_limit(after), Some(Duration::ZERO));
        live.set_keep_alive(Some(None));
        assert_eq!(live.idle_limit(after), None);
        assert_eq!(live.expires_in(after), None);
        live.set_keep_alive(None);
        live.touch();
        assert!(live.expires_in(after).is_some_and(|d| d <= Duration::from_secs(600)));
        // No model: nothing to release.
        assert!(!live.sleep_if_idle(Duration::ZERO));
    }
}
