//! The device's logic against the fake runtime: lifecycle, marker cache, model directory,
//! budget errors, request reuse, direct-evaluation fallback, release order.

use std::fs;
use std::path::PathBuf;

use super::device::{AppleConfig, Device, program_signature};
use super::fake::{Fake, Obj, Script};
use super::modeldir::test_dir;
use crate::cache::{CacheOutcome, CompileCache, compile_or_load};
use crate::device::ProgramHandle;
use crate::error::AneError;
use crate::kernel::{AneKernel, WeightMode};
use crate::lower::{Lowered, lower};
use crate::surface::Surface;

fn linear(rows: usize, cols: usize, mode: WeightMode) -> Lowered {
    let w: Vec<f32> = (0..rows * cols).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect();
    lower(&AneKernel::Linear { rows, cols }, &[&w], mode).unwrap()
}

struct Setup {
    root: PathBuf,
    markers: PathBuf,
    temp: PathBuf,
}

impl Setup {
    fn new(tag: &str) -> Setup {
        let root = test_dir(tag);
        Setup {
            markers: root.join("markers"),
            temp: root.join("tmp"),
            root,
        }
    }

    fn device(&self, script: Script, cache: bool) -> Device<Fake> {
        self.device_with(script, cache, false)
    }

    fn device_with(&self, script: Script, cache: bool, direct: bool) -> Device<Fake> {
        let cfg = AppleConfig {
            keep_model_dirs: cache,
            direct_eval: direct,
            lock_surfaces: false,
            temp_dir: None,
        };
        Device::new(Fake::with(script, self.temp.clone()), direct, &cfg).unwrap()
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn run(dev: &Device<Fake>, h: ProgramHandle, x: &[f32]) -> Vec<f32> {
    let sig = dev.signature(h).unwrap();
    let input = Surface::pack(sig.inputs[0].0, &[x]).unwrap();
    let mut out = sig.output_surfaces();
    dev.evaluate(h, &[&input], &mut out).unwrap();
    out[0].read_lane(0).unwrap()
}

/// What the ANE backend does for each kernel: [`compile_or_load`] with the device's two paths.
fn through_cache(dev: &Device<Fake>, cache: &CompileCache, k: &Lowered) -> (ProgramHandle, CacheOutcome) {
    let mil = k.mil_text();
    compile_or_load(
        Some(cache),
        "prog1",
        || dev.load_without_compile(&mil, &k.weights),
        || {
            let h = dev.compile(&mil, &k.weights)?;
            dev.load(h).map(|()| h)
        },
    )
    .unwrap()
}

#[test]
fn first_run_compiles_and_marks_then_a_second_process_loads_without_compiling() {
    let s = Setup::new("marker");
    let cache = CompileCache::new(&s.markers);
    let k = linear(64, 64, WeightMode::Fp16);
    {
        let dev = s.device(Script::default(), true);
        let (_, outcome) = through_cache(&dev, &cache, &k);
        assert_eq!(outcome, CacheOutcome::Compiled);
        assert_eq!(dev.runtime().count("compile qos=21"), 1);
        assert_eq!(dev.runtime().count("load qos=21"), 1);
        assert!(cache.has_marker("prog1"));
        let st = dev.stats();
        assert_eq!((st.compiles, st.cache_loads, st.loads, st.loaded), (1, 0, 1, 1));
    }
    // "Next process": the marker is there, so load runs without compile, and the kernel works.
    let dev = s.device(Script::default(), true);
    let (h, outcome) = through_cache(&dev, &cache, &k);
    assert_eq!(outcome, CacheOutcome::Loaded);
    assert_eq!(dev.runtime().count("compile"), 0, "{:?}", dev.runtime().calls());
    assert_eq!(dev.stats().cache_loads, 1);
    let x = vec![1.5f32; 64];
    assert_eq!(run(&dev, h, &x), x);
}

#[test]
fn a_stale_marker_costs_one_failed_load_then_a_compile() {
    let s = Setup::new("stale");
    let cache = CompileCache::new(&s.markers);
    cache.write_marker("prog1").unwrap();
    // The OS service lost the program: the first load fails (and its one retry).
    let dev = s.device(
        Script {
            load_failures: 2,
            ..Script::default()
        },
        true,
    );
    let k = linear(64, 64, WeightMode::Fp16);
    let (h, outcome) = through_cache(&dev, &cache, &k);
    assert_eq!(outcome, CacheOutcome::Recompiled);
    let calls: Vec<String> = dev
        .runtime()
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("load") || c.starts_with("compile"))
        .collect();
    assert_eq!(calls, ["load qos=21", "load qos=21", "compile qos=21", "load qos=21"]);
    assert!(cache.has_marker("prog1"), "re-marked after the compile");
    assert_eq!(dev.stats().loaded, 1, "the failed cache attempt was freed");
    assert_eq!(
        dev.runtime().live_surfaces(),
        2,
        "only the working kernel's surfaces remain"
    );
    dev.signature(h).unwrap();
}

#[test]
fn model_directory_holds_the_mil_and_every_weight_file() {
    let s = Setup::new("dir");
    let dev = s.device(Script::default(), true);
    let k = linear(64, 64, WeightMode::Int8 { block: None });
    let mil = k.mil_text();
    dev.compile(&mil, &k.weights).unwrap();
    let dir = s.temp.join("feedc0de");
    assert_eq!(fs::read_to_string(dir.join("model.mil")).unwrap(), mil);
    assert!(k.weights.len() >= 2, "int8 has data and scales");
    for (key, bytes) in k.weights.iter() {
        let rel = key.strip_prefix("@model_path/").unwrap();
        assert_eq!(fs::read(dir.join(rel)).unwrap(), bytes, "{key}");
    }
    // The descriptor got the MIL bytes and a weights dictionary with one entry per file.
    let rt = dev.runtime();
    let desc = (1..)
        .map(|i| super::objc::Id(i as *mut _))
        .find(|&id| matches!(rt.obj(id), Obj::Descriptor { .. }))
        .unwrap();
    let Obj::Descriptor { mil: m, weights } = rt.obj(desc) else {
        unreachable!()
    };
    assert_eq!(rt.obj(m), Obj::Data(mil.into_bytes()));
    assert_eq!(rt.dict(weights).len(), k.weights.len());
}

#[test]
fn compile_failure_carries_the_ns_error_and_cleans_up() {
    let s = Setup::new("cfail");
    let dev = s.device(
        Script {
            compile_error: Some(
                "Error Domain=com.apple.appleneuralengine.compiler Code=1 \"ANECCompile() FAILED\"".into(),
            ),
            ..Script::default()
        },
        true,
    );
    let k = linear(64, 64, WeightMode::Fp16);
    let e = dev.compile(&k.mil_text(), &k.weights).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, AneError::Framework(_)), "{e:?}");
    assert!(msg.contains("ANECCompile() FAILED"), "{msg}");
    assert!(msg.contains("compileWithQoS:options:error:"), "{msg}");
    assert!(msg.contains("kernel feedc0de"), "{msg}");
    assert!(!s.temp.join("feedc0de").exists(), "model directory removed");
    assert_eq!(
        dev.runtime().leaks().len(),
        1,
        "only the device's options dictionary is held"
    );
    assert_eq!(dev.runtime().live_surfaces(), 0);
}

