//! A persistent worker pool for the kernels' parallel loops. Decode runs hundreds of short
//! matmuls per token (tens of microseconds each); a pool whose idle workers sleep pays a wake-up
//! on every one of them, and the work ends up on the calling thread. Here idle workers spin for a
//! short while (`SPIN`) before parking, so back-to-back kernels of one forward pass start at
//! once on every core, while a pool with nothing to do goes quiet within a millisecond.
//!
//! The calling thread takes part in every loop; `threads − 1` workers are started once.
//!
//! Between loops the caller often runs serial work (norms, RoPE, activation quantisation)
//! while the workers wait. [`Pool::prefetch`] names bytes the next loop will stream (the next
//! weight matrix): waiting workers pull them into cache a chunk at a time, checking for new work
//! between chunks, so the memory bus keeps working through the serial part of a decode step.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(500);

/// Bytes a waiting worker prefetches before it looks for new work again.
const PREFETCH_CHUNK: usize = 4096;

/// At most this much of a prefetch hint is pulled in (a share of one core's L2, so the
/// prefetched lines are still there when the loop reads them).
pub const PREFETCH_BUDGET: usize = 512 << 10;

type Task = dyn Fn(usize) + Sync;

struct Shared {
    /// Bumped for every published loop.
    epoch: AtomicU64,
    /// The current loop body (lifetime-erased; valid while `run` is inside that loop) and its
    /// task count, published together so a late worker never pairs a body with another count.
    job: Mutex<Option<(&'static Task, usize)>>,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Workers currently holding the job reference.
    inside: AtomicUsize,
    shutdown: AtomicBool,
    /// A task panicked during the current loop (re-raised by `run`).
    panicked: AtomicBool,
    threads: Mutex<Vec<Thread>>,
    /// The prefetch hint: start address, length, and the offset of the next chunk to claim.
    /// Only ever used as addresses for prefetch instructions, which never fault, so a worker
    /// that mixes an old and a new hint merely warms the wrong lines.
    prefetch_base: AtomicUsize,
    prefetch_len: AtomicUsize,
    prefetch_next: AtomicUsize,
}

/// Run task `i`, counting it done even if it panics (so `run` never waits forever).
fn run_task(s: &Shared, f: &(dyn Fn(usize) + Sync + '_), i: usize) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_err() {
        s.panicked.store(true, Ordering::SeqCst);
    }
    s.done.fetch_add(1, Ordering::SeqCst);
}

/// A fixed set of worker threads running index-parallel loops.
pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    size: usize,
    /// Serialises concurrent `run` calls from different threads.
    run_lock: Mutex<()>,
}

