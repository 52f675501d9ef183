//! Errors of the Apple Neural Engine device, and how they become [`AneError`]s.
//!
//! Every `NSError` the framework hands back is turned into text at once (its `description`),
//! so an error here never holds an Objective-C object and can cross threads freely.

use thiserror::Error;

use crate::error::AneError;

/// What to tell a user whose machine has no usable Neural Engine.
pub const NO_ANE: &str = "no Neural Engine on this machine: use --device cpu or ane-emu";

/// A failure of the Apple Neural Engine device.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AppleError {
    /// The runtime, a framework or a required class is missing: there is no usable ANE here.
    #[error("{NO_ANE} ({detail})")]
    Unavailable {
        /// Which step failed and how (the `dlopen` message, the missing class).
        detail: String,
    },
    /// A call that returns an object returned nil (the framework gives no NSError for these).
    #[error("{call} returned nil{hint}")]
    Nil {
        /// The Objective-C call, e.g. `+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]`.
        call: &'static str,
        /// Extra advice (may be empty).
        hint: String,
    },
    /// A call that reports `BOOL` + `NSError**` failed.
    #[error("{call} failed for {kernel}: {description}{}", ns_hint(description))]
    Call {
        /// The Objective-C call.
        call: &'static str,
        /// The kernel it was for.
        kernel: String,
        /// The NSError's `description`, or a note that none was given.
        description: String,
    },
    /// Loading a kernel failed: most often the per-process budget of loaded kernels.
    #[error(
        "loading {kernel} failed with {loaded} kernel(s) ({loaded_mb} MB of weights) already loaded in this \
         process: {description}. The Neural Engine limits what one process keeps loaded (~3.5 GB on M3 Max / \
         macOS 26; bigger kernels leave room for fewer); unload kernels, or let the planner fall back (FFN: \
         resadd → plain → chunked; LM head: CPU)"
    )]
    Load {
        /// The kernel that did not load.
        kernel: String,
        /// Kernels loaded in this process when it failed.
        loaded: usize,
        /// Megabytes (10⁶ bytes) of constants those kernels hold.
        loaded_mb: u64,
        /// The NSError's `description`.
        description: String,
    },
    /// The model's `hexStringIdentifier` cannot name its model directory.
    #[error(
        "-[_ANEInMemoryModel hexStringIdentifier] gave {0}, which cannot name the model directory (a single path \
         component of at most 255 bytes); the compiler reads <NSTemporaryDirectory()>/<identifier>/model.mil, so \
         there is no other name to use. Run `anelm doctor` and report the macOS version"
    )]
    Identifier(String),
    /// A Neural Engine limit the device enforces itself (compile budget, surface size); becomes
    /// [`AneError::Rule`].
    #[error("ANE rule `{rule}` broken: {detail}. Fix: {advice}", advice = rule.advice())]
    Rule {
        /// The rule.
        rule: crate::rules::Rule,
        /// What exactly broke it.
        detail: String,
    },
    /// The cache path declined: the ANE service does not hold this program (the caller compiles).
    #[error("not loaded from the compile cache ({0}); compile it")]
    NotCached(String),
    /// A weights-dictionary key the on-disk model directory cannot hold.
    #[error("weight file key `{0}` must start with `@model_path/` and name a relative path without `..`")]
    BadWeightKey(String),
    /// The MIL program's signature cannot be bound to IOSurfaces.
    #[error("{0}")]
    Signature(String),
    /// A string handed to the runtime contains a NUL byte.
    #[error("string for {what} contains a NUL byte")]
    Nul {
        /// What the string was.
        what: &'static str,
    },
    /// An IOSurface could not be created, locked or sized.
    #[error("IOSurface: {0}")]
    Surface(String),
    /// Writing or removing the on-disk model directory or a cache marker failed.
    #[error("{action} {path}: {message}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: String,
        /// The OS error.
        message: String,
    },
}

