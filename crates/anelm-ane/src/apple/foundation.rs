//! Foundation objects the device builds, written once over any [`Runtime`]: the weights
//! dictionary of a descriptor, index arrays, the IOSurface property dictionary.

use anelm_mil::WeightFiles;

use super::error::AppleError;
use super::objc::Id;
use super::runtime::{Runtime, SurfaceKey};

/// The prefix every weights-dictionary key (and every `BLOBFILE` path) starts with.
pub const MODEL_PATH_PREFIX: &str = "@model_path/";

/// `offset` of every weights-dictionary entry (ane-runtime.md §3.7: `@0`; the address that
/// matters is the `offset=64` inside the MIL `BLOBFILE`).
pub const WEIGHT_ENTRY_OFFSET: i32 = 0;

/// The weights dictionary of `modelWithMILText:weights:optionsPlist:`:
/// `{ "@model_path/weights/<n>.bin": { "offset": @0, "data": <NSData blob> } }`.
/// With no weights this is an empty dictionary, never nil (a nil dictionary makes the compile
/// fail silently; ane-hardware.md §1.2).
pub(crate) fn weights_dictionary<R: Runtime + ?Sized>(rt: &R, weights: &WeightFiles) -> Result<Id, AppleError> {
    if weights.is_empty() {
        return rt.empty_dictionary();
    }
    let offset_key = rt.string("offset")?;
    let data_key = rt.string("data")?;
    let mut keys = Vec::with_capacity(weights.len());
    let mut values = Vec::with_capacity(weights.len());
    for (path, bytes) in weights.iter() {
        relative_weight_path(path)?;
        let offset = rt.number_int(WEIGHT_ENTRY_OFFSET)?;
        let data = rt.data(bytes)?;
        let entry = rt.dictionary(&[offset_key, data_key], &[offset, data])?;
        keys.push(rt.string(path)?);
        values.push(entry);
    }
    rt.dictionary(&keys, &values)
}

/// The path of a weight file inside the model directory: the key without `@model_path/`.
/// Refuses keys without the prefix, absolute paths and `..` components (the key becomes a path
/// on disk).
pub fn relative_weight_path(key: &str) -> Result<&str, AppleError> {
    let rest = key
        .strip_prefix(MODEL_PATH_PREFIX)
        .ok_or_else(|| AppleError::BadWeightKey(key.to_string()))?;
    let ok = !rest.is_empty()
        && !rest.starts_with('/')
        && !rest.contains('\\')
        && !rest.contains('\0')
        && rest.split('/').all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(rest)
    } else {
        Err(AppleError::BadWeightKey(key.to_string()))
    }
}

/// `[@0, @1, …, @(n-1)]`: the input or output indices of a request.
pub(crate) fn index_array<R: Runtime + ?Sized>(rt: &R, n: usize) -> Result<Id, AppleError> {
    let items = (0..n)
        .map(|i| {
            let i = i32::try_from(i).map_err(|_| AppleError::Signature(format!("{n} surfaces is too many")))?;
            rt.number_int(i)
        })
        .collect::<Result<Vec<_>, _>>()?;
    rt.array(&items)
}

/// Bytes of the IOSurface for `bytes` of tensor data: at least 49,152 (smaller surfaces fail at
/// evaluation, [`crate::Rule::SurfaceMinBytes`]), rounded up to a multiple of 128 (M5,
/// [`crate::Rule::M5Alignment`]). The tensor is packed at the start and the rest stays zero.
/// `None` on overflow.
pub fn surface_alloc_bytes(bytes: usize) -> Option<usize> {
    crate::rules::surface_alloc_size(bytes)
}

/// Bytes of a fp16 `[1, channels, 1, lanes]` tensor: `channels × lanes × 2` (no row padding).
pub fn fp16_tensor_bytes(channels: usize, lanes: usize) -> Option<usize> {
    channels.checked_mul(lanes)?.checked_mul(2)
}

/// The six IOSurface properties for a flat buffer of `alloc` bytes (from [`surface_alloc_bytes`]):
/// Width = alloc, Height = 1, BytesPerElement = 1, BytesPerRow = alloc, AllocSize = alloc,
/// PixelFormat = 0.
pub fn surface_properties(alloc: usize) -> [(SurfaceKey, u64); 6] {
    let b = alloc as u64;
    [
        (SurfaceKey::Width, b),
        (SurfaceKey::Height, 1),
        (SurfaceKey::BytesPerElement, 1),
        (SurfaceKey::BytesPerRow, b),
        (SurfaceKey::AllocSize, b),
        (SurfaceKey::PixelFormat, 0),
    ]
}

/// The property dictionary handed to `IOSurfaceCreate` (an NSDictionary of NSNumber
/// `numberWithUnsignedLong:` values, toll-free bridged to `CFDictionaryRef`).
pub(crate) fn surface_property_dictionary<R: Runtime + ?Sized>(rt: &R, alloc: usize) -> Result<Id, AppleError> {
    let mut keys = Vec::with_capacity(6);
    let mut values = Vec::with_capacity(6);
    for (k, v) in surface_properties(alloc) {
        keys.push(rt.surface_key(k));
        values.push(rt.number_ulong(v)?);
    }
    rt.dictionary(&keys, &values)
}

