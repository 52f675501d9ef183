//! The real [`Runtime`]: Foundation, AppleNeuralEngine, IOSurface and CoreFoundation driven
//! through the Objective-C runtime, every call under its exact C signature.

use std::ffi::{CStr, c_char, c_void};
use std::path::PathBuf;

use super::error::{AppleError, ns_error_text};
use super::objc::{
    ANE_FRAMEWORK, COREFOUNDATION, FOUNDATION, IOSURFACE, Id, Lib, MsgArity, MsgBool, MsgBoolDirect, MsgBoolId,
    MsgBoolQosErr, MsgBoolQosOptsErr, MsgBoolQosOptsReqErr, MsgBoolSel, MsgCStr, MsgId, MsgIdBool, MsgIdBytes,
    MsgIdCStr, MsgIdDict, MsgIdI32, MsgIdId, MsgIdId3, MsgIdId7, MsgIdU64, MsgIdUsize, MsgVoid, MsgVoidId,
    MsgVoidSetId, Objc, Typed, YES, c_string,
};
use super::runtime::{Runtime, SurfaceKey, SurfaceRef};

/// The four classes the in-memory path needs (ane-runtime.md §2.1).
pub const REQUIRED_CLASSES: [&str; 4] = [
    "_ANEInMemoryModelDescriptor",
    "_ANEInMemoryModel",
    "_ANERequest",
    "_ANEIOSurfaceObject",
];

/// The optional class of direct evaluation.
pub const CLIENT_CLASS: &str = "_ANEClient";

/// The selector direct evaluation needs on `_ANEClient`.
pub const DIRECT_EVAL_SELECTOR: &CStr = c"doEvaluateDirectWithModel:options:request:qos:error:";

/// Every ANE method the device sends: `(class, selector, class method?)`. They are checked at
/// open, because sending a selector a class does not implement raises an Objective-C exception,
/// which would abort the process instead of giving an error.
pub const REQUIRED_METHODS: [(&str, &CStr, bool); 8] = [
    (
        "_ANEInMemoryModelDescriptor",
        c"modelWithMILText:weights:optionsPlist:",
        true,
    ),
    ("_ANEInMemoryModel", c"inMemoryModelWithDescriptor:", true),
    ("_ANEInMemoryModel", c"hexStringIdentifier", false),
    ("_ANEInMemoryModel", c"compileWithQoS:options:error:", false),
    ("_ANEInMemoryModel", c"loadWithQoS:options:error:", false),
    ("_ANEInMemoryModel", c"evaluateWithQoS:options:request:error:", false),
    ("_ANEInMemoryModel", c"unloadWithQoS:error:", false),
    (
        "_ANERequest",
        c"requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:",
        true,
    ),
];

/// Optional `_ANEInMemoryModel` methods, used only when the class implements them (checked at
/// open): `localModelPath` (the model directory), `compiledModelExists` (the cache probe) and
/// `setDescriptor:` (sent with nil after a cache-hit load, so the model stops holding a second
/// copy of the weights).
pub const OPTIONAL_MODEL_METHODS: [&CStr; 3] = [c"localModelPath", c"compiledModelExists", c"setDescriptor:"];

/// `+[_ANEIOSurfaceObject objectWithIOSurface:]`, checked like [`REQUIRED_METHODS`].
const SURFACE_OBJECT_METHOD: (&str, &CStr, bool) = ("_ANEIOSurfaceObject", c"objectWithIOSurface:", true);

/// The required methods (`+[C m]` / `-[C m]`) that the classes present do not implement.
fn missing_methods(objc: &Objc) -> Vec<String> {
    let responds = objc.sel(c"respondsToSelector:");
    let instances_respond = objc.sel(c"instancesRespondToSelector:");
    REQUIRED_METHODS
        .iter()
        .chain(std::iter::once(&SURFACE_OBJECT_METHOD))
        .filter_map(|&(class, sel, class_method)| {
            let name = format!(
                "{}[{class} {}]",
                if class_method { '+' } else { '-' },
                sel.to_string_lossy()
            );
            let Some(cls) = objc.class(class) else {
                return Some(name);
            };
            let s = objc.sel(sel);
            let check = if class_method { responds } else { instances_respond };
            // SAFETY: `+[NSObject respondsToSelector:(SEL)]` (on a class object: its class methods)
            // and `+[NSObject instancesRespondToSelector:(SEL)]` both return BOOL.
            let yes = unsafe { objc.msg::<MsgBoolSel>()(cls, check, s) } != 0;
            (!yes).then_some(name)
        })
        .collect()
}

