//! A fake [`Runtime`] for tests: objects live in a table (an `Id` is its index + 1), every call
//! is recorded, reference counts are tracked, and failures can be injected.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::AppleError;
use super::objc::Id;
use super::runtime::{Runtime, SurfaceKey, SurfaceRef};

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
    Model {
        desc: Id,
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

/// Injected behaviour.
#[derive(Debug, Clone, Default)]
pub(crate) struct Script {
    /// What `hexStringIdentifier` returns (default: `"feedc0de"`).
    pub hex: Option<Option<String>>,
    /// `compileWithQoS:` fails with this description.
    pub compile_error: Option<String>,
    /// The next this-many `loadWithQoS:` calls fail.
    pub load_failures: usize,
    /// `loadWithQoS:` fails whenever this many models are loaded already.
    pub budget: Option<usize>,
    /// `evaluateWithQoS:` fails with this description.
    pub eval_error: Option<String>,
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
    /// Identifiers the ANE service holds compiled programs for at start (an earlier process).
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
    /// Identifiers of compiled programs the "ANE service" holds.
    os_cache: HashSet<String>,
    /// Files written through `write_file`.
    writes: Vec<PathBuf>,
    script: Script,
}

/// The fake runtime. Clones share one state, so a test can keep a handle to a runtime the device
/// owns and inspect it after the device is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Fake {
    state: Arc<Mutex<State>>,
    keys: [Id; 6],
    temp: PathBuf,
}

impl Fake {
    pub(crate) fn new() -> Fake {
        Fake::with(Script::default(), super::modeldir::test_dir("fake-tmp"))
    }

    pub(crate) fn with(script: Script, temp: PathBuf) -> Fake {
        let mut st = State {
            os_cache: script.os_cache.iter().cloned().collect(),
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
            keys,
            temp,
        }
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
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
        let st = self.st();
        st.refs
            .iter()
            .filter(|(id, n)| **n > 0 && matches!(st.objects[id.0 as usize - 1], Obj::Model { .. }))
            .count()
    }

    fn hex(&self) -> Option<String> {
        self.st().script.hex.clone().unwrap_or(Some("feedc0de".into()))
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

    fn model_of_request(&self, request: Id) -> (Vec<SurfaceRef>, Vec<SurfaceRef>) {
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

    /// What the fake "ANE" computes: output j = input j's bytes (identity), zero-padded or cut.
    fn run(&self, request: Id) {
        let (ins, outs) = self.model_of_request(request);
        for (j, o) in outs.iter().enumerate() {
            let len = self.surface_bytes(*o).len();
            let mut b = ins.get(j).map(|i| self.surface_bytes(*i)).unwrap_or_default();
            b.resize(len, 0);
            self.set_surface(*o, b);
        }
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
        Ok(self.add(Obj::Model { desc }))
    }
    fn hex_string_identifier(&self, _model: Id) -> Option<String> {
        self.hex()
    }
    fn local_model_path(&self, _model: Id) -> Option<PathBuf> {
        let root = self.st().script.local_root.clone()?;
        Some(root.join(self.hex()?))
    }
    fn compiled_model_exists(&self, _model: Id) -> Option<bool> {
        self.call("compiledModelExists");
        if self.st().script.no_compiled_model_exists {
            return None;
        }
        let hex = self.hex()?;
        Some(self.st().os_cache.contains(&hex))
    }
    fn compile(&self, _model: Id, qos: u32, options: Id) -> Result<(), String> {
        self.call(format!("compile qos={qos}"));
        assert_eq!(self.obj(options), Obj::Dict(vec![]), "options must be @{{}}");
        let error = self.st().script.compile_error.clone();
        match error {
            Some(e) => Err(e),
            None => {
                if let Some(hex) = self.hex() {
                    self.st().os_cache.insert(hex);
                }
                Ok(())
            }
        }
    }
    fn load(&self, model: Id, qos: u32, options: Id) -> Result<(), String> {
        self.call(format!("load qos={qos}"));
        assert_eq!(self.obj(options), Obj::Dict(vec![]), "options must be @{{}}");
        let mut st = self.st();
        if st.script.load_failures > 0 {
            st.script.load_failures -= 1;
            return Err("Error Domain=com.apple.appleneuralengine Code=-1 \"load failed\"".into());
        }
        if st.script.budget.is_some_and(|b| st.loaded.len() >= b) {
            return Err("Error Domain=com.apple.appleneuralengine Code=5 \"out of program slots\"".into());
        }
        st.loaded.push(model);
        Ok(())
    }
    fn evaluate(&self, _model: Id, qos: u32, options: Id, request: Id) -> Result<(), String> {
        self.call(format!("evaluate qos={qos}"));
        assert_eq!(self.obj(options), Obj::Dict(vec![]));
        if let Some(e) = self.st().script.eval_error.clone() {
            return Err(e);
        }
        self.run(request);
        Ok(())
    }
    fn unload(&self, model: Id, qos: u32) -> Result<(), String> {
        self.call(format!("unload qos={qos}"));
        self.st().loaded.retain(|&m| m != model);
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
    fn evaluate_direct(&self, _client: Id, _model: Id, _options: Id, request: Id, qos: u32) -> Result<(), String> {
        self.call(format!("direct qos={qos}"));
        if let Some(e) = self.st().script.direct_error.clone() {
            return Err(e);
        }
        self.run(request);
        Ok(())
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
