//! The device: compile → load → evaluate → unload over a [`Runtime`], following
//! ane-runtime.md §2.2–§2.5 step by step.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anelm_mil::{DType, WeightFiles, parse_program, read_blob};
use half::f16;

use super::error::AppleError;
use super::foundation::{
    fp16_tensor_bytes, index_array, relative_weight_path, surface_property_dictionary, weights_dictionary,
};
use super::modeldir::{model_dir, remove_model_dir, write_model_dir_with};
use super::objc::Id;
use super::runtime::{QOS, Runtime, SurfaceRef};
use crate::device::{DispatchTime, ProgramHandle, Signature};
use crate::error::AneError;
use crate::rules::{DEFAULT_MAX_COMPILES, MIN_SURFACE_BYTES, Rule, SURFACE_ALIGN_BYTES, group_alloc_size};
use crate::surface::Surface;

/// How long to wait before the one retry of a failed load after a compile ("ANE slot
/// reclamation", ane-hardware.md §1.2). The cache probe ([`Device::load_without_compile`]) never
/// retries: a failure there only means "compile it".
pub const LOAD_RETRY_DELAY: Duration = Duration::from_millis(100);

/// Environment variable that sets the per-process compile budget (`0`: no budget).
pub const MAX_COMPILES_ENV: &str = "ANELM_ANE_MAX_COMPILES";

/// Settings of the Apple device.
///
/// A kernel's model directory (`<tmp>/<hexId>/`) is written only to compile, and removed once the
/// program has loaded (the framework removes it on unload anyway): the OS ANE service keeps the
/// compiled program under the identifier, and a cache load asks `compiledModelExists` instead of
/// reading the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppleConfig {
    /// Per-process compile budget ([`crate::Rule::CompileBudget`]; `None`: none). Compile number
    /// budget + 1 is refused before it reaches the compiler, with advice to run again (the new
    /// process loads the compiled programs from the cache).
    pub max_compiles: Option<u64>,
    /// Evaluate through `_ANEClient doEvaluateDirectWithModel:…` when it exists (falls back to
    /// the daemon path `evaluateWithQoS:…` when the client cannot be made or a direct call fails).
    pub direct_eval: bool,
    /// Lock/unlock every surface around each write and read on the hot path (the reference skips
    /// this by default: the synchronous evaluate provides coherency).
    pub lock_surfaces: bool,
    /// Root of the model directories when the model does not answer `localModelPath` (default:
    /// `NSTemporaryDirectory()`, which is what `localModelPath` uses).
    pub temp_dir: Option<PathBuf>,
}

impl Default for AppleConfig {
    fn default() -> Self {
        AppleConfig {
            max_compiles: Some(DEFAULT_MAX_COMPILES as u64),
            direct_eval: false,
            lock_surfaces: false,
            temp_dir: None,
        }
    }
}

impl AppleConfig {
    /// The defaults, changed by `ANELM_ANE_DIRECT_EVAL=1` (direct evaluation),
    /// `ANELM_ANE_LOCKS=1` (lock surfaces on the hot path) and `ANELM_ANE_MAX_COMPILES=N` (the
    /// compile budget; `0`: none; anything but a number keeps the default).
    pub fn from_env() -> Self {
        let on = |k: &str| std::env::var(k).is_ok_and(|v| !v.is_empty() && v != "0");
        let d = AppleConfig::default();
        AppleConfig {
            direct_eval: on("ANELM_ANE_DIRECT_EVAL"),
            lock_surfaces: on("ANELM_ANE_LOCKS"),
            max_compiles: parse_max_compiles(std::env::var(MAX_COMPILES_ENV).ok().as_deref(), d.max_compiles),
            ..d
        }
    }
}

/// The compile budget an `ANELM_ANE_MAX_COMPILES` value asks for: `0` → none, `N` → `N`,
/// unset or not a number → `default`.
pub(crate) fn parse_max_compiles(v: Option<&str>, default: Option<u64>) -> Option<u64> {
    match v.map(|v| v.trim().parse::<u64>()) {
        Some(Ok(0)) => None,
        Some(Ok(n)) => Some(n),
        _ => default,
    }
}