/// `+[cls instancesRespondToSelector:name]`.
fn instances_respond(objc: &Objc, cls: Id, name: &CStr) -> bool {
    let check = objc.sel(c"instancesRespondToSelector:");
    let s = objc.sel(name);
    // SAFETY: `+[NSObject instancesRespondToSelector:(SEL)]` returns BOOL; `cls` is a class object.
    (unsafe { objc.msg::<MsgBoolSel>()(cls, check, s) }) != 0
}

/// `kIOSurfaceLockReadOnly`.
const IOSURFACE_LOCK_READ_ONLY: u32 = 1;

type IoSurfaceCreateFn = unsafe extern "C" fn(Id) -> Id;
type IoSurfaceBaseFn = unsafe extern "C" fn(Id) -> *mut c_void;
type IoSurfaceSizeFn = unsafe extern "C" fn(Id) -> usize;
type IoSurfaceLockFn = unsafe extern "C" fn(Id, u32, *mut u32) -> i32;
type CfReleaseFn = unsafe extern "C" fn(Id);
type NsTemporaryDirectoryFn = unsafe extern "C" fn() -> Id;

struct Classes {
    ns_string: Id,
    ns_data: Id,
    ns_number: Id,
    ns_dictionary: Id,
    ns_mutable_array: Id,
    descriptor: Id,
    model: Id,
    request: Id,
    surface_object: Id,
    client: Option<Id>,
}

/// Declares every selector the runtime sends with the message type it is sent with: the `Sels`
/// fields (typed, so a call site gets `objc_msgSend` as exactly that type) and
/// [`SELECTOR_ARITIES`], which the table test checks (colon count = argument count).
macro_rules! selectors {
    ($($field:ident: $msg:ty = $name:expr;)*) => {
        struct Sels {
            $($field: Typed<$msg>,)*
        }

        impl Sels {
            fn register(o: &Objc) -> Sels {
                Sels {
                    $($field: o.typed($name),)*
                }
            }
        }

        /// Every selector the runtime sends through `Sels`, with the argument count of the
        /// message type it is sent with.
        pub const SELECTOR_ARITIES: &[(&CStr, usize)] = &[$(($name, <$msg as MsgArity>::ARGS),)*];
    };
}

selectors! {
    alloc: MsgId = c"alloc";
    retain: MsgId = c"retain";
    release: MsgVoid = c"release";
    description: MsgId = c"description";
    utf8_string: MsgCStr = c"UTF8String";
    is_kind_of_class: MsgBoolId = c"isKindOfClass:";
    instances_respond: MsgBoolSel = c"instancesRespondToSelector:";
    string_with_utf8: MsgIdCStr = c"stringWithUTF8String:";
    data_with_bytes: MsgIdBytes = c"dataWithBytes:length:";
    number_with_int: MsgIdI32 = c"numberWithInt:";
    number_with_ulong: MsgIdU64 = c"numberWithUnsignedLong:";
    dictionary_with: MsgIdDict = c"dictionaryWithObjects:forKeys:count:";
    dictionary: MsgId = c"dictionary";
    array_with_capacity: MsgIdUsize = c"arrayWithCapacity:";
    add_object: MsgVoidId = c"addObject:";
    model_with_mil: MsgIdId3 = c"modelWithMILText:weights:optionsPlist:";
    in_memory_model: MsgIdId = c"inMemoryModelWithDescriptor:";
    hex_id: MsgId = c"hexStringIdentifier";
    local_model_path: MsgId = OPTIONAL_MODEL_METHODS[0];
    compiled_model_exists: MsgBool = OPTIONAL_MODEL_METHODS[1];
    set_descriptor: MsgVoidSetId = OPTIONAL_MODEL_METHODS[2];
    compile: MsgBoolQosOptsErr = c"compileWithQoS:options:error:";
    load: MsgBoolQosOptsErr = c"loadWithQoS:options:error:";
    evaluate: MsgBoolQosOptsReqErr = c"evaluateWithQoS:options:request:error:";
    unload: MsgBoolQosErr = c"unloadWithQoS:error:";
    object_with_surface: MsgIdId = c"objectWithIOSurface:";
    request_with: MsgIdId7 = c"requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:";
    init_restricted: MsgIdBool = c"initWithRestrictedAccessAllowed:";
    direct_eval: MsgBoolDirect = DIRECT_EVAL_SELECTOR;
}