#[test]
fn nil_descriptor_is_a_clear_error() {
    let s = Setup::new("nil");
    let dev = s.device(
        Script {
            nil_descriptor: true,
            ..Script::default()
        },
        true,
    );
    let k = linear(64, 64, WeightMode::Fp16);
    let msg = dev.compile(&k.mil_text(), &k.weights).unwrap_err().to_string();
    assert!(
        msg.contains("modelWithMILText:weights:optionsPlist:") && msg.contains("nil"),
        "{msg}"
    );
}

#[test]
fn missing_identifier_falls_back_to_a_uuid() {
    let s = Setup::new("uuid");
    let dev = s.device(
        Script {
            hex: Some(None),
            ..Script::default()
        },
        true,
    );
    let k = linear(64, 64, WeightMode::Fp16);
    dev.compile(&k.mil_text(), &k.weights).unwrap();
    assert!(s.temp.join("E621E1F8-C36C-495A-93FC-0C247A3E6E5F/model.mil").is_file());
}

#[test]
fn load_failure_names_the_kernel_and_how_many_are_loaded() {
    let s = Setup::new("budget");
    let dev = s.device(
        Script {
            budget: Some(2),
            ..Script::default()
        },
        false,
    );
    let k = linear(64, 64, WeightMode::Fp16);
    let hs: Vec<_> = (0..3)
        .map(|_| dev.compile(&k.mil_text(), &k.weights).unwrap())
        .collect();
    dev.load(hs[0]).unwrap();
    dev.load(hs[1]).unwrap();
    let e = dev.load(hs[2]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("kernel feedc0de ([1,64,1,32] → [1,64,1,32], weights "),
        "{msg}"
    );
    assert!(msg.contains("2 kernel(s) already loaded"), "{msg}");
    assert!(msg.contains("out of program slots"), "{msg}");
    // One retry after the documented delay, then the error.
    assert_eq!(dev.runtime().count("load"), 4);
    // Unloading frees budget: now it loads.
    dev.unload(hs[0]).unwrap();
    dev.load(hs[2]).unwrap();
    assert_eq!(dev.stats().loaded, 2);
}

