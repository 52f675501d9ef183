//! A fake [`Runtime`] for tests, as strict as the real framework where the device depends on it
//! (issue 37 item 5): objects live in a table (an `Id` is its index + 1), every call is recorded,
//! reference counts are tracked, and failures can be injected.
//!
//! What it enforces like AppleNeuralEngine.framework does:
//! * `hexStringIdentifier` is computed from the descriptor ([`identifier`]), not a constant;
//! * `compileWithQoS:` needs `<tmp>/<id>/model.mil` with the descriptor's MIL text and every
//!   `BLOBFILE` the MIL names under `<tmp>/<id>/` with the weights dictionary's bytes; it drops
//!   the model's descriptor afterwards (as `saveModelFiles` does);
//! * the "ANE service" ([`Service`]) keeps compiled programs by identifier across processes;
//!   `loadWithQoS:` succeeds only for a program it holds;
//! * `unloadWithQoS:` removes the model directory;
//! * evaluation binds the request's surfaces to the program's inputs and outputs in sorted order
//!   of their names and runs the program (on the emulator), and refuses unequal input (or output)
//!   allocations with status 0x1d unless [`Script::unequal_sizes_ok`];
//! * a compile budget of its own ([`Script::compile_budget`]), the compiler's per-process leak.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use anelm_mil::{WeightFiles, parse_program};
use sha2::{Digest, Sha256};

use super::error::AppleError;
use super::foundation::relative_weight_path;
use super::modeldir::MODEL_MIL;
use super::objc::Id;
use super::runtime::{Runtime, SurfaceKey, SurfaceRef};
use crate::device::AneDevice;
use crate::emu::EmuAne;
use crate::surface::Surface;

/// An object of the fake runtime.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Obj {
    Data(Vec<u8>),
    Str(String),
    Int(i64),
    ULong(u64),
    Dict(Vec<(Id, Id)>),
    Array(Vec<Id>),
    Descriptor {
        mil: Id,
        weights: Id,
    },
    /// `desc` becomes nil after a compile (`saveModelFiles`) or `setDescriptor:nil`; `hex` is the
    /// identifier computed from the descriptor at creation.
    Model {
        desc: Id,
        hex: String,
    },
    SurfaceObject(SurfaceRef),
    Request {
        inputs: Id,
        input_indices: Id,
        outputs: Id,
        output_indices: Id,
        procedure: Id,
    },
    Surface(Vec<u8>),
    Client,
}

/// The framework's `hexStringIdentifier` of a descriptor, as the issue-37 review of the
/// decompiled framework describes it: the uppercase SHA-256 of the MIL text, of the weight blobs
/// in sorted key order after four zero bytes, and of the (absent) options, i.e. of the empty
/// string, joined by `_` (194 characters).
pub(crate) fn identifier(mil_text: &[u8], weights: &WeightFiles) -> String {
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02X}")).collect::<String>();
    let mut w = Sha256::new();
    w.update([0u8; 4]);
    let mut blobs: Vec<(&str, &[u8])> = weights.iter().collect();
    blobs.sort_by(|a, b| a.0.cmp(b.0));
    for (_, bytes) in blobs {
        w.update(bytes);
    }
    format!(
        "{}_{}_{}",
        hex(&Sha256::digest(mil_text)),
        hex(&w.finalize()),
        hex(&Sha256::digest(b""))
    )
}

/// What the compiler saw for one identifier.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    mil: String,
    weights: WeightFiles,
}

/// The OS ANE service: compiled programs by identifier (`None`: an identifier put there by
/// [`Script::os_cache`] without a program). It outlives a process: [`Fake::next_process`] shares it.
pub(crate) type Service = Arc<Mutex<HashMap<String, Option<Compiled>>>>;