/// One step of opening the device, for `anelm doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeStep {
    /// What was checked.
    pub what: String,
    /// `Ok(detail)` or `Err(exact failure)`.
    pub result: Result<String, String>,
}

/// The loaded libraries, classes, selectors and C functions.
pub(crate) struct Framework {
    objc: Objc,
    cls: Classes,
    sel: Sels,
    keys: [Id; 6],
    /// `_ANEInMemoryModel` implements `localModelPath`.
    has_local_model_path: bool,
    /// `_ANEInMemoryModel` implements `compiledModelExists`.
    has_compiled_model_exists: bool,
    /// `_ANEInMemoryModel` implements `setDescriptor:`.
    has_set_descriptor: bool,
    surface_create: IoSurfaceCreateFn,
    surface_base: IoSurfaceBaseFn,
    surface_size: IoSurfaceSizeFn,
    surface_lock: IoSurfaceLockFn,
    surface_unlock: IoSurfaceLockFn,
    cf_release: CfReleaseFn,
    ns_temporary_directory: NsTemporaryDirectoryFn,
    _libs: Vec<Lib>,
}

impl Framework {
    /// Load everything, failing at the first missing piece with an "unavailable" error.
    pub(crate) fn open() -> Result<Framework, AppleError> {
        let objc = Objc::load()?;
        let foundation = Lib::open(FOUNDATION)?;
        let cf = Lib::open(COREFOUNDATION)?;
        let io = Lib::open(IOSURFACE)?;
        let ane = Lib::open(ANE_FRAMEWORK)?;
        let cls = Classes {
            ns_string: objc.require_class("NSString")?,
            ns_data: objc.require_class("NSData")?,
            ns_number: objc.require_class("NSNumber")?,
            ns_dictionary: objc.require_class("NSDictionary")?,
            ns_mutable_array: objc.require_class("NSMutableArray")?,
            descriptor: objc.require_class(REQUIRED_CLASSES[0])?,
            model: objc.require_class(REQUIRED_CLASSES[1])?,
            request: objc.require_class(REQUIRED_CLASSES[2])?,
            surface_object: objc.require_class(REQUIRED_CLASSES[3])?,
            client: objc.class(CLIENT_CLASS),
        };
        let missing = missing_methods(&objc);
        if !missing.is_empty() {
            return Err(AppleError::unavailable(format!(
                "this macOS's AppleNeuralEngine.framework lacks {}",
                missing.join(", ")
            )));
        }
        let sel = Sels::register(&objc);
        let [has_local_model_path, has_compiled_model_exists, has_set_descriptor] =
            OPTIONAL_MODEL_METHODS.map(|m| instances_respond(&objc, cls.model, m));
        let mut keys = [Id::NIL; 6];
        for (slot, k) in keys.iter_mut().zip(SurfaceKey::ALL) {
            *slot = io.object_global(k.symbol())?;
        }
        // SAFETY (all transmutes): each symbol gets its documented C type:
        // `IOSurfaceRef IOSurfaceCreate(CFDictionaryRef)`, `void *IOSurfaceGetBaseAddress(IOSurfaceRef)`,
        // `size_t IOSurfaceGetAllocSize(IOSurfaceRef)`,
        // `kern_return_t IOSurfaceLock/IOSurfaceUnlock(IOSurfaceRef, IOSurfaceLockOptions (uint32_t), uint32_t *seed)`,
        // `void CFRelease(CFTypeRef)`, `NSString *NSTemporaryDirectory(void)`.
        let fw = unsafe {
            Framework {
                surface_create: std::mem::transmute::<unsafe extern "C" fn(), IoSurfaceCreateFn>(
                    io.function("IOSurfaceCreate")?,
                ),
                surface_base: std::mem::transmute::<unsafe extern "C" fn(), IoSurfaceBaseFn>(
                    io.function("IOSurfaceGetBaseAddress")?,
                ),
                surface_size: std::mem::transmute::<unsafe extern "C" fn(), IoSurfaceSizeFn>(
                    io.function("IOSurfaceGetAllocSize")?,
                ),
                surface_lock: std::mem::transmute::<unsafe extern "C" fn(), IoSurfaceLockFn>(
                    io.function("IOSurfaceLock")?,
                ),
                surface_unlock: std::mem::transmute::<unsafe extern "C" fn(), IoSurfaceLockFn>(
                    io.function("IOSurfaceUnlock")?,
                ),
                cf_release: std::mem::transmute::<unsafe extern "C" fn(), CfReleaseFn>(cf.function("CFRelease")?),
                ns_temporary_directory: std::mem::transmute::<unsafe extern "C" fn(), NsTemporaryDirectoryFn>(
                    foundation.function("NSTemporaryDirectory")?,
                ),
                objc,
                cls,
                sel,
                keys,
                has_local_model_path,
                has_compiled_model_exists,
                has_set_descriptor,
                _libs: vec![foundation, cf, io, ane],
            }
        };
        Ok(fw)
    }