#[test]
fn evaluate_moves_bytes_through_surfaces_and_reuses_one_request() {
    let s = Setup::new("eval");
    let dev = s.device(Script::default(), true);
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    // Surfaces: one input and one output of 64 × 32 × 2 bytes.
    assert_eq!(dev.runtime().count("IOSurfaceCreate 4096"), 2);
    assert!(matches!(
        dev.evaluate(h, &[&Surface::new(64)], &mut [Surface::new(64)]),
        Err(AneError::State { call: "evaluate", .. })
    ));
    dev.load(h).unwrap();
    let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
    for _ in 0..3 {
        // The fake ANE is the identity on bytes: what was written comes back.
        assert_eq!(run(&dev, h, &x), x);
    }
    assert_eq!(dev.runtime().count("request"), 1, "request built once per kernel");
    assert_eq!(dev.runtime().count("evaluate qos=21"), 3);
    assert_eq!(
        dev.runtime().count("IOSurfaceLock"),
        2,
        "locked only at creation (zeroing)"
    );
    assert_eq!(dev.stats().dispatches, 3);
    // Wrong shapes are refused before any call.
    let bad = Surface::new(63);
    let e = dev.evaluate(h, &[&bad], &mut [Surface::new(64)]).unwrap_err();
    assert!(matches!(e, AneError::Surfaces(_)), "{e}");
    let e = dev.evaluate(h, &[], &mut [Surface::new(64)]).unwrap_err();
    assert!(matches!(e, AneError::Surfaces(_)), "{e}");
    assert_eq!(dev.runtime().open_pools(), 0);
}

#[test]
fn dispatch_bytes_count_constants_and_surfaces() {
    let s = Setup::new("bytes");
    let dev = s.device(Script::default(), false);
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h).unwrap();
    let mut out = [Surface::new(64)];
    let t = dev.evaluate(h, &[&Surface::new(64)], &mut out).unwrap();
    assert_eq!(t.bytes, 64 * 64 * 2 + 2 * 4096);
}

#[test]
fn evaluation_errors_carry_the_description() {
    let s = Setup::new("efail");
    let dev = s.device(
        Script {
            eval_error: Some("Program Inference error status=0x1d".into()),
            ..Script::default()
        },
        false,
    );
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h).unwrap();
    let msg = dev
        .evaluate(h, &[&Surface::new(64)], &mut [Surface::new(64)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("status=0x1d") && msg.contains("path=daemon"), "{msg}");
    assert!(msg.contains("restart the process"), "{msg}");
}

#[test]
fn direct_evaluation_is_used_when_asked_and_falls_back_to_the_daemon() {
    let s = Setup::new("direct");
    let k = linear(64, 64, WeightMode::Fp16);
    let x = vec![0.5f32; 64];
    // Asked for and available.
    let dev = s.device_with(
        Script {
            has_client: true,
            ..Script::default()
        },
        true,
        true,
    );
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h).unwrap();
    assert!(dev.stats().direct_eval);
    assert_eq!(run(&dev, h, &x), x);
    assert_eq!(dev.runtime().count("direct qos=21"), 1);
    assert_eq!(dev.runtime().count("evaluate"), 0);
    // A failing direct call turns it off and the daemon path answers.
    dev.runtime().script(|sc| sc.direct_error = Some("denied".into()));
    assert_eq!(run(&dev, h, &x), x);
    assert!(!dev.stats().direct_eval);
    assert_eq!(run(&dev, h, &x), x);
    assert_eq!(dev.runtime().count("direct"), 2);
    assert_eq!(dev.runtime().count("evaluate qos=21"), 2);
    drop(dev);
    // Asked for but no client: daemon path from the start.
    let dev = s.device_with(Script::default(), true, true);
    assert!(!dev.stats().direct_eval);
}