/// Injected behaviour.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    /// What `hexStringIdentifier` returns instead of the computed identifier.
    pub hex: Option<Option<String>>,
    /// `compileWithQoS:` fails with this description.
    pub compile_error: Option<String>,
    /// The compiler fails every compile after this many in the process (its resource leak).
    pub compile_budget: Option<usize>,
    /// The next this-many `loadWithQoS:` calls fail.
    pub load_failures: usize,
    /// `loadWithQoS:` fails whenever this many models are loaded already.
    pub budget: Option<usize>,
    /// `evaluateWithQoS:` fails with this description.
    pub eval_error: Option<String>,
    /// Evaluation of a program whose MIL text contains this fails with status 0x1d.
    pub eval_error_when: Option<String>,
    /// Unequal input (or output) allocations evaluate (the default refuses them, as Orion saw).
    pub unequal_sizes_ok: bool,
    /// `doEvaluateDirectWithModel:` fails with this description.
    pub direct_error: Option<String>,
    /// `_ANEClient` exists.
    pub has_client: bool,
    /// `modelWithMILText:` returns nil.
    pub nil_descriptor: bool,
    /// `localModelPath` answers `<this>/<hexStringIdentifier>` (`None`: the model lacks it).
    pub local_root: Option<PathBuf>,
    /// The model lacks `compiledModelExists`.
    pub no_compiled_model_exists: bool,
    /// The model lacks `setDescriptor:`.
    pub no_set_descriptor: bool,
    /// Identifiers the ANE service holds (without a program) at start.
    pub os_cache: Vec<String>,
    /// `IOSurfaceCreate` gives 4096-byte surfaces whatever was asked.
    pub small_surfaces: bool,
    /// `requestWithInputs:…` returns nil.
    pub nil_request: bool,
}

#[derive(Debug, Default)]
struct State {
    objects: Vec<Obj>,
    /// Retain count above the autoreleased +0 of each object the device retained or got +1.
    refs: HashMap<Id, i64>,
    calls: Vec<String>,
    loaded: Vec<Id>,
    pools: Vec<usize>,
    next_pool: usize,
    released_surfaces: Vec<SurfaceRef>,
    /// `compileWithQoS:` calls in this process.
    compiles: usize,
    /// Files written through `write_file`.
    writes: Vec<PathBuf>,
    script: Script,
}

/// The fake runtime. Clones share one state, so a test can keep a handle to a runtime the device
/// owns and inspect it after the device is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Fake {
    state: Arc<Mutex<State>>,
    service: Service,
    keys: [Id; 6],
    temp: PathBuf,
}

impl Fake {
    pub(crate) fn new() -> Fake {
        Fake::with(Script::default(), super::modeldir::test_dir("fake-tmp"))
    }

    /// A fresh "process" with a fresh ANE service.
    pub(crate) fn with(script: Script, temp: PathBuf) -> Fake {
        Fake::with_service(script, temp, Service::default())
    }

    /// A new "process" over the same ANE service (and temporary directory) as `self`.
    pub(crate) fn next_process(&self, script: Script) -> Fake {
        Fake::with_service(script, self.temp.clone(), Arc::clone(&self.service))
    }

    fn with_service(script: Script, temp: PathBuf, service: Service) -> Fake {
        {
            let mut svc = service.lock().unwrap_or_else(|p| p.into_inner());
            for id in &script.os_cache {
                svc.entry(id.clone()).or_insert(None);
            }
        }
        let mut st = State {
            script,
            ..State::default()
        };
        let mut keys = [Id::NIL; 6];
        for (slot, k) in keys.iter_mut().zip(SurfaceKey::ALL) {
            st.objects.push(Obj::Str(k.symbol().to_string()));
            *slot = Id(st.objects.len() as *mut _);
        }
        Fake {
            state: Arc::new(Mutex::new(st)),
            service,
            keys,
            temp,
        }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn svc(&self) -> MutexGuard<'_, HashMap<String, Option<Compiled>>> {
        self.service.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, o: Obj) -> Id {
        let mut st = self.st();
        st.objects.push(o);
        Id(st.objects.len() as *mut _)
    }

    fn call(&self, c: impl Into<String>) {
        self.st().calls.push(c.into());
    }

    /// The object behind `id`.
    pub(crate) fn obj(&self, id: Id) -> Obj {
        let st = self.st();
        let i = (id.0 as usize).checked_sub(1).expect("nil has no object");
        st.objects[i].clone()
    }