    /// Check each piece in turn and say what was found (never fails; for `anelm doctor`).
    pub(crate) fn probe() -> Vec<ProbeStep> {
        fn step(what: &str, r: Result<String, AppleError>) -> ProbeStep {
            ProbeStep {
                what: what.to_string(),
                result: r.map_err(|e| match e {
                    AppleError::Unavailable { detail } => detail,
                    e => e.to_string(),
                }),
            }
        }
        let mut steps = Vec::new();
        let objc = Objc::load();
        let objc_ok = objc
            .as_ref()
            .map(|_| "libobjc loaded".to_string())
            .map_err(Clone::clone);
        steps.push(step("Objective-C runtime", objc_ok));
        let Ok(objc) = objc else { return steps };
        let mut libs = Vec::new();
        for (what, path) in [
            ("Foundation", FOUNDATION),
            ("CoreFoundation", COREFOUNDATION),
            ("IOSurface", IOSURFACE),
        ] {
            let r = Lib::open(path).map(|l| libs.push(l)).map(|_| path.to_string());
            steps.push(step(what, r));
        }
        let fw = Lib::open(ANE_FRAMEWORK)
            .map(|l| libs.push(l))
            .map(|_| ANE_FRAMEWORK.to_string());
        let fw_ok = fw.is_ok();
        steps.push(step("AppleNeuralEngine.framework found", fw));
        if !fw_ok {
            return steps;
        }
        let missing: Vec<&str> = REQUIRED_CLASSES
            .iter()
            .copied()
            .filter(|c| objc.class(c).is_none())
            .collect();
        let classes = if missing.is_empty() {
            Ok(REQUIRED_CLASSES.join(", "))
        } else {
            Err(AppleError::unavailable(format!("missing: {}", missing.join(", "))))
        };
        let classes_ok = classes.is_ok();
        steps.push(step("classes found", classes));
        if classes_ok {
            let missing = missing_methods(&objc);
            let methods = if missing.is_empty() {
                Ok(format!("all {} methods anelm sends", REQUIRED_METHODS.len() + 1))
            } else {
                Err(AppleError::unavailable(format!("missing: {}", missing.join(", "))))
            };
            steps.push(step("methods found", methods));
            if let Some(model) = objc.class(REQUIRED_CLASSES[1]) {
                let found: Vec<String> = OPTIONAL_MODEL_METHODS
                    .iter()
                    .map(|m| {
                        let yes = instances_respond(&objc, model, m);
                        format!("{} {}", m.to_string_lossy(), if yes { "present" } else { "absent" })
                    })
                    .collect();
                steps.push(step("optional model methods", Ok(found.join(", "))));
            }
        }
        let client = match objc.class(CLIENT_CLASS) {
            None => Ok(format!("{CLIENT_CLASS} absent (direct evaluation off; not needed)")),
            Some(cls) => {
                let responds_sel = objc.sel(c"instancesRespondToSelector:");
                let direct = objc.sel(DIRECT_EVAL_SELECTOR);
                // SAFETY: `+[NSObject instancesRespondToSelector:(SEL)]` returns BOOL.
                let yes = unsafe { objc.msg::<MsgBoolSel>()(cls, responds_sel, direct) } != 0;
                Ok(format!(
                    "{CLIENT_CLASS} present, {} doEvaluateDirectWithModel:options:request:qos:error:",
                    if yes { "implements" } else { "does not implement" }
                ))
            }
        };
        steps.push(step("direct-evaluation client (optional)", client));
        steps
    }

