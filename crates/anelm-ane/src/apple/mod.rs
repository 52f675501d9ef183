//! The real Neural Engine through Apple's private `AppleNeuralEngine.framework`.
//!
//! Everything is loaded at run time (`dlopen` through `libloading`, the Objective-C runtime's
//! C API, `objc_msgSend` cast to each method's exact C signature), so this module compiles on
//! every platform; where there is no macOS, or no framework, [`AppleAne::open`] returns
//! "no Neural Engine on this machine: use --device cpu or ane-emu".
//!
//! * [`objc`](self) — loading libobjc and the frameworks; the typed `objc_msgSend` signatures.
//! * `foundation` — the weights dictionary, index arrays, IOSurface properties (over any runtime).
//! * `framework` — the real runtime: every Foundation / ANE / IOSurface / CoreFoundation call.
//! * `modeldir` — the on-disk model directory (`<tmp>/<hexId>/model.mil`, `weights/…`).
//! * `device` — compile → load → evaluate → unload → release, the compile budget, the cache
//!   probe (`compiledModelExists`), resource release on every path.
//! * `fallback` — what the planner does when a kernel fails (FFN: resadd → plain → chunked;
//!   LM head: CPU).
//!
//! This path follows `ane-runtime.md` §2 and `ane-hardware.md` §1 call for call. It has been
//! type-checked for `aarch64-apple-darwin` but not yet run on hardware by the project.

mod device;
mod error;
mod fallback;
mod foundation;
mod framework;
mod modeldir;
mod objc;
mod runtime;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;

use anelm_mil::WeightFiles;

pub use device::{AppleConfig, AppleStats, LOAD_RETRY_DELAY, MAX_COMPILES_ENV};
pub use error::{AppleError, NO_ANE, ns_error_text};
pub use fallback::{Fallback, FfnForm, fallback};
pub use foundation::{
    MODEL_PATH_PREFIX, WEIGHT_ENTRY_OFFSET, fp16_tensor_bytes, relative_weight_path, surface_alloc_bytes,
    surface_properties,
};
pub use framework::{
    CLIENT_CLASS, DIRECT_EVAL_SELECTOR, OPTIONAL_MODEL_METHODS, ProbeStep, REQUIRED_CLASSES, REQUIRED_METHODS,
    SELECTOR_ARITIES,
};
pub use modeldir::{
    MAX_IDENTIFIER_BYTES, MODEL_MIL, model_dir, model_dir_files, remove_model_dir, usable_identifier, write_model_dir,
};
pub use objc::{ANE_FRAMEWORK, COREFOUNDATION, FOUNDATION, IOSURFACE, LIBOBJC};
pub use runtime::{QOS, SurfaceKey};

use crate::device::{AneDevice, CompileBudget, DispatchTime, ProgramHandle, Signature};
use crate::error::AneError;
use crate::surface::Surface;

/// The Neural Engine of this Mac, driven through the private framework.
pub struct AppleAne {
    dev: device::Device<framework::Framework>,
    salt: String,
}

/// Where macOS records its version and build.
pub const SYSTEM_VERSION_PLIST: &str = "/System/Library/CoreServices/SystemVersion.plist";

/// The `<string>` value of `key` in a property-list XML text (enough for SystemVersion.plist).
pub fn plist_string(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("<key>{key}</key>"))?;
    let rest = &text[at..];
    let open = rest.find("<string>")? + "<string>".len();
    let close = rest[open..].find("</string>")?;
    let v = rest[open..open + close].trim();
    (!v.is_empty()).then(|| v.to_string())
}

/// `macOS <ProductVersion> (<ProductBuildVersion>)` of this machine, when it is a Mac.
pub fn macos_version() -> Option<String> {
    let text = std::fs::read_to_string(SYSTEM_VERSION_PLIST).ok()?;
    let v = plist_string(&text, "ProductVersion")?;
    Some(match plist_string(&text, "ProductBuildVersion") {
        Some(b) => format!("macOS {v} ({b})"),
        None => format!("macOS {v}"),
    })
}

/// The private framework's bundle description (an XML property list on the macOS versions that
/// keep one beside the binary; binary lists and a missing file give no version).
pub const ANE_FRAMEWORK_INFO_PLIST: &str =
    "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/Versions/A/Resources/Info.plist";

/// `<CFBundleShortVersionString> (<CFBundleVersion>)` of AppleNeuralEngine.framework, when its
/// Info.plist is readable XML: which framework build a report came from.
pub fn framework_version() -> Option<String> {
    let text = std::fs::read_to_string(ANE_FRAMEWORK_INFO_PLIST).ok()?;
    let short = plist_string(&text, "CFBundleShortVersionString");
    let build = plist_string(&text, "CFBundleVersion");
    match (short, build) {
        (Some(s), Some(b)) => Some(format!("{s} ({b})")),
        (Some(v), None) | (None, Some(v)) => Some(v),
        (None, None) => None,
    }
}