    pub(crate) fn str(&self, id: Id) -> String {
        match self.obj(id) {
            Obj::Str(s) => s,
            o => panic!("not a string: {o:?}"),
        }
    }

    pub(crate) fn dict(&self, id: Id) -> Vec<(Id, Id)> {
        match self.obj(id) {
            Obj::Dict(d) => d,
            o => panic!("not a dictionary: {o:?}"),
        }
    }

    fn data(&self, id: Id) -> Vec<u8> {
        match self.obj(id) {
            Obj::Data(d) => d,
            o => panic!("not NSData: {o:?}"),
        }
    }

    /// Every call so far, in order.
    pub(crate) fn calls(&self) -> Vec<String> {
        self.st().calls.clone()
    }

    /// How many calls start with `prefix`.
    pub(crate) fn count(&self, prefix: &str) -> usize {
        self.st().calls.iter().filter(|c| c.starts_with(prefix)).count()
    }

    pub(crate) fn script(&self, f: impl FnOnce(&mut Script)) {
        f(&mut self.st().script)
    }

    /// Objects with a non-zero balance of retains and releases.
    pub(crate) fn leaks(&self) -> Vec<(Id, i64)> {
        self.st()
            .refs
            .iter()
            .filter(|(_, n)| **n != 0)
            .map(|(k, v)| (*k, *v))
            .collect()
    }

    /// Surfaces created and not `CFRelease`d.
    pub(crate) fn live_surfaces(&self) -> usize {
        let st = self.st();
        let created = st.objects.iter().filter(|o| matches!(o, Obj::Surface(_))).count();
        created - st.released_surfaces.len()
    }

    pub(crate) fn open_pools(&self) -> usize {
        self.st().pools.len()
    }

    /// Files written through the runtime's `write_file`, in order.
    pub(crate) fn writes(&self) -> Vec<PathBuf> {
        self.st().writes.clone()
    }

    /// Models still holding a reference the device took (retained and not released).
    pub(crate) fn live_models(&self) -> usize {
        self.held_models().len()
    }

