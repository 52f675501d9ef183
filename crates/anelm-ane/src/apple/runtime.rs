//! The seam between the device's logic and the Objective-C calls it makes.
//!
//! [`Runtime`] lists every framework call the device needs, one method per call, with the
//! arguments the reference passes (QoS included, so a test can see it is 21). The real
//! implementation is [`super::framework::Framework`]; tests use a fake that records calls and
//! keeps objects in a table, so everything around the calls (the weights dictionary, the model
//! directory, the marker cache, the lifecycle, the budget, error mapping) is tested off Apple.

use std::path::{Path, PathBuf};

use super::error::AppleError;
use super::objc::Id;

/// An `IOSurfaceRef`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SurfaceRef(pub(crate) Id);

/// The six IOSurface creation keys (ane-runtime.md §2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SurfaceKey {
    /// `kIOSurfaceWidth`.
    Width,
    /// `kIOSurfaceHeight`.
    Height,
    /// `kIOSurfaceBytesPerElement`.
    BytesPerElement,
    /// `kIOSurfaceBytesPerRow`.
    BytesPerRow,
    /// `kIOSurfaceAllocSize`.
    AllocSize,
    /// `kIOSurfacePixelFormat`.
    PixelFormat,
}

impl SurfaceKey {
    /// All six, in the order the dictionary is built.
    pub const ALL: [SurfaceKey; 6] = [
        SurfaceKey::Width,
        SurfaceKey::Height,
        SurfaceKey::BytesPerElement,
        SurfaceKey::BytesPerRow,
        SurfaceKey::AllocSize,
        SurfaceKey::PixelFormat,
    ];

    /// The exported `CFStringRef` symbol of the IOSurface framework.
    pub fn symbol(self) -> &'static str {
        match self {
            SurfaceKey::Width => "kIOSurfaceWidth",
            SurfaceKey::Height => "kIOSurfaceHeight",
            SurfaceKey::BytesPerElement => "kIOSurfaceBytesPerElement",
            SurfaceKey::BytesPerRow => "kIOSurfaceBytesPerRow",
            SurfaceKey::AllocSize => "kIOSurfaceAllocSize",
            SurfaceKey::PixelFormat => "kIOSurfacePixelFormat",
        }
    }
}

/// QoS of every compile, load, evaluate and unload (ane-runtime.md §2.3: the integer 21).
pub const QOS: u32 = 21;

/// Every framework call the device makes. Object results are autoreleased unless the method says
/// otherwise; the device retains what it keeps and wraps calls in autorelease pools.
pub(crate) trait Runtime: Send + Sync {
    // ---- Foundation ----

    /// `[NSData dataWithBytes:length:]` (copies).
    fn data(&self, bytes: &[u8]) -> Result<Id, AppleError>;
    /// `[NSString stringWithUTF8String:]`.
    fn string(&self, s: &str) -> Result<Id, AppleError>;
    /// `[NSNumber numberWithInt:]`.
    fn number_int(&self, v: i32) -> Result<Id, AppleError>;
    /// `[NSNumber numberWithUnsignedLong:]`.
    fn number_ulong(&self, v: u64) -> Result<Id, AppleError>;
    /// `[NSDictionary dictionaryWithObjects:forKeys:count:]` (`keys.len() == values.len()`).
    fn dictionary(&self, keys: &[Id], values: &[Id]) -> Result<Id, AppleError>;
    /// `[NSDictionary dictionary]` (`@{}`).
    fn empty_dictionary(&self) -> Result<Id, AppleError>;
    /// `[NSMutableArray arrayWithCapacity:]` + `addObject:` for each item.
    fn array(&self, items: &[Id]) -> Result<Id, AppleError>;
    /// `[o retain]` (returns `o`).
    fn retain(&self, o: Id) -> Id;
    /// `[o release]`.
    fn release(&self, o: Id);
    /// `objc_autoreleasePoolPush()`.
    fn pool_push(&self) -> usize;
    /// `objc_autoreleasePoolPop(token)`.
    fn pool_pop(&self, token: usize);
    /// `NSTemporaryDirectory()` (the per-user temporary directory).
    fn temp_dir(&self) -> PathBuf;
    /// Write one file of a model directory (`std::fs::write`; a seam so tests can count writes).
    fn write_file(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::write(path, bytes)
    }