impl Pool {
    /// A pool of `threads` (≥ 1; the caller is one of them).
    pub fn new(threads: usize) -> Self {
        let size = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: Mutex::new(None),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            inside: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            prefetch_base: AtomicUsize::new(0),
            prefetch_len: AtomicUsize::new(0),
            prefetch_next: AtomicUsize::new(0),
        });
        let workers = (1..size)
            .filter_map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("anelm-kernel-{i}"))
                    .spawn(move || worker(&s))
                    .ok()
            })
            .collect::<Vec<_>>();
        if let Ok(mut t) = shared.threads.lock() {
            *t = workers.iter().map(|w| w.thread().clone()).collect();
        }
        let size = workers.len() + 1;
        Self {
            shared,
            workers,
            size,
            run_lock: Mutex::new(()),
        }
    }

    /// Threads taking part in a loop (workers + the caller).
    pub fn threads(&self) -> usize {
        self.size
    }

    /// Ask waiting workers to pull (the first [`PREFETCH_BUDGET`] bytes of) `bytes` into cache
    /// before the next loop reads them. A hint: it replaces any earlier one, costs the caller
    /// three stores, and does nothing on a one-thread pool.
    pub fn prefetch(&self, bytes: &[u8]) {
        self.prefetch_range(bytes.as_ptr() as usize, bytes.len());
    }

    /// [`Pool::prefetch`] by address; the range need not be valid memory any more (prefetch
    /// instructions never fault), which lets a hint outlive the buffer it named.
    pub fn prefetch_range(&self, base: usize, len: usize) {
        if self.size == 1 || len == 0 {
            return;
        }
        let s = &*self.shared;
        // Close the old hint first, so a worker reading in between sees an exhausted one.
        s.prefetch_next.store(usize::MAX, Ordering::Relaxed);
        s.prefetch_base.store(base, Ordering::Relaxed);
        s.prefetch_len.store(len.min(PREFETCH_BUDGET), Ordering::Relaxed);
        s.prefetch_next.store(0, Ordering::Release);
    }

    /// Call `f(i)` for every `i < n`, spread over the pool; returns when all are done.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        if self.size == 1 || n == 1 {
            (0..n).for_each(f);
            return;
        }
        let _serial = self.run_lock.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        // SAFETY: the reference is only used by workers between `inside += 1` and `inside -= 1`
        // below, and this function does not return before the job is cleared and `inside` is 0,
        // so `f` outlives every use of the erased reference.
        let erased: &'static Task = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static Task>(f) };
        // Counters first, then the job (the mutex orders them for every worker that sees it).
        s.panicked.store(false, Ordering::SeqCst);
        s.next.store(0, Ordering::SeqCst);
        s.done.store(0, Ordering::SeqCst);
        if let Ok(mut j) = s.job.lock() {
            *j = Some((erased, n));
        }
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if let Ok(ts) = s.threads.lock() {
            for t in ts.iter() {
                t.unpark();
            }
        }
        // Take part.
        loop {
            let i = s.next.fetch_add(1, Ordering::SeqCst);
            if i >= n {
                break;
            }
            run_task(s, f, i);
        }
        while s.done.load(Ordering::SeqCst) < n {
            std::hint::spin_loop();
        }
        if let Ok(mut j) = s.job.lock() {
            *j = None;
        }
        while s.inside.load(Ordering::SeqCst) > 0 {
            std::hint::spin_loop();
        }
        if s.panicked.load(Ordering::SeqCst) {
            panic!("a parallel kernel task panicked");
        }
    }
}

fn worker(s: &Shared) {
    let mut seen = s.epoch.load(Ordering::SeqCst);
    loop {
        // Wait for a new epoch: spin, then park.
        let t0 = Instant::now();
        loop {
            if s.shutdown.load(Ordering::SeqCst) {
                return;
            }
            let e = s.epoch.load(Ordering::SeqCst);
            if e != seen {
                seen = e;
                break;
            }
            if prefetch_chunk(s) {
                continue;
            }
            if t0.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::park_timeout(Duration::from_millis(100));
            }
        }
        s.inside.fetch_add(1, Ordering::SeqCst);
        let job = s.job.lock().ok().and_then(|j| *j);
        if let Some((f, n)) = job {
            loop {
                let i = s.next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    break;
                }
                run_task(s, f, i);
            }
        }
        s.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Claim and prefetch one chunk of the current hint; false when there is none left.
fn prefetch_chunk(s: &Shared) -> bool {
    let len = s.prefetch_len.load(Ordering::Relaxed);
    if s.prefetch_next.load(Ordering::Acquire) >= len {
        return false;
    }
    let at = s.prefetch_next.fetch_add(PREFETCH_CHUNK, Ordering::Relaxed);
    if at >= len {
        return false;
    }
    let base = s.prefetch_base.load(Ordering::Relaxed).wrapping_add(at);
    let end = PREFETCH_CHUNK.min(len - at);
    for off in (0..end).step_by(64) {
        prefetch_line(base.wrapping_add(off));
    }
    true
}