    /// An NSString's UTF-8 text (nil or not a string → `None`).
    fn ns_string_text(&self, s: Id) -> Option<String> {
        if s.is_nil() {
            return None;
        }
        // SAFETY: `-[NSObject isKindOfClass:(Class)]` returns BOOL; `s` is a live object.
        let is_string = unsafe {
            self.objc.msg_of(self.sel.is_kind_of_class)(s, self.sel.is_kind_of_class.sel, self.cls.ns_string)
        };
        if is_string == 0 {
            return None;
        }
        // SAFETY: `-[NSString UTF8String]` returns a NUL-terminated buffer that lives as long as
        // the string (inside the caller's autorelease pool); it is copied at once.
        unsafe { c_string(self.objc.msg_of(self.sel.utf8_string)(s, self.sel.utf8_string.sel)) }
    }

    /// The `description` of an NSError out-parameter (nil → a note that there was none).
    fn error_text(&self, err: Id) -> String {
        if err.is_nil() {
            return ns_error_text(None);
        }
        // SAFETY: `-[NSObject description]` returns an NSString.
        let d = unsafe { self.objc.msg_of(self.sel.description)(err, self.sel.description.sel) };
        ns_error_text(self.ns_string_text(d))
    }

    fn bool_call(&self, call: impl FnOnce(*mut Id) -> u8) -> Result<(), String> {
        let mut err = Id::NIL;
        if call(&mut err) != 0 {
            Ok(())
        } else {
            Err(self.error_text(err))
        }
    }

    fn non_nil(call: &'static str, o: Id) -> Result<Id, AppleError> {
        if o.is_nil() {
            Err(AppleError::Nil {
                call,
                hint: String::new(),
            })
        } else {
            Ok(o)
        }
    }

    fn with_surface<T>(
        &self,
        s: SurfaceRef,
        lock: bool,
        options: u32,
        f: impl FnOnce(*mut u8, usize) -> T,
    ) -> Result<T, AppleError> {
        if lock {
            // SAFETY: `s` is a live IOSurface; a NULL seed pointer is allowed.
            let r = unsafe { (self.surface_lock)(s.0, options, std::ptr::null_mut()) };
            if r != 0 {
                return Err(AppleError::Surface(format!("IOSurfaceLock returned {r:#x}")));
            }
        }
        // SAFETY: `s` is a live IOSurface.
        let (base, size) = unsafe { ((self.surface_base)(s.0) as *mut u8, (self.surface_size)(s.0)) };
        let out = if base.is_null() {
            Err(AppleError::Surface("IOSurfaceGetBaseAddress returned NULL".into()))
        } else {
            Ok(f(base, size))
        };
        if lock {
            // SAFETY: unlocking the lock taken above with the same options.
            unsafe { (self.surface_unlock)(s.0, options, std::ptr::null_mut()) };
        }
        out
    }
}

impl Runtime for Framework {
    fn data(&self, bytes: &[u8]) -> Result<Id, AppleError> {
        // SAFETY: `+[NSData dataWithBytes:(const void *)length:(NSUInteger)]` copies `bytes`.
        let d = unsafe {
            self.objc.msg_of(self.sel.data_with_bytes)(
                self.cls.ns_data,
                self.sel.data_with_bytes.sel,
                bytes.as_ptr().cast(),
                bytes.len(),
            )
        };
        Self::non_nil("+[NSData dataWithBytes:length:]", d)
    }

    fn string(&self, s: &str) -> Result<Id, AppleError> {
        let c = std::ffi::CString::new(s).map_err(|_| AppleError::Nul { what: "an NSString" })?;
        // SAFETY: `+[NSString stringWithUTF8String:(const char *)]` copies the NUL-terminated text.
        let o = unsafe {
            self.objc.msg_of(self.sel.string_with_utf8)(
                self.cls.ns_string,
                self.sel.string_with_utf8.sel,
                c.as_ptr() as *const c_char,
            )
        };
        Self::non_nil("+[NSString stringWithUTF8String:]", o)
    }

    fn number_int(&self, v: i32) -> Result<Id, AppleError> {
        // SAFETY: `+[NSNumber numberWithInt:(int)]`.
        let o =
            unsafe { self.objc.msg_of(self.sel.number_with_int)(self.cls.ns_number, self.sel.number_with_int.sel, v) };
        Self::non_nil("+[NSNumber numberWithInt:]", o)
    }

    fn number_ulong(&self, v: u64) -> Result<Id, AppleError> {
        // SAFETY: `+[NSNumber numberWithUnsignedLong:(unsigned long)]`, 64-bit on arm64.
        let o = unsafe {
            self.objc.msg_of(self.sel.number_with_ulong)(self.cls.ns_number, self.sel.number_with_ulong.sel, v)
        };
        Self::non_nil("+[NSNumber numberWithUnsignedLong:]", o)
    }