    // ---- AppleNeuralEngine ----

    /// `[_ANEInMemoryModelDescriptor modelWithMILText:mil weights:weights optionsPlist:nil]`.
    fn descriptor(&self, mil: Id, weights: Id) -> Result<Id, AppleError>;
    /// `[_ANEInMemoryModel inMemoryModelWithDescriptor:desc]`.
    fn in_memory_model(&self, desc: Id) -> Result<Id, AppleError>;
    /// `[model hexStringIdentifier]`, when it is a non-empty NSString.
    fn hex_string_identifier(&self, model: Id) -> Option<String>;
    /// `[model localModelPath]` (`NSTemporaryDirectory()/<hexStringIdentifier>`, where the
    /// framework itself writes and removes the model directory), when the model implements it
    /// and it is a non-empty NSString.
    fn local_model_path(&self, model: Id) -> Option<PathBuf>;
    /// `[model compiledModelExists]` (asks the ANE service whether it holds a compiled program for
    /// the model's identifier); `None` when the model does not implement it.
    fn compiled_model_exists(&self, model: Id) -> Option<bool>;
    /// `[model setDescriptor:nil]` when `_ANEInMemoryModel` implements `setDescriptor:`: the model
    /// stops holding its descriptor (the MIL text and the `NSData` of every weight). Returns whether
    /// it was sent.
    fn release_descriptor(&self, model: Id) -> bool;
    /// `[model compileWithQoS:qos options:options error:&e]`; `Err` carries the NSError text.
    fn compile(&self, model: Id, qos: u32, options: Id) -> Result<(), String>;
    /// `[model loadWithQoS:qos options:options error:&e]`.
    fn load(&self, model: Id, qos: u32, options: Id) -> Result<(), String>;
    /// `[model evaluateWithQoS:qos options:options request:request error:&e]`.
    fn evaluate(&self, model: Id, qos: u32, options: Id, request: Id) -> Result<(), String>;
    /// `[model unloadWithQoS:qos error:&e]`.
    fn unload(&self, model: Id, qos: u32) -> Result<(), String>;
    /// `[_ANEIOSurfaceObject objectWithIOSurface:surface]`.
    fn surface_object(&self, surface: SurfaceRef) -> Result<Id, AppleError>;
    /// `[_ANERequest requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:nil perfStats:nil procedureIndex:procedure]`.
    fn request(
        &self,
        inputs: Id,
        input_indices: Id,
        outputs: Id,
        output_indices: Id,
        procedure: Id,
    ) -> Result<Id, AppleError>;
    /// `[[_ANEClient alloc] initWithRestrictedAccessAllowed:YES]` when `_ANEClient` exists and
    /// implements `doEvaluateDirectWithModel:options:request:qos:error:` (a +1 reference), else
    /// `None`.
    fn direct_client(&self) -> Option<Id>;
    /// `[client doEvaluateDirectWithModel:model options:options request:request qos:qos error:&e]`.
    fn evaluate_direct(&self, client: Id, model: Id, options: Id, request: Id, qos: u32) -> Result<(), String>;

    // ---- IOSurface / CoreFoundation ----

    /// The `CFStringRef` of a creation key.
    fn surface_key(&self, key: SurfaceKey) -> Id;
    /// `IOSurfaceCreate(properties)` (a +1 reference).
    fn create_surface(&self, properties: Id) -> Result<SurfaceRef, AppleError>;
    /// `IOSurfaceGetAllocSize(s)`.
    fn surface_alloc_size(&self, s: SurfaceRef) -> usize;
    /// Copy `bytes` to the start of the surface (`IOSurfaceGetBaseAddress`), between
    /// `IOSurfaceLock(s, 0)` / `IOSurfaceUnlock` when `lock`. Zero-fills the rest when `zero_rest`.
    fn write_surface(&self, s: SurfaceRef, bytes: &[u8], lock: bool, zero_rest: bool) -> Result<(), AppleError>;
    /// Copy the start of the surface into `out`, between `IOSurfaceLock(s, kIOSurfaceLockReadOnly)`
    /// / `IOSurfaceUnlock` when `lock`.
    fn read_surface(&self, s: SurfaceRef, out: &mut [u8], lock: bool) -> Result<(), AppleError>;
    /// `CFRelease(s)`.
    fn cf_release(&self, s: SurfaceRef);
}