/// Counters of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppleStats {
    /// `compileWithQoS:` calls made (what the compile budget counts).
    pub compile_attempts: u64,
    /// `compileWithQoS:` calls that succeeded.
    pub compiles: u64,
    /// Successful loads without a compile in this process (`load_without_compile`).
    pub cache_loads: u64,
    /// Successful loads.
    pub loads: u64,
    /// Kernels loaded now.
    pub loaded: usize,
    /// Constant bytes of the kernels loaded now.
    pub loaded_bytes: u64,
    /// Evaluations.
    pub dispatches: u64,
    /// True while direct evaluation through `_ANEClient` is in use.
    pub direct_eval: bool,
    /// Length in bytes of the last `hexStringIdentifier` the framework gave (0: none yet); the
    /// framework's own is 194 (three SHA-256 digests joined by `_`).
    pub identifier_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KState {
    Compiled,
    Loaded,
    Unloaded,
}

impl KState {
    fn name(self) -> &'static str {
        match self {
            KState::Compiled => "compiled (not loaded)",
            KState::Loaded => "loaded",
            KState::Unloaded => "unloaded",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    surface: SurfaceRef,
    channels: usize,
    lanes: usize,
    bytes: usize,
}

/// One kernel: a retained model, its surfaces, and the request bound to them (built once, reused).
#[derive(Debug)]
struct Kernel {
    label: String,
    id: String,
    model: Id,
    request: Id,
    inputs: Vec<Slot>,
    outputs: Vec<Slot>,
    dir: PathBuf,
    state: KState,
    const_bytes: u64,
    sig: Signature,
}

/// Halfwords as the little-endian bytes an IOSurface holds, without a copy on little-endian
/// hosts (every Mac): one memcpy per surface, no per-element serialisation.
fn le_bytes(h: &[f16]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: `f16` is `repr(transparent)` over `u16` (no padding; every byte is
        // initialised); the byte slice spans exactly the halfwords' `2·len` bytes and borrows them.
        std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(h.as_ptr().cast::<u8>(), h.len() * 2) })
    } else {
        std::borrow::Cow::Owned(h.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// Fill halfwords from the little-endian bytes `fill` writes (straight into their memory on
/// little-endian hosts).
fn read_le_bytes<E>(h: &mut [f16], fill: impl FnOnce(&mut [u8]) -> Result<(), E>) -> Result<(), E> {
    if cfg!(target_endian = "little") {
        // SAFETY: as in `le_bytes`; any bit pattern is a valid `f16`, and this mutable byte slice
        // is the only view of `h` while `fill` runs.
        fill(unsafe { std::slice::from_raw_parts_mut(h.as_mut_ptr().cast::<u8>(), h.len() * 2) })
    } else {
        let mut bytes = vec![0u8; h.len() * 2];
        fill(&mut bytes)?;
        for (x, b) in h.iter_mut().zip(bytes.chunks_exact(2)) {
            *x = f16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}

/// Pops an autorelease pool when dropped.
struct Pool<'a, R: Runtime>(&'a R, usize);

impl<'a, R: Runtime> Pool<'a, R> {
    fn new(rt: &'a R) -> Self {
        Pool(rt, rt.pool_push())
    }
}

impl<R: Runtime> Drop for Pool<'_, R> {
    fn drop(&mut self) {
        self.0.pool_pop(self.1);
    }
}

/// The device logic over a runtime (the real framework, or a fake in tests).
pub(crate) struct Device<R: Runtime> {
    rt: R,
    max_compiles: Option<u64>,
    lock_surfaces: bool,
    temp_root: PathBuf,
    /// `@{}`, retained once and passed as every `options:`.
    options: Id,
    /// `_ANEClient` for direct evaluation (+1), when asked for and available.
    client: Option<Id>,
    direct: AtomicBool,
    kernels: Mutex<BTreeMap<u64, Arc<Mutex<Kernel>>>>,
    next: AtomicU64,
    loaded: AtomicUsize,
    loaded_bytes: AtomicU64,
    compile_attempts: AtomicU64,
    compiles: AtomicU64,
    cache_loads: AtomicU64,
    loads: AtomicU64,
    dispatches: AtomicU64,
    identifier_bytes: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is completed before anything can panic, so a poisoned lock
    // still holds consistent data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Input and output surface shapes `(channels, lanes)` of a MIL program, which must be fp16
/// `[1, C, 1, W]` tensors (IOSurfaces carry nothing else), each group in sorted order of the
/// names: the framework binds a request's surfaces to the program's symbols by sorted name
/// ([`Rule::IoSortedNames`]), so the request lists them in that order whatever order the MIL
/// declares them in.
pub(crate) fn program_signature(mil_text: &str) -> Result<Signature, AneError> {
    let program = parse_program(mil_text)?;
    let main = program
        .main()
        .ok_or_else(|| AneError::Surfaces("the program has no `main` function".into()))?;
    let shape = |what: &str, v: &anelm_mil::Value| match (v.ty.dtype, v.ty.shape.as_slice()) {
        (DType::Fp16, &[1, c, 1, w]) if c > 0 && w > 0 => Ok((v.name.clone(), (c, w))),
        _ => Err(AneError::Surfaces(format!(
            "{what} `{}` is {:?}; Neural Engine I/O surfaces must be fp16 [1, C, 1, W]",
            v.name, v.ty
        ))),
    };
    let sorted = |what: &str, vals: &[anelm_mil::Value]| -> Result<Vec<(usize, usize)>, AneError> {
        let mut named = vals.iter().map(|v| shape(what, v)).collect::<Result<Vec<_>, _>>()?;
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(named.into_iter().map(|(_, s)| s).collect())
    };
    let inputs = sorted("input", &main.inputs)?;
    let outs = main.output_values();
    if outs.len() != main.outputs.len() || outs.is_empty() {
        return Err(AneError::Surfaces(
            "the program's outputs are missing or undefined".into(),
        ));
    }
    let outputs = sorted("output", &outs)?;
    Ok(Signature { inputs, outputs })
}

/// Constant payload bytes of a program's weight files (headers excluded).
pub(crate) fn const_bytes(weights: &WeightFiles) -> u64 {
    weights
        .iter()
        .map(|(_, b)| read_blob(b).map_or(b.len().saturating_sub(128), |w| w.payload.len()) as u64)
        .sum()
}

/// A kernel's name in messages: identifier prefix, shapes, weight files.
pub(crate) fn kernel_label(id: &str, sig: &Signature, weights: &WeightFiles) -> String {
    let shapes = |v: &[(usize, usize)]| {
        v.iter()
            .map(|(c, w)| format!("[1,{c},1,{w}]"))
            .collect::<Vec<_>>()
            .join("+")
    };
    let files: Vec<&str> = weights.iter().map(|(k, _)| k.rsplit('/').next().unwrap_or(k)).collect();
    let short: String = id.chars().take(12).collect();
    let w = if files.is_empty() {
        String::new()
    } else {
        format!(", weights {}", files.join(" "))
    };
    format!("kernel {short} ({} → {}{w})", shapes(&sig.inputs), shapes(&sig.outputs))
}

fn check_surfaces(
    what: &str,
    want: &[Slot],
    got: impl ExactSizeIterator<Item = (usize, usize)>,
) -> Result<(), AneError> {
    if got.len() != want.len() {
        return Err(AneError::Surfaces(format!(
            "the program has {} {what} surfaces, {} given",
            want.len(),
            got.len()
        )));
    }
    for (i, (s, (c, w))) in want.iter().zip(got).enumerate() {
        if (s.channels, s.lanes) != (c, w) {
            return Err(AneError::Surfaces(format!(
                "{what} {i} is [1, {}, 1, {}] but the surface is [1, {c}, 1, {w}]; allocate it from signature()",
                s.channels, s.lanes
            )));
        }
    }
    Ok(())
}

impl<R: Runtime> Device<R> {
    /// A device over `rt` (the runtime is already loaded).
    pub(crate) fn new(rt: R, direct_eval: bool, cfg: &AppleConfig) -> Result<Self, AppleError> {
        let options = {
            let _pool = Pool::new(&rt);
            let d = rt.empty_dictionary()?;
            rt.retain(d)
        };
        let client = if direct_eval { rt.direct_client() } else { None };
        let temp_root = cfg.temp_dir.clone().unwrap_or_else(|| {
            let _pool = Pool::new(&rt);
            rt.temp_dir()
        });
        Ok(Device {
            max_compiles: cfg.max_compiles,
            lock_surfaces: cfg.lock_surfaces,
            temp_root,
            options,
            direct: AtomicBool::new(client.is_some()),
            client,
            rt,
            kernels: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(1),
            loaded: AtomicUsize::new(0),
            loaded_bytes: AtomicU64::new(0),
            compile_attempts: AtomicU64::new(0),
            compiles: AtomicU64::new(0),
            cache_loads: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            dispatches: AtomicU64::new(0),
            identifier_bytes: AtomicUsize::new(0),
        })
    }

    /// The runtime (tests inspect the fake).
    #[cfg(test)]
    pub(crate) fn runtime(&self) -> &R {
        &self.rt
    }

    /// Counters.
    pub(crate) fn stats(&self) -> AppleStats {
        AppleStats {
            compile_attempts: self.compile_attempts.load(Ordering::Relaxed),
            compiles: self.compiles.load(Ordering::Relaxed),
            cache_loads: self.cache_loads.load(Ordering::Relaxed),
            loads: self.loads.load(Ordering::Relaxed),
            loaded: self.loaded.load(Ordering::Relaxed),
            loaded_bytes: self.loaded_bytes.load(Ordering::Relaxed),
            dispatches: self.dispatches.load(Ordering::Relaxed),
            direct_eval: self.direct.load(Ordering::Relaxed),
            identifier_bytes: self.identifier_bytes.load(Ordering::Relaxed),
        }
    }

    /// The compile budget and the compiles this process has made.
    pub(crate) fn compile_budget(&self) -> Option<crate::device::CompileBudget> {
        self.max_compiles.map(|max| crate::device::CompileBudget {
            max,
            used: self.compile_attempts.load(Ordering::Relaxed),
        })
    }

    fn kernel(&self, h: ProgramHandle) -> Result<Arc<Mutex<Kernel>>, AneError> {
        lock(&self.kernels)
            .get(&h.0)
            .cloned()
            .ok_or(AneError::UnknownHandle(h.0))
    }

    /// Descriptor → model → identifier → model directory → `compileWithQoS:` → surfaces →
    /// request (ane-runtime.md §2.2 steps 1–4, 7–10). The program still has to be loaded.
    pub(crate) fn compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        let k = self.prepare(mil_text, weights, true)?;
        Ok(self.insert(k))
    }

    /// The cache-hit path: descriptor → model → identifier, then `compiledModelExists`. Only when
    /// the OS ANE service says it holds the compiled program: surfaces → request → one
    /// `loadWithQoS:` (no retry). Nothing is written to disk: the framework's `loadWithQoS:`
    /// loads a cached program by identifier without the model directory (iOS 18.2 framework).
    /// Any failure frees the kernel (the caller, [`crate::compile_or_load`], then removes its
    /// marker and compiles).
    pub(crate) fn load_without_compile(
        &self,
        mil_text: &str,
        weights: &WeightFiles,
    ) -> Result<ProgramHandle, AneError> {
        let k = self.prepare(mil_text, weights, false)?;
        let h = self.insert(k);
        match self.load_inner(h, true) {
            Ok(()) => Ok(h),
            Err(e) => {
                let _ = self.release(h);
                Err(e)
            }
        }
    }

    fn insert(&self, k: Kernel) -> ProgramHandle {
        let h = self.next.fetch_add(1, Ordering::Relaxed);
        lock(&self.kernels).insert(h, Arc::new(Mutex::new(k)));
        ProgramHandle(h)
    }

    fn prepare(&self, mil_text: &str, weights: &WeightFiles, compile: bool) -> Result<Kernel, AneError> {
        let sig = program_signature(mil_text)?;
        for (key, _) in weights.iter() {
            relative_weight_path(key)?;
        }
        let _pool = Pool::new(&self.rt);
        let mil = self.rt.data(mil_text.as_bytes())?;
        let wd = weights_dictionary(&self.rt, weights)?;
        let desc = self.rt.descriptor(mil, wd)?;
        let model = self.rt.in_memory_model(desc)?;
        let model = self.rt.retain(model);
        let mut k = Kernel {
            label: kernel_label("", &sig, weights),
            // Filled by `build`.
            id: String::new(),
            model,
            request: Id::NIL,
            inputs: Vec::new(),
            outputs: Vec::new(),
            dir: PathBuf::new(),
            state: KState::Compiled,
            const_bytes: const_bytes(weights),
            sig,
        };
        match self.build(&mut k, mil_text, weights, compile) {
            Ok(()) => Ok(k),
            Err(e) => {
                self.free(&mut k);
                Err(e.into())
            }
        }
    }

    fn build(&self, k: &mut Kernel, mil_text: &str, weights: &WeightFiles, compile: bool) -> Result<(), AppleError> {
        let id = self.rt.hex_string_identifier(k.model);
        if let Some(id) = &id {
            self.identifier_bytes.store(id.len(), Ordering::Relaxed);
        }
        let dir = model_dir(id.as_deref(), self.rt.local_model_path(k.model), &self.temp_root)?;
        let id = id.unwrap_or_default();
        k.label = kernel_label(&id, &k.sig, weights);
        k.id = id;
        if compile {
            self.reserve_compile(&k.label)?;
            k.dir = dir;
            if let Err(e) = write_model_dir_with(&k.dir, mil_text, weights, |p, b| self.rt.write_file(p, b)) {
                // The compiler was never called: give the reserved compile back.
                self.compile_attempts.fetch_sub(1, Ordering::Relaxed);
                return Err(e);
            }
            self.compile_model(k)?;
        } else {
            match self.rt.compiled_model_exists(k.model) {
                Some(true) => {}
                Some(false) => {
                    return Err(AppleError::NotCached(format!(
                        "the ANE service holds no compiled program for {}",
                        k.label
                    )));
                }
                None => {
                    return Err(AppleError::NotCached(
                        "this macOS's _ANEInMemoryModel has no compiledModelExists to ask".into(),
                    ));
                }
            }
        }
        // Every input surface at one size, every output surface at one size (Rule::SurfaceEqualAlloc).
        let inputs = k.sig.inputs.clone();
        let outputs = k.sig.outputs.clone();
        k.inputs = self.new_surfaces(&inputs)?;
        k.outputs = self.new_surfaces(&outputs)?;
        let wrap = |slots: &[Slot]| -> Result<Id, AppleError> {
            let objs = slots
                .iter()
                .map(|s| self.rt.surface_object(s.surface))
                .collect::<Result<Vec<_>, _>>()?;
            self.rt.array(&objs)
        };
        let inputs = wrap(&k.inputs)?;
        let input_indices = index_array(&self.rt, k.inputs.len())?;
        let outputs = wrap(&k.outputs)?;
        let output_indices = index_array(&self.rt, k.outputs.len())?;
        let procedure = self.rt.number_int(0)?;
        let request = self
            .rt
            .request(inputs, input_indices, outputs, output_indices, procedure)?;
        k.request = self.rt.retain(request);
        Ok(())
    }

    /// Count one compile against the per-process budget, or refuse it when the budget is spent.
    fn reserve_compile(&self, kernel: &str) -> Result<(), AppleError> {
        let budget = self.max_compiles;
        self.compile_attempts
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                budget.is_none_or(|b| n < b).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|n| AppleError::Rule {
                rule: Rule::CompileBudget,
                detail: format!(
                    "this process has made {n} compiles, the budget of {} (the ANE compiler leaks resources per \
                     process; maderix/ANE measured ~119), so {kernel} was not compiled; {MAX_COMPILES_ENV} changes \
                     the budget, 0 turns it off",
                    budget.unwrap_or(n)
                ),
            })
    }

    /// `compileWithQoS:21 options:@{} error:`; on failure remove the model directory
    /// (ane-runtime.md §2.2 step 7).
    fn compile_model(&self, k: &mut Kernel) -> Result<(), AppleError> {
        match self.rt.compile(k.model, QOS, self.options) {
            Ok(()) => {
                self.compiles.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(description) => {
                // The compile error is what matters; a directory left behind is only disk space.
                self.remove_dir(k);
                Err(AppleError::Call {
                    call: "-[_ANEInMemoryModel compileWithQoS:options:error:]",
                    kernel: k.label.clone(),
                    description,
                })
            }
        }
    }

    /// The surfaces of one group (a program's inputs, or its outputs), all allocated at
    /// [`group_alloc_size`] of the group: at least 49,152 bytes, a multiple of 128, the largest
    /// tensor's size (Orion: unequal allocations fail at evaluation with status 0x1d). Each
    /// tensor is packed at the start of its surface. On failure the group's surfaces are freed.
    fn new_surfaces(&self, shapes: &[(usize, usize)]) -> Result<Vec<Slot>, AppleError> {
        let too_large = |c: usize, w: usize| AppleError::Signature(format!("surface [1, {c}, 1, {w}] is too large"));
        let bytes = shapes
            .iter()
            .map(|&(c, w)| fp16_tensor_bytes(c, w).ok_or_else(|| too_large(c, w)))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(alloc) = group_alloc_size(bytes.iter().copied()) else {
            return if shapes.is_empty() {
                Ok(Vec::new())
            } else {
                Err(AppleError::Signature("surface group too large".into()))
            };
        };
        let mut slots: Vec<Slot> = Vec::with_capacity(shapes.len());
        let mut first_size = None;
        for (&(channels, lanes), &b) in shapes.iter().zip(&bytes) {
            match self.new_surface(channels, lanes, b, alloc, first_size) {
                Ok((slot, size)) => {
                    first_size.get_or_insert(size);
                    slots.push(slot);
                }
                Err(e) => {
                    for s in slots {
                        self.rt.cf_release(s.surface);
                    }
                    return Err(e);
                }
            }
        }
        Ok(slots)
    }

    /// One IOSurface of `alloc` bytes for a `[1, channels, 1, lanes]` fp16 tensor of `bytes`,
    /// zeroed; `group_size` is the size the group's first surface got (all must be equal).
    /// Returns the slot and the size `IOSurfaceCreate` gave.
    fn new_surface(
        &self,
        channels: usize,
        lanes: usize,
        bytes: usize,
        alloc: usize,
        group_size: Option<usize>,
    ) -> Result<(Slot, usize), AppleError> {
        let props = surface_property_dictionary(&self.rt, alloc)?;
        let surface = self.rt.create_surface(props)?;
        let slot = Slot {
            surface,
            channels,
            lanes,
            bytes,
        };
        let size = self.rt.surface_alloc_size(surface);
        let zeroed = if size < alloc || size < MIN_SURFACE_BYTES {
            Err(AppleError::Rule {
                rule: Rule::SurfaceMinBytes,
                detail: format!(
                    "IOSurfaceCreate gave {size} bytes for a {bytes}-byte tensor; {alloc} were asked for (at least \
                     {MIN_SURFACE_BYTES}, a multiple of {SURFACE_ALIGN_BYTES})"
                ),
            })
        } else if group_size.is_some_and(|g| g != size) {
            Err(AppleError::Rule {
                rule: Rule::SurfaceEqualAlloc,
                detail: format!(
                    "IOSurfaceCreate gave {size} bytes where the program's other surfaces of the same group got {} \
                     ({alloc} were asked for each)",
                    group_size.unwrap_or_default()
                ),
            })
        } else {
            // Zeroed once at creation, locked (ane-runtime.md §2.4).
            self.rt.write_surface(surface, &[], true, true)
        };
        if let Err(e) = zeroed {
            self.rt.cf_release(surface);
            return Err(e);
        }
        Ok((slot, size))
    }

    /// `loadWithQoS:21 options:@{} error:`, retried once after [`LOAD_RETRY_DELAY`]. A failure
    /// names the kernel and how many kernels (and bytes) this process has loaded (the per-process
    /// budget, ane-runtime.md §2.5). A successful load removes the model directory.
    pub(crate) fn load(&self, h: ProgramHandle) -> Result<(), AneError> {
        self.load_inner(h, false)
    }

    fn load_inner(&self, h: ProgramHandle, without_compile: bool) -> Result<(), AneError> {
        let k = self.kernel(h)?;
        let mut k = lock(&k);
        if k.state == KState::Loaded {
            return Err(AneError::State {
                handle: h.0,
                call: "load",
                state: k.state.name(),
            });
        }
        let _pool = Pool::new(&self.rt);
        let mut result = self.rt.load(k.model, QOS, self.options);
        if result.is_err() && !without_compile {
            std::thread::sleep(LOAD_RETRY_DELAY);
            result = self.rt.load(k.model, QOS, self.options);
        }
        if let Err(description) = result {
            return Err(AppleError::Load {
                kernel: k.label.clone(),
                loaded: self.loaded.load(Ordering::Relaxed),
                loaded_mb: self.loaded_bytes.load(Ordering::Relaxed) / 1_000_000,
                description,
            }
            .into());
        }
        k.state = KState::Loaded;
        self.loaded.fetch_add(1, Ordering::Relaxed);
        self.loaded_bytes.fetch_add(k.const_bytes, Ordering::Relaxed);
        // The compiled program now lives in the ANE service; the directory is only disk space
        // (the framework removes it on unload too).
        self.remove_dir(&mut k);
        self.loads.fetch_add(1, Ordering::Relaxed);
        if without_compile {
            self.cache_loads.fetch_add(1, Ordering::Relaxed);
            // A model loaded from the cache keeps its descriptor, and with it the NSData of every
            // weight, for its whole life (only the compile path's saveModelFiles lets go of it):
            // drop it, where this macOS's model class can.
            self.rt.release_descriptor(k.model);
        }
        Ok(())
    }

    /// Write the inputs into the kernel's surfaces, evaluate synchronously, read the outputs.
    pub(crate) fn evaluate(
        &self,
        h: ProgramHandle,
        inputs: &[&Surface],
        outputs: &mut [Surface],
    ) -> Result<DispatchTime, AneError> {
        let start = Instant::now();
        let k = self.kernel(h)?;
        let mut guard = lock(&k);
        let k = &mut *guard;
        if k.state != KState::Loaded {
            return Err(AneError::State {
                handle: h.0,
                call: "evaluate",
                state: k.state.name(),
            });
        }
        check_surfaces("input", &k.inputs, inputs.iter().map(|s| (s.channels(), s.lanes())))?;
        check_surfaces("output", &k.outputs, outputs.iter().map(|s| (s.channels(), s.lanes())))?;
        let mut io_bytes = 0u64;
        for (slot, s) in k.inputs.iter().zip(inputs) {
            // One memcpy of the surface's own bytes: no per-element serialisation.
            self.rt
                .write_surface(slot.surface, &le_bytes(s.halves()), self.lock_surfaces, false)?;
            io_bytes += slot.bytes as u64;
        }
        let ane_start = Instant::now();
        {
            let _pool = Pool::new(&self.rt);
            self.dispatch(k)?;
        }
        let ane = ane_start.elapsed();
        for (slot, out) in k.outputs.iter().zip(outputs.iter_mut()) {
            if out.byte_len() != slot.bytes {
                return Err(AneError::Surfaces(format!(
                    "an output surface of {} bytes for a {}-byte program output",
                    out.byte_len(),
                    slot.bytes
                )));
            }
            // Straight into the output surface's memory: one memcpy, no parse.
            read_le_bytes(out.halves_mut(), |b| {
                self.rt.read_surface(slot.surface, b, self.lock_surfaces)
            })?;
            io_bytes += slot.bytes as u64;
        }
        self.dispatches.fetch_add(1, Ordering::Relaxed);
        Ok(DispatchTime {
            host: start.elapsed(),
            ane,
            bytes: k.const_bytes + io_bytes,
        })
    }

    /// One evaluation: direct through `_ANEClient` when on (a failure turns it off for good and
    /// retries through the daemon), else `evaluateWithQoS:21 options:@{} request:error:`.
    fn dispatch(&self, k: &Kernel) -> Result<(), AppleError> {
        if let Some(client) = self.client.filter(|_| self.direct.load(Ordering::Relaxed)) {
            match self.rt.evaluate_direct(client, k.model, self.options, k.request, QOS) {
                Ok(()) => return Ok(()),
                Err(_) => self.direct.store(false, Ordering::Relaxed),
            }
        }
        self.rt
            .evaluate(k.model, QOS, self.options, k.request)
            .map_err(|description| AppleError::Call {
                call: "-[_ANEInMemoryModel evaluateWithQoS:options:request:error:] (path=in-process)",
                kernel: k.label.clone(),
                description,
            })
    }

    /// `unloadWithQoS:21 error:` (frees the kernel's share of the per-process budget).
    pub(crate) fn unload(&self, h: ProgramHandle) -> Result<(), AneError> {
        let k = self.kernel(h)?;
        let mut k = lock(&k);
        if k.state != KState::Loaded {
            return Err(AneError::State {
                handle: h.0,
                call: "unload",
                state: k.state.name(),
            });
        }
        let _pool = Pool::new(&self.rt);
        // The reference ignores the result of unload; the kernel counts as unloaded either way.
        let r = self.rt.unload(k.model, QOS);
        k.state = KState::Unloaded;
        self.loaded.fetch_sub(1, Ordering::Relaxed);
        self.loaded_bytes.fetch_sub(k.const_bytes, Ordering::Relaxed);
        r.map_err(|description| {
            AppleError::Call {
                call: "-[_ANEInMemoryModel unloadWithQoS:error:]",
                kernel: k.label.clone(),
                description,
            }
            .into()
        })
    }

    /// The surface shapes of a compiled program.
    pub(crate) fn signature(&self, h: ProgramHandle) -> Result<Signature, AneError> {
        let k = self.kernel(h)?;
        let sig = lock(&k).sig.clone();
        Ok(sig)
    }

    /// Free one kernel (unloading it first if loaded).
    pub(crate) fn release(&self, h: ProgramHandle) -> Result<(), AneError> {
        let k = lock(&self.kernels).remove(&h.0).ok_or(AneError::UnknownHandle(h.0))?;
        let mut k = lock(&k);
        self.free(&mut k);
        Ok(())
    }

    /// Remove a kernel's model directory if it wrote one (a failure is only disk space).
    fn remove_dir(&self, k: &mut Kernel) {
        if !k.dir.as_os_str().is_empty() {
            let _ = remove_model_dir(&k.dir);
            k.dir = PathBuf::new();
        }
    }

    /// Unload (if loaded) → release the request (it holds the surface objects) → `CFRelease`
    /// each surface → release the model → remove the model directory if one is left.
    fn free(&self, k: &mut Kernel) {
        let _pool = Pool::new(&self.rt);
        if k.state == KState::Loaded {
            let _ = self.rt.unload(k.model, QOS);
            k.state = KState::Unloaded;
            self.loaded.fetch_sub(1, Ordering::Relaxed);
            self.loaded_bytes.fetch_sub(k.const_bytes, Ordering::Relaxed);
        }
        self.rt.release(std::mem::replace(&mut k.request, Id::NIL));
        for s in k.inputs.drain(..).chain(k.outputs.drain(..)) {
            self.rt.cf_release(s.surface);
        }
        self.rt.release(std::mem::replace(&mut k.model, Id::NIL));
        self.remove_dir(k);
    }
}

impl<R: Runtime> Drop for Device<R> {
    fn drop(&mut self) {
        let kernels = std::mem::take(&mut *lock(&self.kernels));
        for (_, k) in kernels.into_iter().rev() {
            let mut k = lock(&k);
            self.free(&mut k);
        }
        if let Some(c) = self.client.take() {
            self.rt.release(c);
        }
        self.rt.release(self.options);
    }
}
