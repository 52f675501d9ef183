//! Loading the Objective-C runtime at run time, and `objc_msgSend` under each exact C signature.
//!
//! Nothing here is linked: `libobjc` and every framework are `dlopen`ed through `libloading`,
//! so this file compiles on every platform and simply fails to open where there is no macOS.
//! On arm64 `objc_msgSend` must never be called as a variadic function: it is a trampoline that
//! jumps to the method's implementation with the caller's registers untouched, so each call
//! site transmutes it to the non-variadic `extern "C"` type of that method (the aliases below).

use std::ffi::{CStr, CString, c_char, c_void};
use std::ptr::null_mut;

use super::error::AppleError;

/// `libobjc`.
pub const LIBOBJC: &str = "/usr/lib/libobjc.A.dylib";
/// Foundation (NSString, NSData, NSNumber, NSDictionary, NSArray, NSTemporaryDirectory).
pub const FOUNDATION: &str = "/System/Library/Frameworks/Foundation.framework/Foundation";
/// CoreFoundation (`CFRelease`).
pub const COREFOUNDATION: &str = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation";
/// IOSurface (`IOSurfaceCreate` and friends, the `kIOSurface*` keys).
pub const IOSURFACE: &str = "/System/Library/Frameworks/IOSurface.framework/IOSurface";
/// The private Neural Engine framework (ane-runtime.md §2.1).
pub const ANE_FRAMEWORK: &str = "/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine";

/// An Objective-C object pointer (`id`, also used for `Class` and toll-free bridged CF objects).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Id(pub(crate) *mut c_void);

// SAFETY: an `Id` is only an address. The objects anelm keeps are retained by it and only used
// under the device's locks; retain/release and the immutable Foundation objects are
// thread-safe in the Objective-C runtime.
unsafe impl Send for Id {}
// SAFETY: as above; sharing the address does not touch the object.
unsafe impl Sync for Id {}

impl Id {
    /// `nil`.
    pub const NIL: Id = Id(null_mut());

    /// True for `nil`.
    pub fn is_nil(self) -> bool {
        self.0.is_null()
    }
}

/// A selector (`SEL`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sel(*const c_void);

// SAFETY: selectors are interned, immortal, process-wide names.
unsafe impl Send for Sel {}
// SAFETY: as above.
unsafe impl Sync for Sel {}

/// Objective-C `BOOL` on arm64 is C `bool`. It is received as a byte (never as Rust `bool`, which
/// would make any other bit pattern undefined behaviour) and compared with zero.
pub type ObjcBool = u8;
/// `YES`.
pub const YES: ObjcBool = 1;

// ---- Typed `objc_msgSend` signatures: (receiver, selector, arguments…) -> result. ----