    fn held_models(&self) -> Vec<Obj> {
        let st = self.st();
        st.refs
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(id, _)| st.objects[id.0 as usize - 1].clone())
            .filter(|o| matches!(o, Obj::Model { .. }))
            .collect()
    }

    /// Bytes of MIL text and weights that the descriptors of the models the device holds keep
    /// alive (the second copy of the weights issue 37 item 4 is about).
    pub(crate) fn retained_descriptor_bytes(&self) -> usize {
        let mut total = 0;
        for m in self.held_models() {
            let Obj::Model { desc, .. } = m else { continue };
            if desc.is_nil() {
                continue;
            }
            let Obj::Descriptor { mil, weights } = self.obj(desc) else {
                continue;
            };
            total += self.data(mil).len();
            total += self.weight_files(weights).total_bytes();
        }
        total
    }

    /// Identifiers the ANE service holds.
    pub(crate) fn service_ids(&self) -> HashSet<String> {
        self.svc().keys().cloned().collect()
    }

    /// The model's identifier (the script's override, else the computed one), and its descriptor.
    fn model(&self, model: Id) -> (Option<String>, Id) {
        let Obj::Model { desc, hex } = self.obj(model) else {
            panic!("not a model")
        };
        let id = match self.st().script.hex.clone() {
            Some(over) => over,
            None => Some(hex),
        };
        (id, desc)
    }

    /// The weights dictionary as files.
    fn weight_files(&self, dict: Id) -> WeightFiles {
        let mut w = WeightFiles::new();
        for (k, v) in self.dict(dict) {
            let data = self
                .dict(v)
                .into_iter()
                .find(|(ik, _)| self.str(*ik) == "data")
                .map(|(_, d)| self.data(d))
                .expect("a weights entry without data");
            w.insert(self.str(k), data);
        }
        w
    }

    /// Where the framework reads the model directory: `localModelPath`'s root, else the temp dir.
    fn dir_of(&self, id: &str) -> PathBuf {
        let root = self.st().script.local_root.clone().unwrap_or_else(|| self.temp.clone());
        root.join(id)
    }

    /// What `compileWithQoS:` checks on disk: `model.mil` with the MIL text and every BLOBFILE of
    /// the MIL with the weights dictionary's bytes.
    fn check_model_dir(dir: &Path, c: &Compiled) -> Result<(), String> {
        let fail = |what: String| Err(format!("ANECCompile() FAILED: {what}"));
        match std::fs::read(dir.join(MODEL_MIL)) {
            Ok(b) if b == c.mil.as_bytes() => {}
            Ok(_) => return fail(format!("{}/model.mil is not the descriptor's MIL text", dir.display())),
            Err(e) => return fail(format!("cannot read {}/model.mil: {e}", dir.display())),
        }
        let program = parse_program(&c.mil).map_err(|e| format!("ANECCompile() FAILED: MIL parse error {e}"))?;
        for r in program.blob_refs() {
            let Some(want) = c.weights.get(r.path) else {
                return fail(format!("BLOBFILE {} is not in the weights dictionary", r.path));
            };
            let rel = relative_weight_path(r.path).map_err(|e| e.to_string())?;
            match std::fs::read(dir.join(rel)) {
                Ok(b) if b == want => {}
                Ok(_) => return fail(format!("{rel} differs from the weights dictionary's data")),
                Err(e) => return fail(format!("cannot read {rel}: {e}")),
            }
        }
        Ok(())
    }

    fn surface_bytes(&self, s: SurfaceRef) -> Vec<u8> {
        match self.obj(s.0) {
            Obj::Surface(b) => b,
            o => panic!("not a surface: {o:?}"),
        }
    }

    fn set_surface(&self, s: SurfaceRef, bytes: Vec<u8>) {
        let mut st = self.st();
        st.objects[s.0.0 as usize - 1] = Obj::Surface(bytes);
    }

    fn surfaces_of_request(&self, request: Id) -> (Vec<SurfaceRef>, Vec<SurfaceRef>) {
        let Obj::Request { inputs, outputs, .. } = self.obj(request) else {
            panic!("not a request")
        };
        let surfaces = |a: Id| -> Vec<SurfaceRef> {
            let Obj::Array(items) = self.obj(a) else {
                panic!("not an array")
            };
            items
                .iter()
                .map(|&i| match self.obj(i) {
                    Obj::SurfaceObject(s) => s,
                    o => panic!("not a surface object: {o:?}"),
                })
                .collect()
        };
        (surfaces(inputs), surfaces(outputs))
    }

    /// What the fake "ANE" does for one evaluation: find the program the service holds for the
    /// model, refuse unequal allocations, bind the request's surfaces to the program's inputs and
    /// outputs in sorted name order, and compute it (on the emulator).
    fn run(&self, model: Id, request: Id) -> Result<(), String> {
        let (id, _) = self.model(model);
        let compiled = id.and_then(|id| self.svc().get(&id).cloned().flatten());
        let Some(c) = compiled else {
            return Err("Program Inference error: the ANE service holds no program for this model".into());
        };
        let script = self.st().script.clone();
        if script
            .eval_error_when
            .as_ref()
            .is_some_and(|w| c.mil.contains(w.as_str()))
        {
            return Err("Program Inference error status=0x1d".into());
        }
        let (ins, outs) = self.surfaces_of_request(request);
        if !script.unequal_sizes_ok {
            for (what, group) in [("input", &ins), ("output", &outs)] {
                let sizes: Vec<usize> = group.iter().map(|s| self.surface_bytes(*s).len()).collect();
                if sizes.windows(2).any(|w| w[0] != w[1]) {
                    return Err(format!(
                        "Program Inference error status=0x1d (unequal {what} allocations {sizes:?})"
                    ));
                }
            }
        }
        // The emulator binds surfaces by sorted name, as the hardware does.
        let emu = EmuAne::default();
        let h = emu
            .load_without_compile(&c.mil, &c.weights)
            .map_err(|e| format!("the fake cannot run the program: {e}"))?;
        let sig = emu.signature(h).map_err(|e| e.to_string())?;
        if sig.inputs.len() != ins.len() || sig.outputs.len() != outs.len() {
            return Err(format!(
                "Program Inference error: the request has {} inputs and {} outputs, the program {} and {}",
                ins.len(),
                outs.len(),
                sig.inputs.len(),
                sig.outputs.len()
            ));
        }
        let mut inputs = Vec::with_capacity(ins.len());
        for (&(c, w), s) in sig.inputs.iter().zip(&ins) {
            let bytes = self.surface_bytes(*s);
            let n = c * w * 2;
            let t = bytes
                .get(..n)
                .ok_or_else(|| format!("a {}-byte surface for a {n}-byte input", bytes.len()))?;
            inputs.push(Surface::from_bytes(c, w, t).map_err(|e| e.to_string())?);
        }
        let refs: Vec<&Surface> = inputs.iter().collect();
        let mut results = sig.output_surfaces();
        emu.evaluate(h, &refs, &mut results).map_err(|e| e.to_string())?;
        for (r, s) in results.iter().zip(&outs) {
            let mut b = self.surface_bytes(*s);
            let packed: Vec<u8> = r.halves().iter().flat_map(|h| h.to_le_bytes()).collect();
            if packed.len() > b.len() {
                return Err("an output surface smaller than its tensor".into());
            }
            b[..packed.len()].copy_from_slice(&packed);
            self.set_surface(*s, b);
        }
        Ok(())
    }
}