impl std::fmt::Debug for AppleAne {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppleAne").field("stats", &self.stats()).finish()
    }
}

impl AppleAne {
    /// Open the device with [`AppleConfig::from_env`].
    pub fn open() -> Result<AppleAne, AneError> {
        AppleAne::open_with(&AppleConfig::from_env())
    }

    /// Open the device: load libobjc, Foundation, CoreFoundation, IOSurface and the private
    /// framework, look up the classes. Any missing piece gives [`AneError::Unavailable`] whose
    /// message starts with [`NO_ANE`].
    pub fn open_with(cfg: &AppleConfig) -> Result<AppleAne, AneError> {
        let fw = framework::Framework::open()?;
        let dev = device::Device::new(fw, cfg.direct_eval, cfg)?;
        // A new OS build may bring a new ANE compiler: its programs get new cache identifiers.
        let salt = format!("ane/{}", macos_version().unwrap_or_default());
        Ok(AppleAne { dev, salt })
    }

    /// Check each piece `open` needs, in order, and say what was found (for `anelm doctor`).
    pub fn probe() -> Vec<ProbeStep> {
        framework::Framework::probe()
    }

    /// Counters (compiles, loads without compile, loads, kernels loaded now, dispatches).
    pub fn stats(&self) -> AppleStats {
        self.dev.stats()
    }
}

/// The device logic is itself a Neural Engine (tests drive it over the fake runtime through the
/// same trait the engine uses).
impl<R: runtime::Runtime> AneDevice for device::Device<R> {
    fn name(&self) -> &str {
        "ane"
    }

    fn compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        device::Device::compile(self, mil_text, weights)
    }

    fn load_without_compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        device::Device::load_without_compile(self, mil_text, weights)
    }

    fn compile_budget(&self) -> Option<CompileBudget> {
        device::Device::compile_budget(self)
    }

    fn load(&self, program: ProgramHandle) -> Result<(), AneError> {
        device::Device::load(self, program)
    }

    fn evaluate(
        &self,
        program: ProgramHandle,
        inputs: &[&Surface],
        outputs: &mut [Surface],
    ) -> Result<DispatchTime, AneError> {
        device::Device::evaluate(self, program, inputs, outputs)
    }

    fn unload(&self, program: ProgramHandle) -> Result<(), AneError> {
        device::Device::unload(self, program)
    }

    fn release(&self, program: ProgramHandle) -> Result<(), AneError> {
        device::Device::release(self, program)
    }

    fn signature(&self, program: ProgramHandle) -> Result<Signature, AneError> {
        device::Device::signature(self, program)
    }
}

impl AneDevice for AppleAne {
    fn name(&self) -> &str {
        "ane"
    }

    fn compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        self.dev.compile(mil_text, weights)
    }

    fn load_without_compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        self.dev.load_without_compile(mil_text, weights)
    }

    fn cache_salt(&self) -> String {
        self.salt.clone()
    }

    fn compile_budget(&self) -> Option<CompileBudget> {
        self.dev.compile_budget()
    }

    fn load(&self, program: ProgramHandle) -> Result<(), AneError> {
        self.dev.load(program)
    }

    fn evaluate(
        &self,
        program: ProgramHandle,
        inputs: &[&Surface],
        outputs: &mut [Surface],
    ) -> Result<DispatchTime, AneError> {
        self.dev.evaluate(program, inputs, outputs)
    }

    fn unload(&self, program: ProgramHandle) -> Result<(), AneError> {
        self.dev.unload(program)
    }

    fn release(&self, program: ProgramHandle) -> Result<(), AneError> {
        self.dev.release(program)
    }

    fn signature(&self, program: ProgramHandle) -> Result<Signature, AneError> {
        self.dev.signature(program)
    }
}

#[cfg(test)]
mod version_tests {
    use super::plist_string;

    #[test]
    fn system_version_plist_values() {
        let text = "<?xml version=\"1.0\"?>\n<plist version=\"1.0\">\n<dict>\n\t<key>ProductBuildVersion</key>\n\
                    \t<string>25D125</string>\n\t<key>ProductName</key>\n\t<string>macOS</string>\n\
                    \t<key>ProductVersion</key>\n\t<string>26.3.1</string>\n</dict>\n</plist>\n";
        assert_eq!(plist_string(text, "ProductVersion").as_deref(), Some("26.3.1"));
        assert_eq!(plist_string(text, "ProductBuildVersion").as_deref(), Some("25D125"));
        assert_eq!(plist_string(text, "Missing"), None);
        assert_eq!(plist_string("<key>K</key><string> </string>", "K"), None);
    }
}