/// `- (id)m` / `+ (id)m`: `alloc`, `retain`, `description`, `hexStringIdentifier`,
/// `localModelPath`, `dictionary`.
pub type MsgId = unsafe extern "C" fn(Id, Sel) -> Id;
/// `- (oneway void)release`.
pub type MsgVoid = unsafe extern "C" fn(Id, Sel);
/// `- (const char *)UTF8String`.
pub type MsgCStr = unsafe extern "C" fn(Id, Sel) -> *const c_char;
/// `+ (id)stringWithUTF8String:(const char *)s`.
pub type MsgIdCStr = unsafe extern "C" fn(Id, Sel, *const c_char) -> Id;
/// `+ (NSNumber *)numberWithInt:(int)v`.
pub type MsgIdI32 = unsafe extern "C" fn(Id, Sel, i32) -> Id;
/// `+ (NSNumber *)numberWithUnsignedLong:(unsigned long)v` (64-bit on arm64).
pub type MsgIdU64 = unsafe extern "C" fn(Id, Sel, u64) -> Id;
/// `+ (id)arrayWithCapacity:(NSUInteger)n`.
pub type MsgIdUsize = unsafe extern "C" fn(Id, Sel, usize) -> Id;
/// `+ (id)dataWithBytes:(const void *)b length:(NSUInteger)n`.
pub type MsgIdBytes = unsafe extern "C" fn(Id, Sel, *const c_void, usize) -> Id;
/// `+ (id)dictionaryWithObjects:(const id *)objects forKeys:(const id *)keys count:(NSUInteger)n`
/// (objects first, then keys).
pub type MsgIdDict = unsafe extern "C" fn(Id, Sel, *const Id, *const Id, usize) -> Id;
/// `- (void)addObject:(id)o`.
pub type MsgVoidId = unsafe extern "C" fn(Id, Sel, Id);
/// `+ (id)inMemoryModelWithDescriptor:(id)d`, `+ (id)objectWithIOSurface:(IOSurfaceRef)s`.
pub type MsgIdId = unsafe extern "C" fn(Id, Sel, Id) -> Id;
/// `- (BOOL)isKindOfClass:(Class)c`.
pub type MsgBoolId = unsafe extern "C" fn(Id, Sel, Id) -> ObjcBool;
/// `+ (BOOL)instancesRespondToSelector:(SEL)s`.
pub type MsgBoolSel = unsafe extern "C" fn(Id, Sel, Sel) -> ObjcBool;
/// `+ (id)modelWithMILText:(NSData *)mil weights:(NSDictionary *)w optionsPlist:(id)p`.
pub type MsgIdId3 = unsafe extern "C" fn(Id, Sel, Id, Id, Id) -> Id;
/// `+ (id)requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:`
/// (seven objects).
pub type MsgIdId7 = unsafe extern "C" fn(Id, Sel, Id, Id, Id, Id, Id, Id, Id) -> Id;
/// `- (BOOL)compileWithQoS:(unsigned int)q options:(NSDictionary *)o error:(NSError **)e`, and
/// `loadWithQoS:options:error:` (ane-hardware.md §1.2).
pub type MsgBoolQosOptsErr = unsafe extern "C" fn(Id, Sel, u32, Id, *mut Id) -> ObjcBool;
/// `- (BOOL)evaluateWithQoS:(unsigned int)q options:(NSDictionary *)o request:(id)r error:(NSError **)e`.
pub type MsgBoolQosOptsReqErr = unsafe extern "C" fn(Id, Sel, u32, Id, Id, *mut Id) -> ObjcBool;
/// `- (BOOL)unloadWithQoS:(unsigned int)q error:(NSError **)e`.
pub type MsgBoolQosErr = unsafe extern "C" fn(Id, Sel, u32, *mut Id) -> ObjcBool;
/// `- (id)initWithRestrictedAccessAllowed:(BOOL)b` on `_ANEClient`.
pub type MsgIdBool = unsafe extern "C" fn(Id, Sel, ObjcBool) -> Id;
/// `- (BOOL)doEvaluateDirectWithModel:(id)m options:(NSDictionary *)o request:(id)r qos:(unsigned int)q error:(NSError **)e`
/// on `_ANEClient` (the QoS is `unsigned int` in the iOS 18.2 restore image's class dump, as in
/// every in-memory model method).
pub type MsgBoolDirect = unsafe extern "C" fn(Id, Sel, Id, Id, Id, u32, *mut Id) -> ObjcBool;
/// `- (BOOL)compiledModelExists` on `_ANEInMemoryModel`.
pub type MsgBool = unsafe extern "C" fn(Id, Sel) -> ObjcBool;

/// `- (void)setDescriptor:(id)d` on `_ANEInMemoryModel` (sent with nil).
pub type MsgVoidSetId = MsgVoidId;

/// The number of arguments (after receiver and selector) of a typed `objc_msgSend`: what the
/// selector's colon count must equal.
pub(crate) trait MsgArity {
    /// Arguments after `(id self, SEL _cmd)`.
    const ARGS: usize;
}

macro_rules! arity {
    ($n:expr; $($a:ident),*) => {
        impl<R, $($a),*> MsgArity for unsafe extern "C" fn(Id, Sel $(, $a)*) -> R {
            const ARGS: usize = $n;
        }
    };
}
arity!(0;);
arity!(1; A);
arity!(2; A, B);
arity!(3; A, B, C);
arity!(4; A, B, C, D);
arity!(5; A, B, C, D, E);
arity!(6; A, B, C, D, E, F);
arity!(7; A, B, C, D, E, F, G);