impl Runtime for Fake {
    fn data(&self, bytes: &[u8]) -> Result<Id, AppleError> {
        Ok(self.add(Obj::Data(bytes.to_vec())))
    }
    fn string(&self, s: &str) -> Result<Id, AppleError> {
        if s.contains('\0') {
            return Err(AppleError::Nul { what: "an NSString" });
        }
        Ok(self.add(Obj::Str(s.to_string())))
    }
    fn number_int(&self, v: i32) -> Result<Id, AppleError> {
        Ok(self.add(Obj::Int(v.into())))
    }
    fn number_ulong(&self, v: u64) -> Result<Id, AppleError> {
        Ok(self.add(Obj::ULong(v)))
    }
    fn dictionary(&self, keys: &[Id], values: &[Id]) -> Result<Id, AppleError> {
        assert_eq!(keys.len(), values.len());
        assert!(keys.iter().chain(values).all(|i| !i.is_nil()), "nil in a dictionary");
        Ok(self.add(Obj::Dict(keys.iter().copied().zip(values.iter().copied()).collect())))
    }
    fn empty_dictionary(&self) -> Result<Id, AppleError> {
        Ok(self.add(Obj::Dict(Vec::new())))
    }
    fn array(&self, items: &[Id]) -> Result<Id, AppleError> {
        Ok(self.add(Obj::Array(items.to_vec())))
    }
    fn retain(&self, o: Id) -> Id {
        *self.st().refs.entry(o).or_insert(0) += 1;
        o
    }
    fn release(&self, o: Id) {
        if !o.is_nil() {
            self.call("release");
            *self.st().refs.entry(o).or_insert(0) -= 1;
        }
    }
    fn pool_push(&self) -> usize {
        let mut st = self.st();
        st.next_pool += 1;
        let t = st.next_pool;
        st.pools.push(t);
        t
    }
    fn pool_pop(&self, token: usize) {
        let mut st = self.st();
        assert_eq!(st.pools.pop(), Some(token), "pools popped out of order");
    }
    fn temp_dir(&self) -> PathBuf {
        self.temp.clone()
    }
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        self.st().writes.push(path.to_path_buf());
        std::fs::write(path, bytes)
    }

    fn descriptor(&self, mil: Id, weights: Id) -> Result<Id, AppleError> {
        assert!(!weights.is_nil(), "the weights dictionary must never be nil");
        assert!(matches!(self.obj(mil), Obj::Data(_)), "MIL text must be NSData");
        self.call("descriptor");
        if self.st().script.nil_descriptor {
            return Err(AppleError::Nil {
                call: "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]",
                hint: String::new(),
            });
        }
        Ok(self.add(Obj::Descriptor { mil, weights }))
    }
    fn in_memory_model(&self, desc: Id) -> Result<Id, AppleError> {
        let Obj::Descriptor { mil, weights } = self.obj(desc) else {
            panic!("not a descriptor")
        };
        let hex = identifier(&self.data(mil), &self.weight_files(weights));
        Ok(self.add(Obj::Model { desc, hex }))
    }
    fn hex_string_identifier(&self, model: Id) -> Option<String> {
        self.model(model).0
    }
    fn local_model_path(&self, model: Id) -> Option<PathBuf> {
        let root = self.st().script.local_root.clone()?;
        Some(root.join(self.model(model).0?))
    }
    fn compiled_model_exists(&self, model: Id) -> Option<bool> {
        self.call("compiledModelExists");
        if self.st().script.no_compiled_model_exists {
            return None;
        }
        let id = self.model(model).0?;
        Some(self.svc().contains_key(&id))
    }
    fn release_descriptor(&self, model: Id) -> bool {
        if self.st().script.no_set_descriptor {
            return false;
        }
        self.call("setDescriptor:nil");
        let mut st = self.st();
        if let Obj::Model { desc, .. } = &mut st.objects[model.0 as usize - 1] {
            *desc = Id::NIL;
        }
        true
    }
    fn compile(&self, model: Id, qos: u32, options: Id) -> Result<(), String> {
        self.call(format!("compile qos={qos}"));
        assert_eq!(self.obj(options), Obj::Dict(vec![]), "options must be @{{}}");
        let script = self.st().script.clone();
        if let Some(e) = script.compile_error {
            return Err(e);
        }
        let n = {
            let mut st = self.st();
            st.compiles += 1;
            st.compiles
        };
        if script.compile_budget.is_some_and(|b| n > b) {
            return Err(format!(
                "Error Domain=com.apple.appleneuralengine.compiler Code=1 \"ANECCompile() FAILED\" (compile {n} of a \
                 process whose compiler has leaked its resources)"
            ));
        }
        let (id, desc) = self.model(model);
        let id = id.ok_or("the model has no identifier")?;
        if desc.is_nil() {
            return Err("the model has no descriptor to compile".into());
        }
        let Obj::Descriptor { mil, weights } = self.obj(desc) else {
            panic!("not a descriptor")
        };
        let c = Compiled {
            mil: String::from_utf8(self.data(mil)).map_err(|_| "MIL text is not UTF-8")?,
            weights: self.weight_files(weights),
        };
        Fake::check_model_dir(&self.dir_of(&id), &c)?;
        self.svc().insert(id, Some(c));
        // saveModelFiles: a compiled model lets go of its descriptor.
        let mut st = self.st();
        if let Obj::Model { desc, .. } = &mut st.objects[model.0 as usize - 1] {
            *desc = Id::NIL;
        }
        Ok(())
    }
    fn load(&self, model: Id, qos: u32, options: Id) -> Result<(), String> {
        self.call(format!("load qos={qos}"));
        assert_eq!(self.obj(options), Obj::Dict(vec![]), "options must be @{{}}");
        let id = self.model(model).0;
        let held = id.as_ref().is_some_and(|id| self.svc().contains_key(id));
        let mut st = self.st();
        if st.script.load_failures > 0 {
            st.script.load_failures -= 1;
            return Err("Error Domain=com.apple.appleneuralengine Code=-1 \"load failed\"".into());
        }
        if !held {
            return Err(
                "Error Domain=com.apple.appleneuralengine Code=-4 \"no compiled program for this model\"".into(),
            );
        }
        if st.script.budget.is_some_and(|b| st.loaded.len() >= b) {
            return Err("Error Domain=com.apple.appleneuralengine Code=5 \"out of program slots\"".into());
        }
        st.loaded.push(model);
        Ok(())
    }
    fn evaluate(&self, model: Id, qos: u32, options: Id, request: Id) -> Result<(), String> {
        self.call(format!("evaluate qos={qos}"));
        assert_eq!(self.obj(options), Obj::Dict(vec![]));
        if let Some(e) = self.st().script.eval_error.clone() {
            return Err(e);
        }
        if !self.st().loaded.contains(&model) {
            return Err("Program Inference error: the model is not loaded".into());
        }
        self.run(model, request)
    }
    fn unload(&self, model: Id, qos: u32) -> Result<(), String> {
        self.call(format!("unload qos={qos}"));
        self.st().loaded.retain(|&m| m != model);
        // The framework removes the model directory on unload.
        if let Some(id) = self.model(model).0 {
            let _ = std::fs::remove_dir_all(self.dir_of(&id));
        }
        Ok(())
    }
    fn surface_object(&self, surface: SurfaceRef) -> Result<Id, AppleError> {
        Ok(self.add(Obj::SurfaceObject(surface)))
    }
    fn request(
        &self,
        inputs: Id,
        input_indices: Id,
        outputs: Id,
        output_indices: Id,
        procedure: Id,
    ) -> Result<Id, AppleError> {
        self.call("request");
        if self.st().script.nil_request {
            return Err(AppleError::Nil {
                call: "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:]",
                hint: String::new(),
            });
        }
        Ok(self.add(Obj::Request {
            inputs,
            input_indices,
            outputs,
            output_indices,
            procedure,
        }))
    }
    fn direct_client(&self) -> Option<Id> {
        if !self.st().script.has_client {
            return None;
        }
        let c = self.add(Obj::Client);
        self.retain(c);
        Some(c)
    }
    fn evaluate_direct(&self, _client: Id, model: Id, _options: Id, request: Id, qos: u32) -> Result<(), String> {
        self.call(format!("direct qos={qos}"));
        if let Some(e) = self.st().script.direct_error.clone() {
            return Err(e);
        }
        self.run(model, request)
    }
    fn surface_key(&self, key: SurfaceKey) -> Id {
        let i = SurfaceKey::ALL.iter().position(|&k| k == key).unwrap_or(0);
        self.keys[i]
    }
    fn create_surface(&self, properties: Id) -> Result<SurfaceRef, AppleError> {
        let entries = self.dict(properties);
        let alloc = entries
            .iter()
            .find(|(k, _)| self.str(*k) == "kIOSurfaceAllocSize")
            .map(|(_, v)| match self.obj(*v) {
                Obj::ULong(n) => n as usize,
                o => panic!("alloc size is {o:?}"),
            })
            .expect("kIOSurfaceAllocSize missing");
        self.call(format!("IOSurfaceCreate {alloc}"));
        let alloc = if self.st().script.small_surfaces { 4096 } else { alloc };
        // Filled with a pattern so that the zeroing at creation is observable.
        let s = SurfaceRef(self.add(Obj::Surface(vec![0xAB; alloc])));
        Ok(s)
    }
    fn surface_alloc_size(&self, s: SurfaceRef) -> usize {
        self.surface_bytes(s).len()
    }
    fn write_surface(&self, s: SurfaceRef, bytes: &[u8], lock: bool, zero_rest: bool) -> Result<(), AppleError> {
        if lock {
            self.call("IOSurfaceLock");
        }
        let mut b = self.surface_bytes(s);
        if bytes.len() > b.len() {
            return Err(AppleError::Surface("too many bytes".into()));
        }
        b[..bytes.len()].copy_from_slice(bytes);
        if zero_rest {
            b[bytes.len()..].fill(0);
        }
        self.set_surface(s, b);
        Ok(())
    }
    fn read_surface(&self, s: SurfaceRef, out: &mut [u8], lock: bool) -> Result<(), AppleError> {
        if lock {
            self.call("IOSurfaceLock");
        }
        let b = self.surface_bytes(s);
        out.copy_from_slice(&b[..out.len()]);
        Ok(())
    }
    fn cf_release(&self, s: SurfaceRef) {
        self.call("CFRelease");
        self.st().released_surfaces.push(s);
    }
}
