//! What the kernel benches share.

use std::time::Duration;

/// This thread's CPU time (Linux/macOS `CLOCK_THREAD_CPUTIME_ID`): other processes on a shared
/// machine do not count in it (memory stalls still do).
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the OS defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A xorshift32 stream of values in [−0.5, 0.5): the same inputs on every run and machine.
#[allow(dead_code)] // not every bench that shares this module draws random inputs
pub fn uniform(mut seed: u32) -> impl FnMut() -> f32 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        (seed as f32 / u32::MAX as f32) - 0.5
    }
}
