//! `anelm serve --background`: run at the operating system's background priority, so a server
//! working for hours yields the CPU to whatever the user is doing. Applied to the calling
//! thread before any other is started; every thread created afterwards (the runtime, the
//! scheduler, the kernel pool) inherits it.

use anyhow::Result;

/// Lower this thread's priority, and so that of every thread it starts; returns what was set.
#[cfg(target_os = "linux")]
pub fn enter_background() -> Result<String> {
    // SAFETY: plain system calls on the calling thread with valid arguments; no memory is
    // shared with the kernel beyond the `sched_param` read during the call.
    unsafe {
        if libc::setpriority(libc::PRIO_PROCESS, 0, 19) != 0 {
            anyhow::bail!(
                "could not lower the priority (setpriority): {}",
                std::io::Error::last_os_error()
            );
        }
        let param = libc::sched_param { sched_priority: 0 };
        if libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) != 0 {
            anyhow::bail!("could not switch to SCHED_IDLE: {}", std::io::Error::last_os_error());
        }
    }
    Ok("nice 19, SCHED_IDLE".into())
}

/// Lower this thread's priority, and so that of every thread it starts; returns what was set.
#[cfg(target_os = "macos")]
pub fn enter_background() -> Result<String> {
    /// `QOS_CLASS_UTILITY` from `<sys/qos.h>`.
    const QOS_CLASS_UTILITY: u32 = 0x11;
    unsafe extern "C" {
        fn pthread_set_qos_class_self_np(qos_class: u32, relative_priority: i32) -> i32;
    }
    // SAFETY: a libSystem call on the calling thread with a valid QoS class and offset 0.
    let rc = unsafe { pthread_set_qos_class_self_np(QOS_CLASS_UTILITY, 0) };
    if rc != 0 {
        anyhow::bail!("could not set the utility QoS class (error {rc})");
    }
    // SAFETY: a plain system call on the calling process with valid arguments.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
    Ok("QOS_CLASS_UTILITY, nice 19".into())
}

/// Lower this thread's priority, and so that of every thread it starts; returns what was set.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn enter_background() -> Result<String> {
    anyhow::bail!("--background is implemented on Linux and macOS only")
}