/// Hint the cache line at `addr` into this core's L2 (no effect where there is no instruction
/// for it). Prefetches are not memory accesses: an invalid address is ignored, not a fault.
#[inline(always)]
fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht1` only hints the cache; it reads nothing architecturally and never
    // faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(addr as *const i8);
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `prfm` is a hint; it never faults and changes no architectural state.
    unsafe {
        std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) addr, options(nostack, preserves_flags, readonly));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = addr;
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for w in &self.workers {
            w.thread().unpark();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

static GLOBAL: OnceLock<Pool> = OnceLock::new();

/// Size the process-wide kernel pool (first call wins; later calls return false).
pub fn init_global(threads: usize) -> bool {
    let mut created = false;
    GLOBAL.get_or_init(|| {
        created = true;
        Pool::new(threads)
    });
    created
}

/// The process-wide kernel pool (all cores unless [`init_global`] sized it first).
pub fn global() -> &'static Pool {
    GLOBAL.get_or_init(|| Pool::new(std::thread::available_parallelism().map_or(1, |n| n.get())))
}

/// Raw base pointer of a slice split into disjoint chunks across tasks.
struct SendPtr<T>(*mut T);
// SAFETY: `for_each_chunk_mut` hands each task a distinct, non-overlapping chunk, so sharing the
// base pointer never creates two live `&mut` to the same element.
unsafe impl<T: Send> Sync for SendPtr<T> {}
// SAFETY: see `Sync`.
unsafe impl<T: Send> Send for SendPtr<T> {}

/// `lo` and `hi` of the unclaimed units of a [`Pool::run_split`] loop, in one word.
fn pack(lo: usize, hi: usize) -> u64 {
    (lo as u64) | ((hi as u64) << 32)
}

fn unpack(v: u64) -> (usize, usize) {
    ((v & 0xFFFF_FFFF) as usize, (v >> 32) as usize)
}

impl Pool {
    /// Call `f(range)` for disjoint ranges covering `0..units`, spread over the pool: the first
    /// participant claims ranges from the front, the others from the back, each claim
    /// `1 / participants` of what is left (between `min` and `max` units; a claim restarts the
    /// thread's weight stream, so halves beat quarters, docs/field-guide.md). The front thread
    /// streams one contiguous run, the others a few long ones, and a thread that runs slower
    /// (a busy neighbour on a shared host) leaves at most one small range for the others to
    /// wait on, where fixed equal tasks leave them idle for the whole difference.
    pub fn run_split(&self, units: usize, min: usize, max: usize, f: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
        let (min, max) = (min.max(1), max.max(min.max(1)));
        if units == 0 {
            return;
        }
        let parts = self.size.min(units.div_ceil(min));
        if parts <= 1 || units > u32::MAX as usize {
            // Alone (or too many units to pack in one word): the whole range in order.
            let mut at = 0;
            while at < units {
                let end = (at + max).min(units);
                f(at..end);
                at = end;
            }
            return;
        }
        let left = AtomicU64::new(pack(0, units));
        self.run(parts, &|t| {
            loop {
                let mut cur = left.load(Ordering::Acquire);
                let claimed = loop {
                    let (lo, hi) = unpack(cur);
                    if lo >= hi {
                        break None;
                    }
                    let take = ((hi - lo) / parts).clamp(min, max).min(hi - lo);
                    let (range, next) = if t == 0 {
                        (lo..lo + take, pack(lo + take, hi))
                    } else {
                        (hi - take..hi, pack(lo, hi - take))
                    };
                    match left.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => break Some(range),
                        Err(now) => cur = now,
                    }
                };
                match claimed {
                    Some(r) => f(r),
                    None => return,
                }
            }
        });
    }

    /// Call `f(index, chunk)` for every `chunk`-sized piece of `data` (the last may be shorter),
    /// spread over the pool.
    pub fn for_each_chunk_mut<T: Send>(&self, data: &mut [T], chunk: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
        let chunk = chunk.max(1);
        let len = data.len();
        let n = len.div_ceil(chunk);
        let base = SendPtr(data.as_mut_ptr());
        let base = &base;
        self.run(n, &|i| {
            let start = i * chunk;
            let end = (start + chunk).min(len);
            // SAFETY: chunks [start, end) of distinct i never overlap and lie inside `data`, which
            // stays mutably borrowed (and alive) until `run` returns.
            let piece = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
            f(i, piece);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_index_runs_exactly_once_across_many_loops() {
        let pool = Pool::new(3);
        for n in [0usize, 1, 2, 7, 100, 1000] {
            let hits: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
        // Many short loops back to back (the decode pattern), and after the workers parked.
        let total = AtomicU64::new(0);
        for _ in 0..2000 {
            pool.run(8, &|i| {
                total.fetch_add(i as u64, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_millis(5));
        pool.run(8, &|i| {
            total.fetch_add(i as u64, Ordering::Relaxed);
        });
        assert_eq!(total.load(Ordering::Relaxed), 2001 * 28);
    }

    #[test]
    fn back_to_back_loops_of_varying_size_lose_no_task() {
        // Regression: a late worker once paired a new body with the previous loop's task count
        // and skipped tasks, so the caller waited forever.
        let pool = Pool::new(3);
        let mut expect = 0u64;
        let total = AtomicU64::new(0);
        for it in 0..20_000u64 {
            let n = (1 + (it * 7919) % 23) as usize;
            pool.run(n, &|i| {
                total.fetch_add(1 + i as u64, Ordering::Relaxed);
            });
            expect += (n * (n + 1) / 2) as u64;
            if it % 5000 == 0 {
                std::thread::sleep(Duration::from_millis(2)); // let workers park
            }
        }
        assert_eq!(total.load(Ordering::Relaxed), expect);
    }

    #[test]
    fn prefetch_hints_never_disturb_loops_even_for_unmapped_addresses() {
        let pool = Pool::new(2);
        let data = vec![7u8; 3 << 20];
        let total = AtomicU64::new(0);
        for it in 0..2000u64 {
            match it % 3 {
                0 => pool.prefetch(&data),
                // An address that is not mapped: a prefetch hint must be harmless there.
                1 => pool.prefetch_range(0x1000, PREFETCH_BUDGET),
                _ => pool.prefetch(&data[..0]),
            }
            std::thread::yield_now();
            pool.run(4, &|i| {
                total.fetch_add(1 + i as u64, Ordering::Relaxed);
            });
        }
        assert_eq!(total.load(Ordering::Relaxed), 2000 * 10);
        // A one-thread pool ignores hints.
        Pool::new(1).prefetch(&data);
    }

    #[test]
    fn split_ranges_cover_every_unit_exactly_once() {
        for threads in [1usize, 2, 3] {
            let pool = Pool::new(threads);
            for (units, min, max) in [
                (0usize, 4usize, 64usize),
                (1, 4, 64),
                (7, 4, 64),
                (192, 8, 128),
                (6144, 8, 128),
                (100, 0, 0),
            ] {
                let hits: Vec<AtomicU64> = (0..units).map(|_| AtomicU64::new(0)).collect();
                let claims = AtomicU64::new(0);
                pool.run_split(units, min, max, &|r| {
                    assert!(!r.is_empty() && r.len() <= max.max(min).max(1), "{r:?}");
                    claims.fetch_add(1, Ordering::Relaxed);
                    for i in r {
                        hits[i].fetch_add(1, Ordering::Relaxed);
                    }
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{threads} threads, {units} units"
                );
                if units >= 192 {
                    // Shares of what is left, not one unit at a time.
                    assert!(claims.load(Ordering::Relaxed) < units as u64 / 4);
                }
            }
        }
    }

    #[test]
    fn concurrent_callers_are_serialised() {
        let pool = Arc::new(Pool::new(2));
        let sum = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let (p, s) = (pool.clone(), sum.clone());
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        p.run(16, &|i| {
                            s.fetch_add(i as u64, Ordering::Relaxed);
                        });
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("caller");
        }
        assert_eq!(sum.load(Ordering::Relaxed), 4 * 200 * 120);
    }
}