    fn dictionary(&self, keys: &[Id], values: &[Id]) -> Result<Id, AppleError> {
        if keys.len() != values.len() {
            return Err(AppleError::Signature(format!(
                "dictionary with {} keys and {} values",
                keys.len(),
                values.len()
            )));
        }
        // SAFETY: `+[NSDictionary dictionaryWithObjects:(const id *)forKeys:(const id *)count:(NSUInteger)]`
        // reads `count` objects and keys (objects first); both slices hold that many live objects.
        let d = unsafe {
            self.objc.msg_of(self.sel.dictionary_with)(
                self.cls.ns_dictionary,
                self.sel.dictionary_with.sel,
                values.as_ptr(),
                keys.as_ptr(),
                keys.len(),
            )
        };
        Self::non_nil("+[NSDictionary dictionaryWithObjects:forKeys:count:]", d)
    }

    fn empty_dictionary(&self) -> Result<Id, AppleError> {
        // SAFETY: `+[NSDictionary dictionary]` returns an empty dictionary.
        let d = unsafe { self.objc.msg_of(self.sel.dictionary)(self.cls.ns_dictionary, self.sel.dictionary.sel) };
        Self::non_nil("+[NSDictionary dictionary]", d)
    }

    fn array(&self, items: &[Id]) -> Result<Id, AppleError> {
        // SAFETY: `+[NSMutableArray arrayWithCapacity:(NSUInteger)]`.
        let a = unsafe {
            self.objc.msg_of(self.sel.array_with_capacity)(
                self.cls.ns_mutable_array,
                self.sel.array_with_capacity.sel,
                items.len(),
            )
        };
        let a = Self::non_nil("+[NSMutableArray arrayWithCapacity:]", a)?;
        for &i in items {
            // SAFETY: `-[NSMutableArray addObject:(id)]` with a live, non-nil object.
            unsafe { self.objc.msg_of(self.sel.add_object)(a, self.sel.add_object.sel, i) };
        }
        Ok(a)
    }

    fn retain(&self, o: Id) -> Id {
        if o.is_nil() {
            return o;
        }
        // SAFETY: `-[NSObject retain]` returns the receiver.
        unsafe { self.objc.msg_of(self.sel.retain)(o, self.sel.retain.sel) }
    }

    fn release(&self, o: Id) {
        if !o.is_nil() {
            // SAFETY: `-[NSObject release]` (oneway void) balances a retain or +1 reference held
            // by the caller.
            unsafe { self.objc.msg_of(self.sel.release)(o, self.sel.release.sel) }
        }
    }

    fn pool_push(&self) -> usize {
        self.objc.pool_push() as usize
    }

    fn pool_pop(&self, token: usize) {
        // SAFETY: the device pops the token of its own push, on the same thread, in order
        // (it is popped by a guard dropped in the scope that pushed it).
        unsafe { self.objc.pool_pop(token as *mut c_void) }
    }

    fn temp_dir(&self) -> PathBuf {
        // SAFETY: `NSString *NSTemporaryDirectory(void)` returns an autoreleased string.
        let s = unsafe { (self.ns_temporary_directory)() };
        self.ns_string_text(s)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
    }

    fn descriptor(&self, mil: Id, weights: Id) -> Result<Id, AppleError> {
        // SAFETY: `+[_ANEInMemoryModelDescriptor modelWithMILText:(NSData *)weights:(NSDictionary *)optionsPlist:(id)]`
        // with two live objects and nil (ane-hardware.md §1.2).
        let d = unsafe {
            self.objc.msg_of(self.sel.model_with_mil)(
                self.cls.descriptor,
                self.sel.model_with_mil.sel,
                mil,
                weights,
                Id::NIL,
            )
        };
        if d.is_nil() {
            return Err(AppleError::Nil {
                call: "+[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]",
                hint: " (the framework rejected the MIL text or the weights dictionary; check the program with \
                       `anelm doctor` and the emulator)"
                    .into(),
            });
        }
        Ok(d)
    }

    fn in_memory_model(&self, desc: Id) -> Result<Id, AppleError> {
        // SAFETY: `+[_ANEInMemoryModel inMemoryModelWithDescriptor:(id)]`.
        let m =
            unsafe { self.objc.msg_of(self.sel.in_memory_model)(self.cls.model, self.sel.in_memory_model.sel, desc) };
        Self::non_nil("+[_ANEInMemoryModel inMemoryModelWithDescriptor:]", m)
    }