/// A selector bound to the C type `F` of the message it is sent with (one of the `Msg*`
/// aliases): [`Objc::msg_of`] gives `objc_msgSend` as exactly that type, so a call site cannot
/// pair a selector with another signature, and the table test checks each selector's colon
/// count against `F`'s argument count.
pub(crate) struct Typed<F> {
    /// The registered selector.
    pub(crate) sel: Sel,
    _f: std::marker::PhantomData<F>,
}

impl<F> Clone for Typed<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F> Copy for Typed<F> {}

type GetClassFn = unsafe extern "C" fn(*const c_char) -> Id;
type RegisterSelFn = unsafe extern "C" fn(*const c_char) -> Sel;
type PoolPushFn = unsafe extern "C" fn() -> *mut c_void;
type PoolPopFn = unsafe extern "C" fn(*mut c_void);
type AnyFn = unsafe extern "C" fn();

/// A `dlopen`ed library (kept open for the life of the process that holds it).
pub(crate) struct Lib {
    path: &'static str,
    lib: libloading::Library,
}

impl Lib {
    /// `dlopen(path, RTLD_NOW)`.
    pub(crate) fn open(path: &'static str) -> Result<Lib, AppleError> {
        open_now(path)
            .map(|lib| Lib { path, lib })
            .map_err(|e| AppleError::unavailable(format!("dlopen({path}): {e}")))
    }

    /// The address of a function symbol.
    pub(crate) fn function(&self, name: &str) -> Result<AnyFn, AppleError> {
        let c = symbol_name(name);
        // SAFETY: the symbol is read as an untyped function pointer and only called after a
        // transmute to the exact C signature documented for it.
        let sym = unsafe { self.lib.get::<AnyFn>(&c) };
        sym.map(|s| *s)
            .map_err(|e| AppleError::unavailable(format!("{} has no symbol {name}: {e}", self.path)))
    }

    /// The value of an exported `const` object global (a `CFStringRef` such as `kIOSurfaceWidth`).
    pub(crate) fn object_global(&self, name: &str) -> Result<Id, AppleError> {
        let c = symbol_name(name);
        // SAFETY: for a data symbol, `dlsym` returns the address of the variable; the variable is
        // a `const CFStringRef`, i.e. one pointer, which is read once here.
        let value = unsafe {
            let sym = self.lib.get::<*const Id>(&c);
            sym.map(|s| **s)
        };
        let value = value.map_err(|e| AppleError::unavailable(format!("{} has no symbol {name}: {e}", self.path)))?;
        if value.is_nil() {
            return Err(AppleError::unavailable(format!("{}: {name} is NULL", self.path)));
        }
        Ok(value)
    }
}

fn symbol_name(name: &str) -> Vec<u8> {
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    v
}

/// `dlopen` with `RTLD_NOW`, as the reference does (Unix only: every macOS is Unix, and on other
/// Unixes the path does not exist so this fails cleanly).
#[cfg(unix)]
fn open_now(path: &str) -> Result<libloading::Library, libloading::Error> {
    // SAFETY: loading a system library runs its initialisers; the Apple libraries named here
    // have no initialisers with preconditions on the caller.
    unsafe { libloading::os::unix::Library::open(Some(path), libloading::os::unix::RTLD_NOW) }.map(Into::into)
}

/// Not Unix: there is no macOS framework to open.
#[cfg(not(unix))]
fn open_now(path: &str) -> Result<libloading::Library, String> {
    Err(format!("{path}: not a Unix system"))
}

/// The Objective-C runtime: class and selector lookup, `objc_msgSend`, autorelease pools.
pub(crate) struct Objc {
    get_class: GetClassFn,
    register_sel: RegisterSelFn,
    msg_send: AnyFn,
    pool_push: PoolPushFn,
    pool_pop: PoolPopFn,
    _lib: Lib,
}

impl Objc {
    /// Load `libobjc` and its entry points.
    pub(crate) fn load() -> Result<Objc, AppleError> {
        let lib = Lib::open(LIBOBJC)?;
        let f = |n| lib.function(n);
        // SAFETY (all five transmutes): each symbol is transmuted to its documented C type:
        // `Class objc_getClass(const char *)`, `SEL sel_registerName(const char *)`,
        // `void *objc_autoreleasePoolPush(void)`, `void objc_autoreleasePoolPop(void *)`;
        // `objc_msgSend` stays untyped until each call site.
        unsafe {
            Ok(Objc {
                get_class: std::mem::transmute::<AnyFn, GetClassFn>(f("objc_getClass")?),
                register_sel: std::mem::transmute::<AnyFn, RegisterSelFn>(f("sel_registerName")?),
                msg_send: f("objc_msgSend")?,
                pool_push: std::mem::transmute::<AnyFn, PoolPushFn>(f("objc_autoreleasePoolPush")?),
                pool_pop: std::mem::transmute::<AnyFn, PoolPopFn>(f("objc_autoreleasePoolPop")?),
                _lib: lib,
            })
        }
    }