#[test]
fn drop_unloads_then_releases_request_surfaces_and_model_and_leaks_nothing() {
    let s = Setup::new("drop");
    let k = linear(64, 64, WeightMode::Fp16);
    // `release` of one kernel: the order of the calls.
    let dev = s.device(Script::default(), false);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h).unwrap();
    let n = dev.runtime().calls().len();
    dev.release(h).unwrap();
    let tail: Vec<String> = dev.runtime().calls()[n..].to_vec();
    assert_eq!(
        tail,
        ["unload qos=21", "release", "CFRelease", "CFRelease", "release"],
        "unload → request → surfaces → model"
    );
    assert!(!s.temp.join("feedc0de").exists(), "cache off: model directory removed");
    assert!(matches!(dev.load(h), Err(AneError::UnknownHandle(_))));
    assert_eq!(dev.stats().loaded, 0);
    drop(dev);
    // Dropping the device frees every kernel (loaded or not) and its own objects.
    let cfg = AppleConfig {
        keep_model_dirs: false,
        direct_eval: true,
        lock_surfaces: false,
        temp_dir: Some(s.temp.clone()),
    };
    let fake = Fake::with(
        Script {
            has_client: true,
            ..Script::default()
        },
        s.temp.clone(),
    );
    let dev = Device::new(fake.clone(), true, &cfg).unwrap();
    let h1 = dev.compile(&k.mil_text(), &k.weights).unwrap();
    let h2 = dev.compile(&k.mil_text(), &k.weights).unwrap();
    let _h3 = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h1).unwrap();
    dev.load(h2).unwrap();
    dev.unload(h2).unwrap();
    let before = fake.calls().len();
    drop(dev);
    let after = fake.calls()[before..].to_vec();
    assert_eq!(after.iter().filter(|c| c.starts_with("unload")).count(), 1, "{after:?}");
    assert_eq!(
        after.first().map(String::as_str),
        Some("release"),
        "h3 (not loaded) first: {after:?}"
    );
    assert_eq!(fake.live_surfaces(), 0);
    assert_eq!(fake.leaks(), vec![], "every retain balanced");
    assert_eq!(fake.open_pools(), 0);
}

#[test]
fn with_cache_on_the_model_directory_stays() {
    let s = Setup::new("keep");
    let dev = s.device(Script::default(), true);
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.release(h).unwrap();
    assert!(s.temp.join("feedc0de/model.mil").is_file());
}

#[test]
fn lifecycle_errors_match_the_emulator() {
    let s = Setup::new("life");
    let dev = s.device(Script::default(), false);
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    assert!(matches!(dev.unload(h), Err(AneError::State { call: "unload", .. })));
    dev.load(h).unwrap();
    assert!(matches!(dev.load(h), Err(AneError::State { call: "load", .. })));
    dev.unload(h).unwrap();
    dev.load(h).unwrap();
    assert!(matches!(
        dev.signature(ProgramHandle(999)),
        Err(AneError::UnknownHandle(999))
    ));
    assert!(matches!(dev.compile("program(", &k.weights), Err(AneError::Parse(_))));
    assert_eq!(
        dev.runtime().count("descriptor"),
        1,
        "a bad program never reaches the framework"
    );
}

#[test]
fn signatures_come_from_the_mil() {
    let k = lower(
        &AneKernel::LinearResidual { rows: 96, cols: 64 },
        &[&vec![0.0; 96 * 64]],
        WeightMode::Fp16,
    )
    .unwrap();
    let sig = program_signature(&k.mil_text()).unwrap();
    assert_eq!(sig.inputs, vec![(64, 32), (96, 32)]);
    assert_eq!(sig.outputs, vec![(96, 32)]);
}