    fn hex_string_identifier(&self, model: Id) -> Option<String> {
        // SAFETY: `-[_ANEInMemoryModel hexStringIdentifier]` returns an NSString (checked).
        let s = unsafe { self.objc.msg_of(self.sel.hex_id)(model, self.sel.hex_id.sel) };
        self.ns_string_text(s).filter(|s| !s.is_empty())
    }

    fn local_model_path(&self, model: Id) -> Option<PathBuf> {
        if !self.has_local_model_path {
            return None;
        }
        // SAFETY: `-[_ANEInMemoryModel localModelPath]` (implemented: checked at open) returns an
        // NSString (checked by `ns_string_text`).
        let s = unsafe { self.objc.msg_of(self.sel.local_model_path)(model, self.sel.local_model_path.sel) };
        self.ns_string_text(s).filter(|s| !s.is_empty()).map(PathBuf::from)
    }

    fn compiled_model_exists(&self, model: Id) -> Option<bool> {
        if !self.has_compiled_model_exists {
            return None;
        }
        // SAFETY: `-[_ANEInMemoryModel compiledModelExists]` (implemented: checked at open) takes
        // no arguments and returns BOOL.
        Some(
            unsafe { self.objc.msg_of(self.sel.compiled_model_exists)(model, self.sel.compiled_model_exists.sel) } != 0,
        )
    }

    fn release_descriptor(&self, model: Id) -> bool {
        if !self.has_set_descriptor {
            return false;
        }
        // SAFETY: `-[_ANEInMemoryModel setDescriptor:(id)]` (implemented: checked at open) takes one
        // object, here nil; `model` is a live, retained model.
        unsafe {
            self.objc.msg_of(self.sel.set_descriptor)(model, self.sel.set_descriptor.sel, Id::NIL);
        }
        true
    }

    fn compile(&self, model: Id, qos: u32, options: Id) -> Result<(), String> {
        self.bool_call(|err| {
            // SAFETY: `-[_ANEInMemoryModel compileWithQoS:(unsigned int)options:(NSDictionary *)error:(NSError **)]`.
            unsafe { self.objc.msg_of(self.sel.compile)(model, self.sel.compile.sel, qos, options, err) }
        })
    }

    fn load(&self, model: Id, qos: u32, options: Id) -> Result<(), String> {
        self.bool_call(|err| {
            // SAFETY: `-[_ANEInMemoryModel loadWithQoS:(unsigned int)options:(NSDictionary *)error:(NSError **)]`.
            unsafe { self.objc.msg_of(self.sel.load)(model, self.sel.load.sel, qos, options, err) }
        })
    }

    fn evaluate(&self, model: Id, qos: u32, options: Id, request: Id) -> Result<(), String> {
        self.bool_call(|err| {
            // SAFETY: `-[_ANEInMemoryModel evaluateWithQoS:(unsigned int)options:(NSDictionary *)request:(id)error:(NSError **)]`.
            unsafe { self.objc.msg_of(self.sel.evaluate)(model, self.sel.evaluate.sel, qos, options, request, err) }
        })
    }

    fn unload(&self, model: Id, qos: u32) -> Result<(), String> {
        self.bool_call(|err| {
            // SAFETY: `-[_ANEInMemoryModel unloadWithQoS:(unsigned int)error:(NSError **)]`.
            unsafe { self.objc.msg_of(self.sel.unload)(model, self.sel.unload.sel, qos, err) }
        })
    }

    fn surface_object(&self, surface: SurfaceRef) -> Result<Id, AppleError> {
        // SAFETY: `+[_ANEIOSurfaceObject objectWithIOSurface:(IOSurfaceRef)]` with a live surface.
        let o = unsafe {
            self.objc.msg_of(self.sel.object_with_surface)(
                self.cls.surface_object,
                self.sel.object_with_surface.sel,
                surface.0,
            )
        };
        Self::non_nil("+[_ANEIOSurfaceObject objectWithIOSurface:]", o)
    }