    /// `objc_getClass(name)`, or `None` when no such class is registered.
    pub(crate) fn class(&self, name: &str) -> Option<Id> {
        let c = CString::new(name).ok()?;
        // SAFETY: `objc_getClass` takes a NUL-terminated name and returns nil when unknown.
        let cls = unsafe { (self.get_class)(c.as_ptr()) };
        (!cls.is_nil()).then_some(cls)
    }

    /// `objc_getClass(name)`, or the "unavailable" error naming the class.
    pub(crate) fn require_class(&self, name: &str) -> Result<Id, AppleError> {
        self.class(name)
            .ok_or_else(|| AppleError::unavailable(format!("class {name} not found")))
    }

    /// `sel_registerName(name)`.
    pub(crate) fn sel(&self, name: &CStr) -> Sel {
        // SAFETY: `sel_registerName` takes a NUL-terminated name and always returns a selector.
        unsafe { (self.register_sel)(name.as_ptr()) }
    }

    /// `sel_registerName(name)`, bound to the message type `F`.
    pub(crate) fn typed<F>(&self, name: &CStr) -> Typed<F> {
        Typed {
            sel: self.sel(name),
            _f: std::marker::PhantomData,
        }
    }

    /// `objc_msgSend` as the message type `F` of a typed selector.
    ///
    /// # Safety
    /// As [`Objc::msg`]: `F` must be the C signature of the method the selector names (the
    /// selector table of `framework.rs` pairs them, and its test checks the arity).
    pub(crate) unsafe fn msg_of<F: Copy>(&self, _sel: Typed<F>) -> F {
        // SAFETY: guaranteed by the caller.
        unsafe { self.msg::<F>() }
    }

    /// `objc_msgSend` as the function type `F`.
    ///
    /// # Safety
    /// `F` must be an `unsafe extern "C" fn(Id, Sel, …) -> R` matching the C signature of the
    /// method that will be sent (one of the `Msg*` aliases of this module).
    pub(crate) unsafe fn msg<F: Copy>(&self) -> F {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<AnyFn>()) };
        // SAFETY: the caller guarantees `F` is a function-pointer type (same size, asserted
        // above) whose signature is that of the method sent.
        unsafe { std::mem::transmute_copy::<AnyFn, F>(&self.msg_send) }
    }

    /// `objc_autoreleasePoolPush()`.
    pub(crate) fn pool_push(&self) -> *mut c_void {
        // SAFETY: no preconditions; the token is popped by `pool_pop` on the same thread.
        unsafe { (self.pool_push)() }
    }

    /// `objc_autoreleasePoolPop(token)`.
    ///
    /// # Safety
    /// `token` must come from `pool_push` on this thread, and pools must be popped in order.
    pub(crate) unsafe fn pool_pop(&self, token: *mut c_void) {
        // SAFETY: guaranteed by the caller.
        unsafe { (self.pool_pop)(token) }
    }
}

/// Copy a C string returned by the runtime (NULL → `None`; invalid UTF-8 is replaced).
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: guaranteed by the caller.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_a_missing_library_is_unavailable_not_a_panic() {
        let e = Lib::open("/nonexistent/anelm/NoSuch.framework/NoSuch").err();
        let e = e.expect("a missing library must not open");
        assert!(e.is_unavailable(), "{e}");
        assert!(e.to_string().contains("NoSuch"), "{e}");
    }

    #[test]
    fn on_this_host_the_runtime_loads_only_on_macos() {
        let r = Objc::load();
        if cfg!(target_os = "macos") {
            assert!(r.is_ok(), "libobjc must load on macOS");
        } else {
            let e = r.err().expect("there is no libobjc off macOS");
            assert!(e.is_unavailable(), "{e}");
        }
    }
}
