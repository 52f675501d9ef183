//! The seam between the ANE path and a Neural Engine: real (private framework) or emulated.
//!
//! A device receives exactly what Apple's compiler receives — MIL **text** and weight-blob
//! **bytes** — so lowering, blob writing and surface packing are one code path for both.

use std::time::Duration;

use anelm_mil::WeightFiles;

use crate::error::AneError;
use crate::limits::Limits;
use crate::surface::Surface;

/// A compiled program on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramHandle(pub u64);

/// The runtime signature of a compiled program: `(channels, lanes)` of each surface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Input surfaces, in sorted order of their names (how the hardware binds them; the
    /// validator requires declaration order to be that order, [`crate::Rule::IoSortedNames`]).
    pub inputs: Vec<(usize, usize)>,
    /// Output surfaces, in sorted order of their names.
    pub outputs: Vec<(usize, usize)>,
}

impl Signature {
    /// Zeroed output surfaces of the right shapes.
    pub fn output_surfaces(&self) -> Vec<Surface> {
        self.outputs.iter().map(|&(c, w)| Surface::with_lanes(c, w)).collect()
    }
}

/// What one dispatch cost.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DispatchTime {
    /// Wall time measured on this host for the evaluation.
    pub host: Duration,
    /// Modelled (emulator) or measured (hardware) Neural Engine time.
    pub ane: Duration,
    /// Bytes the dispatch moves: constants plus input and output surfaces.
    pub bytes: u64,
}

/// A device's per-process compile budget ([`crate::Rule::CompileBudget`]) and what this process
/// has spent of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileBudget {
    /// Compiles one process may make.
    pub max: u64,
    /// Compiles this process has made (failed ones included: the compiler's leak is per call).
    pub used: u64,
}

impl CompileBudget {
    /// Compiles this process may still make.
    pub fn remaining(&self) -> u64 {
        self.max.saturating_sub(self.used)
    }
}

/// A Neural Engine: compile → load → evaluate → unload.
pub trait AneDevice: Send + Sync {
    /// Device name (`ane-emu`, `ane`).
    fn name(&self) -> &str;

    /// Compile MIL text with its weight files (path → blob bytes).
    fn compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError>;

    /// Load a program this device compiled before (in this or an earlier process) **without
    /// compiling it**, the cache-hit path of [`crate::compile_or_load`]: on a Mac the OS ANE
    /// service keeps compiled programs keyed by their identifier; the emulator trusts a marker
    /// that these exact bytes passed validation. The program comes back loaded. Devices without
    /// such a path keep this default, which always fails (so the caller compiles).
    fn load_without_compile(&self, mil_text: &str, weights: &WeightFiles) -> Result<ProgramHandle, AneError> {
        let _ = (mil_text, weights);
        Err(AneError::Unavailable(format!(
            "{} cannot load a program without compiling it",
            self.name()
        )))
    }

    /// What this device accepts ([`Limits`]): the ANE backend plans every kernel under them, so the
    /// planner and the device agree by construction. The default is the evidence-based
    /// [`Limits::default`]; the emulator answers with the limits it enforces.
    fn limits(&self) -> Limits {
        Limits::default()
    }

    /// The per-process compile budget and what is spent of it (`None`: no budget). A program
    /// loaded from the compile cache costs none of it.
    fn compile_budget(&self) -> Option<CompileBudget> {
        None
    }

    /// What besides the MIL text and weights decides whether a program compiles on this device
    /// (device kind, OS build, limits); part of the cache identifier.
    fn cache_salt(&self) -> String {
        self.name().to_string()
    }

    /// Load a compiled (or unloaded) program so it can be evaluated.
    fn load(&self, program: ProgramHandle) -> Result<(), AneError>;

    /// Evaluate a loaded program on input surfaces (declaration order), writing the outputs.
    fn evaluate(
        &self,
        program: ProgramHandle,
        inputs: &[&Surface],
        outputs: &mut [Surface],
    ) -> Result<DispatchTime, AneError>;

    /// Unload a loaded program (frees its share of the per-process budget; it can be reloaded).
    fn unload(&self, program: ProgramHandle) -> Result<(), AneError>;

    /// Free a program for good: unload it if it is loaded, then drop everything the device holds
    /// for it (on a Mac: request, surfaces, model). The handle is unknown afterwards. Every owner
    /// of a handle calls this on every path, errors included; unloading alone keeps the rest.
    fn release(&self, program: ProgramHandle) -> Result<(), AneError>;

    /// The surface shapes a compiled program expects.
    fn signature(&self, program: ProgramHandle) -> Result<Signature, AneError>;
}

/// Compile and load a program; when the load fails the compiled program is released before the
/// error is returned, so a failure leaves nothing behind.
pub fn compile_and_load<D: AneDevice + ?Sized>(
    device: &D,
    mil_text: &str,
    weights: &WeightFiles,
) -> Result<ProgramHandle, AneError> {
    let h = device.compile(mil_text, weights)?;
    if let Err(e) = device.load(h) {
        // The load error is the one to report; the release of a program that never loaded only
        // frees host objects.
        let _ = device.release(h);
        return Err(e);
    }
    Ok(h)
}

/// One evaluation of a loaded program on zeroed inputs (the smoke dispatch every program gets
/// after it loads): a program that compiles and loads but fails to evaluate (status 0x1d for
/// unequal or too small surfaces, a poisoned process) fails here, while the fallback chain can
/// still pick another form, instead of in the middle of a generation.
pub fn smoke_dispatch<D: AneDevice + ?Sized>(device: &D, program: ProgramHandle) -> Result<(), AneError> {
    let sig = device.signature(program)?;
    let inputs: Vec<Surface> = sig.inputs.iter().map(|&(c, w)| Surface::with_lanes(c, w)).collect();
    let refs: Vec<&Surface> = inputs.iter().collect();
    let mut outputs = sig.output_surfaces();
    device.evaluate(program, &refs, &mut outputs).map(|_| ())
}

/// The programs of one kernel while it is being built: if the guard is dropped before
/// [`Releasing::keep`] (an error returned early with `?`), every program added so far is
/// released, last first.
pub struct Releasing<'a, D: AneDevice + ?Sized> {
    device: &'a D,
    handles: Vec<ProgramHandle>,
}

impl<'a, D: AneDevice + ?Sized> Releasing<'a, D> {
    /// An empty guard over `device`.
    pub fn new(device: &'a D) -> Self {
        Releasing {
            device,
            handles: Vec::new(),
        }
    }

    /// Take charge of a program that is now built.
    pub fn add(&mut self, program: ProgramHandle) {
        self.handles.push(program);
    }

    /// The kernel is complete: hand the programs back to the caller, who releases them later.
    pub fn keep(mut self) -> Vec<ProgramHandle> {
        std::mem::take(&mut self.handles)
    }
}

impl<D: AneDevice + ?Sized> Drop for Releasing<'_, D> {
    fn drop(&mut self) {
        for h in self.handles.drain(..).rev() {
            // Nothing more to do on a failed release while unwinding an error path.
            let _ = self.device.release(h);
        }
    }
}