/// Extra advice for NSError descriptions that are known to mean something specific.
fn ns_hint(description: &str) -> &'static str {
    let d = description.to_ascii_lowercase();
    if d.contains("0x1d") {
        " (status 0x1d: an earlier bad program, e.g. one using `tile`, can poison the process, and \
         some multi-input requests fail this way; restart the process and run `anelm doctor`)"
    } else {
        ""
    }
}

/// The text of an NSError for a message: its description, or a note when the call gave none.
pub fn ns_error_text(description: Option<String>) -> String {
    match description {
        Some(d) if !d.trim().is_empty() => d,
        _ => "the call returned NO without an NSError".to_string(),
    }
}

impl AppleError {
    /// An I/O failure on `path`.
    pub(crate) fn io(action: &'static str, path: &std::path::Path, e: &std::io::Error) -> AppleError {
        AppleError::Io {
            action,
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }

    /// The device is unavailable because of `detail`.
    pub(crate) fn unavailable(detail: impl Into<String>) -> AppleError {
        AppleError::Unavailable { detail: detail.into() }
    }

    /// True for failures that mean "no ANE here" rather than "this kernel failed".
    pub fn is_unavailable(&self) -> bool {
        matches!(self, AppleError::Unavailable { .. })
    }
}

impl From<AppleError> for AneError {
    fn from(e: AppleError) -> AneError {
        match e {
            AppleError::Unavailable { .. } => AneError::Unavailable(e.to_string()),
            AppleError::Rule { rule, detail } => AneError::Rule { rule, detail },
            other => AneError::Framework(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_says_what_to_do() {
        let e = AppleError::unavailable("dlopen(/usr/lib/libobjc.A.dylib): not found");
        let msg = e.to_string();
        assert!(msg.starts_with(NO_ANE), "{msg}");
        assert!(msg.contains("libobjc"), "{msg}");
        let ane: AneError = e.into();
        assert!(
            matches!(&ane, AneError::Unavailable(m) if m.starts_with(NO_ANE)),
            "{ane}"
        );
    }

    #[test]
    fn call_errors_carry_the_ns_description_and_map_to_framework() {
        let e = AppleError::Call {
            call: "-[_ANEInMemoryModel compileWithQoS:options:error:]",
            kernel: "kernel ab12 (1 → 1)".into(),
            description: ns_error_text(Some("Error Domain=com.apple.ane Code=3 \"bad MIL\"".into())),
        };
        let msg = e.to_string();
        assert!(msg.contains("compileWithQoS:options:error:"), "{msg}");
        assert!(msg.contains("bad MIL"), "{msg}");
        assert!(msg.contains("kernel ab12"), "{msg}");
        assert!(!msg.contains("0x1d"), "{msg}");
        let ane: AneError = e.into();
        assert!(matches!(&ane, AneError::Framework(m) if m.contains("bad MIL")), "{ane}");
    }

    #[test]
    fn status_0x1d_gets_advice() {
        let e = AppleError::Call {
            call: "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:]",
            kernel: "k".into(),
            description: "Program Inference error status=0x1D".into(),
        };
        assert!(e.to_string().contains("restart the process"), "{e}");
    }

    #[test]
    fn missing_ns_error_is_said_plainly() {
        assert_eq!(ns_error_text(None), "the call returned NO without an NSError");
        assert_eq!(
            ns_error_text(Some("  ".into())),
            "the call returned NO without an NSError"
        );
        assert_eq!(ns_error_text(Some("x".into())), "x");
    }

    #[test]
    fn load_failures_name_the_kernel_and_the_count() {
        let e = AppleError::Load {
            kernel: "kernel 9f00 (weights/w_gate.bin)".into(),
            loaded: 113,
            loaded_mb: 3400,
            description: "no slot".into(),
        };
        let msg = e.to_string();
        assert!(msg.contains("kernel 9f00"), "{msg}");
        assert!(
            msg.contains("113 kernel(s) (3400 MB of weights) already loaded"),
            "{msg}"
        );
        assert!(msg.contains("LM head: CPU"), "{msg}");
    }
}