    fn request(
        &self,
        inputs: Id,
        input_indices: Id,
        outputs: Id,
        output_indices: Id,
        procedure: Id,
    ) -> Result<Id, AppleError> {
        // SAFETY: `+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:]`
        // takes seven objects; weightsBuffer and perfStats are nil (ane-hardware.md §1.5).
        let r = unsafe {
            self.objc.msg_of(self.sel.request_with)(
                self.cls.request,
                self.sel.request_with.sel,
                inputs,
                input_indices,
                outputs,
                output_indices,
                Id::NIL,
                Id::NIL,
                procedure,
            )
        };
        Self::non_nil(
            "+[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:]",
            r,
        )
    }

    fn direct_client(&self) -> Option<Id> {
        let cls = self.cls.client?;
        // SAFETY: `+[NSObject instancesRespondToSelector:(SEL)]` returns BOOL.
        let responds = unsafe {
            self.objc.msg_of(self.sel.instances_respond)(cls, self.sel.instances_respond.sel, self.sel.direct_eval.sel)
        };
        if responds == 0 {
            return None;
        }
        // SAFETY: `+alloc` then `-[_ANEClient initWithRestrictedAccessAllowed:(BOOL)]`; the result
        // is a +1 reference (or nil), released by the device.
        let c = unsafe {
            let a = self.objc.msg_of(self.sel.alloc)(cls, self.sel.alloc.sel);
            if a.is_nil() {
                return None;
            }
            self.objc.msg_of(self.sel.init_restricted)(a, self.sel.init_restricted.sel, YES)
        };
        (!c.is_nil()).then_some(c)
    }

    fn evaluate_direct(&self, client: Id, model: Id, options: Id, request: Id, qos: u32) -> Result<(), String> {
        self.bool_call(|err| {
            // SAFETY: `-[_ANEClient doEvaluateDirectWithModel:(id)options:(NSDictionary *)request:(id)qos:(unsigned int)error:(NSError **)]`.
            unsafe {
                self.objc.msg_of(self.sel.direct_eval)(
                    client,
                    self.sel.direct_eval.sel,
                    model,
                    options,
                    request,
                    qos,
                    err,
                )
            }
        })
    }

    fn surface_key(&self, key: SurfaceKey) -> Id {
        let i = SurfaceKey::ALL.iter().position(|&k| k == key).unwrap_or(0);
        self.keys[i]
    }

    fn create_surface(&self, properties: Id) -> Result<SurfaceRef, AppleError> {
        // SAFETY: `IOSurfaceCreate(CFDictionaryRef)` with an NSDictionary (toll-free bridged).
        let s = unsafe { (self.surface_create)(properties) };
        if s.is_nil() {
            return Err(AppleError::Surface("IOSurfaceCreate returned NULL".into()));
        }
        Ok(SurfaceRef(s))
    }

    fn surface_alloc_size(&self, s: SurfaceRef) -> usize {
        // SAFETY: `size_t IOSurfaceGetAllocSize(IOSurfaceRef)` on a live surface.
        unsafe { (self.surface_size)(s.0) }
    }

    fn write_surface(&self, s: SurfaceRef, bytes: &[u8], lock: bool, zero_rest: bool) -> Result<(), AppleError> {
        self.with_surface(s, lock, 0, |base, size| {
            if bytes.len() > size {
                return Err(AppleError::Surface(format!(
                    "writing {} bytes into a {size}-byte surface",
                    bytes.len()
                )));
            }
            // SAFETY: `base` points to `size` writable bytes of the surface and `bytes.len() ≤ size`;
            // the regions do not overlap (one is Rust memory, the other the surface).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), base, bytes.len());
                if zero_rest {
                    std::ptr::write_bytes(base.add(bytes.len()), 0, size - bytes.len());
                }
            }
            Ok(())
        })?
    }

    fn read_surface(&self, s: SurfaceRef, out: &mut [u8], lock: bool) -> Result<(), AppleError> {
        self.with_surface(s, lock, IOSURFACE_LOCK_READ_ONLY, |base, size| {
            if out.len() > size {
                return Err(AppleError::Surface(format!(
                    "reading {} bytes from a {size}-byte surface",
                    out.len()
                )));
            }
            // SAFETY: `base` points to `size ≥ out.len()` readable bytes; no overlap.
            unsafe { std::ptr::copy_nonoverlapping(base as *const u8, out.as_mut_ptr(), out.len()) };
            Ok(())
        })?
    }

    fn cf_release(&self, s: SurfaceRef) {
        if !s.0.is_nil() {
            // SAFETY: balances the +1 reference of `IOSurfaceCreate`.
            unsafe { (self.cf_release)(s.0) }
        }
    }
}