#[cfg(test)]
mod tests {
    use super::super::fake::{Fake, Obj};
    use super::*;

    #[test]
    fn weights_dictionary_maps_paths_to_offset_and_data() {
        let rt = Fake::new();
        let mut w = WeightFiles::new();
        w.insert("@model_path/weights/wq.bin", vec![1, 2, 3]);
        w.insert("@model_path/weights/wk.bin", vec![9; 130]);
        let d = weights_dictionary(&rt, &w).unwrap();
        let entries = rt.dict(d);
        assert_eq!(entries.len(), 2);
        let mut seen = Vec::new();
        for (k, v) in entries {
            let key = rt.str(k);
            let inner = rt.dict(v);
            assert_eq!(inner.len(), 2, "{key}");
            assert_eq!(rt.str(inner[0].0), "offset");
            assert_eq!(rt.obj(inner[0].1), Obj::Int(0));
            assert_eq!(rt.str(inner[1].0), "data");
            let data = match rt.obj(inner[1].1) {
                Obj::Data(d) => d,
                o => panic!("data is {o:?}"),
            };
            assert_eq!(data.as_slice(), w.get(&key).unwrap(), "{key}");
            seen.push(key);
        }
        seen.sort();
        assert_eq!(seen, ["@model_path/weights/wk.bin", "@model_path/weights/wq.bin"]);
    }

    #[test]
    fn no_weights_is_an_empty_dictionary_not_nil() {
        let rt = Fake::new();
        let d = weights_dictionary(&rt, &WeightFiles::new()).unwrap();
        assert!(!d.is_nil());
        assert_eq!(rt.obj(d), Obj::Dict(vec![]));
    }

    #[test]
    fn weight_keys_must_be_model_relative() {
        assert_eq!(
            relative_weight_path("@model_path/weights/a.bin").unwrap(),
            "weights/a.bin"
        );
        for bad in [
            "weights/a.bin",
            "@model_path/",
            "@model_path//etc/passwd",
            "@model_path/../x.bin",
            "@model_path/weights/../../x",
            "@model_path/weights//a.bin",
            "@model_path/./a.bin",
        ] {
            assert!(
                matches!(relative_weight_path(bad), Err(AppleError::BadWeightKey(_))),
                "{bad} accepted"
            );
        }
        let rt = Fake::new();
        let mut w = WeightFiles::new();
        w.insert("/tmp/evil.bin", vec![0]);
        assert!(weights_dictionary(&rt, &w).is_err());
    }

    #[test]
    fn surface_sizes() {
        assert_eq!(fp16_tensor_bytes(2560, 32), Some(163_840));
        assert_eq!(fp16_tensor_bytes(64, 32), Some(4096));
        assert_eq!(fp16_tensor_bytes(usize::MAX, 32), None);
        // Never below 49,152 bytes; always a multiple of 128.
        assert_eq!(surface_alloc_bytes(0), Some(49_152));
        assert_eq!(surface_alloc_bytes(4096), Some(49_152));
        assert_eq!(surface_alloc_bytes(49_152), Some(49_152));
        assert_eq!(surface_alloc_bytes(49_153), Some(49_280));
        assert_eq!(surface_alloc_bytes(163_840), Some(163_840));
        assert_eq!(surface_alloc_bytes(163_842), Some(163_968));
        assert_eq!(surface_alloc_bytes(usize::MAX), None);
        let p = surface_properties(49_152);
        assert_eq!(p.map(|(k, _)| k), SurfaceKey::ALL);
        assert_eq!(p.map(|(_, v)| v), [49_152, 1, 1, 49_152, 49_152, 0]);
    }

    #[test]
    fn surface_property_dictionary_uses_the_framework_keys() {
        let rt = Fake::new();
        let d = surface_property_dictionary(&rt, 163_840).unwrap();
        let entries = rt.dict(d);
        let got: Vec<(String, Obj)> = entries.iter().map(|&(k, v)| (rt.str(k), rt.obj(v))).collect();
        assert_eq!(
            got,
            vec![
                ("kIOSurfaceWidth".to_string(), Obj::ULong(163_840)),
                ("kIOSurfaceHeight".to_string(), Obj::ULong(1)),
                ("kIOSurfaceBytesPerElement".to_string(), Obj::ULong(1)),
                ("kIOSurfaceBytesPerRow".to_string(), Obj::ULong(163_840)),
                ("kIOSurfaceAllocSize".to_string(), Obj::ULong(163_840)),
                ("kIOSurfacePixelFormat".to_string(), Obj::ULong(0)),
            ]
        );
    }

    #[test]
    fn index_arrays_count_from_zero() {
        let rt = Fake::new();
        let a = index_array(&rt, 3).unwrap();
        match rt.obj(a) {
            Obj::Array(items) => {
                let v: Vec<Obj> = items.iter().map(|&i| rt.obj(i)).collect();
                assert_eq!(v, vec![Obj::Int(0), Obj::Int(1), Obj::Int(2)]);
            }
            o => panic!("{o:?}"),
        }
    }
}
