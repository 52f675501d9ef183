//! The device's logic against the fake runtime: lifecycle, marker cache and the cache probe,
//! model directory, budget errors, request reuse, direct-evaluation fallback, release order and
//! release on every error path.

use std::fs;
use std::path::PathBuf;

use std::time::{Duration, Instant};

use super::device::{AppleConfig, Device, parse_max_compiles, program_signature};
use super::fake::{Fake, Obj, Script, identifier};
use super::modeldir::test_dir;
use crate::cache::{CacheOutcome, CompileCache, compile_or_load};
use crate::device::{AneDevice, ProgramHandle, Releasing, compile_and_load};
use crate::emu::EmuAne;
use crate::error::AneError;
use crate::kernel::{AneKernel, WeightMode};
use crate::lower::{Lowered, lower};
use crate::rules::Rule;
use crate::surface::Surface;

fn linear(rows: usize, cols: usize, mode: WeightMode) -> Lowered {
    let w: Vec<f32> = (0..rows * cols).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect();
    lower(&AneKernel::Linear { rows, cols }, &[&w], mode).unwrap()
}

/// The framework's identifier of a lowered kernel (what the fake computes).
fn id_of(k: &Lowered) -> String {
    identifier(k.mil_text().as_bytes(), &k.weights)
}

/// What the kernel computes for one lane `x` (on the emulator, which the fake runs programs on).
fn expected(k: &Lowered, x: &[f32]) -> Vec<f32> {
    let emu = EmuAne::default();
    let h = emu.compile(&k.mil_text(), &k.weights).unwrap();
    emu.load(h).unwrap();
    let sig = emu.signature(h).unwrap();
    let input = Surface::pack(sig.inputs[0].0, &[x]).unwrap();
    let mut out = sig.output_surfaces();
    emu.evaluate(h, &[&input], &mut out).unwrap();
    out[0].read_lane(0).unwrap()
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

    fn device(&self, script: Script) -> Device<Fake> {
        self.device_with(script, false)
    }

    fn device_with(&self, script: Script, direct: bool) -> Device<Fake> {
        self.device_cfg(
            script,
            AppleConfig {
                direct_eval: direct,
                ..AppleConfig::default()
            },
        )
    }

    fn device_cfg(&self, script: Script, cfg: AppleConfig) -> Device<Fake> {
        Device::new(Fake::with(script, self.temp.clone()), cfg.direct_eval, &cfg).unwrap()
    }

    /// The device of the next process: the same ANE service (which outlives a process).
    fn next_device(&self, prev: &Device<Fake>, script: Script, cfg: AppleConfig) -> Device<Fake> {
        Device::new(prev.runtime().next_process(script), cfg.direct_eval, &cfg).unwrap()
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
    let first = s.device(Script::default());
    {
        let dev = &first;
        let (_, outcome) = through_cache(dev, &cache, &k);
        assert_eq!(outcome, CacheOutcome::Compiled);
        assert_eq!(dev.runtime().count("compile qos=21"), 1);
        assert_eq!(dev.runtime().count("load qos=21"), 1);
        assert!(cache.has_marker("prog1"));
        let st = dev.stats();
        assert_eq!((st.compiles, st.cache_loads, st.loads, st.loaded), (1, 0, 1, 1));
    }
    // "Next process": the marker is there and the ANE service holds the program, so it loads
    // without a compile, with nothing written to disk, and the kernel works.
    let dev = s.next_device(&first, Script::default(), AppleConfig::default());
    drop(first);
    let (h, outcome) = through_cache(&dev, &cache, &k);
    assert_eq!(outcome, CacheOutcome::Loaded);
    assert_eq!(dev.runtime().count("compile qos"), 0, "{:?}", dev.runtime().calls());
    assert_eq!(dev.runtime().count("compiledModelExists"), 1);
    assert_eq!(dev.runtime().count("load qos=21"), 1);
    assert_eq!(
        dev.runtime().writes(),
        Vec::<PathBuf>::new(),
        "a cache hit writes nothing"
    );
    assert!(!s.temp.join(id_of(&k)).exists());
    assert_eq!(dev.stats().cache_loads, 1);
    let x = vec![1.5f32; 64];
    assert_eq!(run(&dev, h, &x), expected(&k, &x));
}

#[test]
fn the_compile_path_writes_the_directory_and_removes_it_once_loaded() {
    let s = Setup::new("writes");
    let dev = s.device(Script::default());
    let k = linear(64, 64, WeightMode::Int8 { block: None });
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    let dir = s.temp.join(id_of(&k));
    let mut want = vec![dir.join("model.mil")];
    want.extend(
        k.weights
            .iter()
            .map(|(key, _)| dir.join(key.strip_prefix("@model_path/").unwrap())),
    );
    assert_eq!(dev.runtime().writes(), want, "model.mil, then every weight file, once");
    assert!(dir.join("model.mil").is_file());
    dev.load(h).unwrap();
    assert!(!dir.exists(), "the directory is removed after a successful load");
    // Reloading after an unload needs no directory (the service holds the program).
    dev.unload(h).unwrap();
    dev.load(h).unwrap();
    assert_eq!(dev.runtime().writes().len(), want.len());
}

/// The load and compile calls of a fake, in order.
fn lifecycle_calls(rt: &Fake) -> Vec<String> {
    rt.calls()
        .into_iter()
        .filter(|c| c.starts_with("load ") || c.starts_with("compile ") || c == "compiledModelExists")
        .collect()
}

#[test]
fn a_stale_marker_costs_one_question_and_no_load_then_a_compile() {
    let s = Setup::new("stale");
    let cache = CompileCache::new(&s.markers);
    cache.write_marker("prog1").unwrap();
    // The OS service lost the program: compiledModelExists says no, so nothing is loaded or written.
    let dev = s.device(Script::default());
    let k = linear(64, 64, WeightMode::Fp16);
    let (h, outcome) = through_cache(&dev, &cache, &k);
    assert_eq!(outcome, CacheOutcome::Recompiled);
    assert_eq!(
        lifecycle_calls(dev.runtime()),
        ["compiledModelExists", "compile qos=21", "load qos=21"]
    );
    assert!(cache.has_marker("prog1"), "re-marked after the compile");
    assert_eq!(dev.stats().loaded, 1, "the failed cache attempt was freed");
    assert_eq!(
        dev.runtime().live_surfaces(),
        2,
        "only the working kernel's surfaces remain"
    );
    assert_eq!(dev.runtime().live_models(), 1);
    dev.signature(h).unwrap();
}

#[test]
fn a_failed_cache_load_is_not_retried_and_nothing_sleeps() {
    let s = Setup::new("noretry");
    let cache = CompileCache::new(&s.markers);
    cache.write_marker("prog1").unwrap();
    // The service says it holds the program but the load fails once: no 100 ms retry on the
    // probe, straight to the compile (whose load succeeds).
    let k = linear(64, 64, WeightMode::Fp16);
    let dev = s.device(Script {
        os_cache: vec![id_of(&k)],
        load_failures: 1,
        ..Script::default()
    });
    let start = Instant::now();
    let (_, outcome) = through_cache(&dev, &cache, &k);
    assert!(start.elapsed() < Duration::from_millis(100), "{:?}", start.elapsed());
    assert_eq!(outcome, CacheOutcome::Recompiled);
    assert_eq!(
        lifecycle_calls(dev.runtime()),
        ["compiledModelExists", "load qos=21", "compile qos=21", "load qos=21"]
    );
    assert_eq!(dev.stats().loaded, 1);
    assert_eq!(dev.runtime().live_models(), 1, "the probe's model was released");
}

#[test]
fn without_compiled_model_exists_the_cache_path_declines_without_loading() {
    let s = Setup::new("noprobe");
    let k = linear(64, 64, WeightMode::Fp16);
    let dev = s.device(Script {
        os_cache: vec![id_of(&k)],
        no_compiled_model_exists: true,
        ..Script::default()
    });
    let e = dev.load_without_compile(&k.mil_text(), &k.weights).unwrap_err();
    assert!(e.to_string().contains("compiledModelExists"), "{e}");
    assert_eq!(dev.runtime().count("load"), 0);
    assert!(dev.runtime().writes().is_empty());
    assert_eq!(dev.runtime().live_models(), 0);
    assert_eq!(dev.runtime().live_surfaces(), 0);
}

#[test]
fn model_directory_holds_the_mil_and_every_weight_file() {
    let s = Setup::new("dir");
    let dev = s.device(Script::default());
    let k = linear(64, 64, WeightMode::Int8 { block: None });
    let mil = k.mil_text();
    dev.compile(&mil, &k.weights).unwrap();
    let dir = s.temp.join(id_of(&k));
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
    let dev = s.device(Script {
        compile_error: Some("Error Domain=com.apple.appleneuralengine.compiler Code=1 \"ANECCompile() FAILED\"".into()),
        ..Script::default()
    });
    let k = linear(64, 64, WeightMode::Fp16);
    let e = dev.compile(&k.mil_text(), &k.weights).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, AneError::Framework(_)), "{e:?}");
    assert!(msg.contains("ANECCompile() FAILED"), "{msg}");
    assert!(msg.contains("compileWithQoS:options:error:"), "{msg}");
    assert!(msg.contains(&format!("kernel {}", &id_of(&k)[..12])), "{msg}");
    assert!(!s.temp.join(id_of(&k)).exists(), "model directory removed");
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
    let dev = s.device(Script {
        nil_descriptor: true,
        ..Script::default()
    });
    let k = linear(64, 64, WeightMode::Fp16);
    let msg = dev.compile(&k.mil_text(), &k.weights).unwrap_err().to_string();
    assert!(
        msg.contains("modelWithMILText:weights:optionsPlist:") && msg.contains("nil"),
        "{msg}"
    );
}

#[test]
fn the_frameworks_194_character_identifier_names_the_directory() {
    let s = Setup::new("hex194");
    let id = super::modeldir::tests::hex_identifier();
    assert_eq!(id.len(), 194);
    let dev = s.device(Script {
        hex: Some(Some(id.clone())),
        ..Script::default()
    });
    let k = linear(64, 64, WeightMode::Fp16);
    let mil = k.mil_text();
    let h = dev.compile(&mil, &k.weights).unwrap();
    let dir = s.temp.join(&id);
    assert_eq!(fs::read_to_string(dir.join("model.mil")).unwrap(), mil);
    assert!(dir.join("weights/weight.bin").is_file());
    dev.load(h).unwrap();
    let x = vec![0.25f32; 64];
    assert_eq!(run(&dev, h, &x), expected(&k, &x));
    assert!(!dir.exists(), "removed once loaded");
}

#[test]
fn the_models_own_local_model_path_is_preferred() {
    let s = Setup::new("localpath");
    let own = s.root.join("nstmp");
    let dev = s.device(Script {
        local_root: Some(own.clone()),
        ..Script::default()
    });
    let k = linear(64, 64, WeightMode::Fp16);
    dev.compile(&k.mil_text(), &k.weights).unwrap();
    assert!(own.join(id_of(&k)).join("model.mil").is_file());
    assert!(!s.temp.join(id_of(&k)).exists());
}

#[test]
fn an_unusable_identifier_is_a_clear_error_and_leaves_nothing() {
    let s = Setup::new("noid");
    let k = linear(64, 64, WeightMode::Fp16);
    for hex in [None, Some("../../escape".to_string()), Some("f".repeat(256))] {
        let dev = s.device(Script {
            hex: Some(hex.clone()),
            ..Script::default()
        });
        let e = dev.compile(&k.mil_text(), &k.weights).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("hexStringIdentifier") && msg.contains("anelm doctor"),
            "{hex:?}: {msg}"
        );
        assert!(dev.runtime().writes().is_empty(), "{hex:?}");
        assert_eq!(dev.runtime().count("compile qos"), 0);
        assert_eq!(dev.runtime().live_models(), 0, "{hex:?}");
        assert_eq!(dev.runtime().live_surfaces(), 0, "{hex:?}");
    }
    assert!(!s.root.join("escape").exists());
}

#[test]
fn load_failure_names_the_kernel_and_how_many_are_loaded() {
    let s = Setup::new("budget");
    let dev = s.device(Script {
        budget: Some(2),
        ..Script::default()
    });
    let k = linear(64, 64, WeightMode::Fp16);
    let hs: Vec<_> = (0..3)
        .map(|_| dev.compile(&k.mil_text(), &k.weights).unwrap())
        .collect();
    dev.load(hs[0]).unwrap();
    dev.load(hs[1]).unwrap();
    let e = dev.load(hs[2]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "kernel {} ([1,64,1,32] → [1,64,1,32], weights ",
            &id_of(&k)[..12]
        )),
        "{msg}"
    );
    assert!(msg.contains("2 kernel(s) (0 MB of weights) already loaded"), "{msg}");
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
    let dev = s.device(Script::default());
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    // Surfaces: one input and one output of 64 × 32 × 2 = 4096 bytes, allocated at the
    // 49,152-byte minimum.
    assert_eq!(dev.runtime().count("IOSurfaceCreate 49152"), 2);
    assert!(matches!(
        dev.evaluate(h, &[&Surface::new(64)], &mut [Surface::new(64)]),
        Err(AneError::State { call: "evaluate", .. })
    ));
    dev.load(h).unwrap();
    let x: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
    for _ in 0..3 {
        // The fake ANE runs the program: what the emulator computes comes back.
        assert_eq!(run(&dev, h, &x), expected(&k, &x));
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
    let dev = s.device(Script::default());
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
    let dev = s.device(Script {
        eval_error: Some("Program Inference error status=0x1d".into()),
        ..Script::default()
    });
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h).unwrap();
    let msg = dev
        .evaluate(h, &[&Surface::new(64)], &mut [Surface::new(64)])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("status=0x1d") && msg.contains("(path=in-process)"),
        "{msg}"
    );
    assert!(msg.contains("restart the process"), "{msg}");
}

#[test]
fn direct_evaluation_is_used_when_asked_and_falls_back_to_the_daemon() {
    let s = Setup::new("direct");
    let k = linear(64, 64, WeightMode::Fp16);
    let x = vec![0.5f32; 64];
    let y = expected(&k, &x);
    // Asked for and available.
    let dev = s.device_with(
        Script {
            has_client: true,
            ..Script::default()
        },
        true,
    );
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    dev.load(h).unwrap();
    assert!(dev.stats().direct_eval);
    assert_eq!(run(&dev, h, &x), y);
    assert_eq!(dev.runtime().count("direct qos=21"), 1);
    assert_eq!(dev.runtime().count("evaluate"), 0);
    // A failing direct call turns it off and the daemon path answers.
    dev.runtime().script(|sc| sc.direct_error = Some("denied".into()));
    assert_eq!(run(&dev, h, &x), y);
    assert!(!dev.stats().direct_eval);
    assert_eq!(run(&dev, h, &x), y);
    assert_eq!(dev.runtime().count("direct"), 2);
    assert_eq!(dev.runtime().count("evaluate qos=21"), 2);
    drop(dev);
    // Asked for but no client: daemon path from the start.
    let dev = s.device_with(Script::default(), true);
    assert!(!dev.stats().direct_eval);
}

#[test]
fn drop_unloads_then_releases_request_surfaces_and_model_and_leaks_nothing() {
    let s = Setup::new("drop");
    let k = linear(64, 64, WeightMode::Fp16);
    // `release` of one kernel: the order of the calls.
    let dev = s.device(Script::default());
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
    assert!(!s.temp.join(id_of(&k)).exists(), "model directory removed");
    assert!(matches!(dev.load(h), Err(AneError::UnknownHandle(_))));
    assert_eq!(dev.stats().loaded, 0);
    drop(dev);
    // Dropping the device frees every kernel (loaded or not) and its own objects.
    let cfg = AppleConfig {
        direct_eval: true,
        temp_dir: Some(s.temp.clone()),
        ..AppleConfig::default()
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
fn releasing_a_compiled_kernel_removes_its_directory() {
    let s = Setup::new("keep");
    let dev = s.device(Script::default());
    let k = linear(64, 64, WeightMode::Fp16);
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    assert!(s.temp.join(id_of(&k)).join("model.mil").is_file());
    dev.release(h).unwrap();
    assert!(!s.temp.join(id_of(&k)).exists());
}

/// Nothing the device took is held any more: no model or request retained, no surface, no
/// kernel loaded (only the device's own options dictionary stays retained).
fn assert_all_released(dev: &Device<Fake>, what: &str) {
    let rt = dev.runtime();
    assert_eq!(rt.live_models(), 0, "{what}: models");
    assert_eq!(rt.live_surfaces(), 0, "{what}: surfaces");
    assert_eq!(rt.leaks().len(), 1, "{what}: only the options dictionary is retained");
    assert_eq!(dev.stats().loaded, 0, "{what}: loaded");
    assert_eq!(dev.stats().loaded_bytes, 0, "{what}: loaded bytes");
    assert_eq!(rt.open_pools(), 0, "{what}: pools");
}

#[test]
fn every_error_path_releases_what_it_made() {
    let s = Setup::new("errpaths");
    let k = linear(64, 64, WeightMode::Fp16);
    let (mil, w) = (k.mil_text(), &k.weights);

    // Surfaces smaller than the 49,152-byte minimum: refused by rule, model and surfaces freed.
    let dev = s.device(Script {
        small_surfaces: true,
        ..Script::default()
    });
    let e = dev.compile(&mil, w).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::SurfaceMinBytes), "{e}");
    assert!(dev.runtime().count("CFRelease") >= 1);
    assert_all_released(&dev, "small surface");

    // A nil request after both surfaces exist.
    let dev = s.device(Script {
        nil_request: true,
        ..Script::default()
    });
    assert!(dev.compile(&mil, w).is_err());
    assert_eq!(dev.runtime().count("CFRelease"), 2);
    assert_all_released(&dev, "nil request");

    // A compile whose load fails (and its retry): compile_and_load releases the program.
    let dev = s.device(Script {
        load_failures: 2,
        ..Script::default()
    });
    let e = compile_and_load(&dev, &mil, w).unwrap_err();
    assert!(e.to_string().contains("load failed"), "{e}");
    assert_eq!(dev.runtime().count("load qos=21"), 2);
    assert_eq!(dev.runtime().count("release"), 2, "request and model");
    assert!(matches!(
        dev.signature(ProgramHandle(1)),
        Err(AneError::UnknownHandle(1))
    ));
    assert_all_released(&dev, "failed load");

    // A cache probe whose load fails.
    let dev = s.device(Script {
        os_cache: vec![id_of(&k)],
        load_failures: 1,
        ..Script::default()
    });
    assert!(dev.load_without_compile(&mil, w).is_err());
    assert_all_released(&dev, "failed cache load");

    // Chunks already loaded when a later chunk fails: the guard releases them all.
    let dev = s.device(Script {
        budget: Some(2),
        ..Script::default()
    });
    let built = (|| -> Result<Vec<ProgramHandle>, AneError> {
        let mut guard = Releasing::new(&dev);
        for _ in 0..3 {
            guard.add(compile_and_load(&dev, &mil, w)?);
        }
        Ok(guard.keep())
    })();
    assert!(built.is_err());
    assert_eq!(dev.runtime().count("unload qos=21"), 2, "both loaded chunks unloaded");
    assert_all_released(&dev, "third chunk refused");

    // The same guard kept: the programs stay until released through the trait.
    let dev = s.device(Script::default());
    let mut guard = Releasing::new(&dev);
    for _ in 0..2 {
        guard.add(compile_and_load(&dev, &mil, w).unwrap());
    }
    let hs = guard.keep();
    assert_eq!(dev.stats().loaded, 2);
    for h in hs {
        AneDevice::release(&dev, h).unwrap();
    }
    assert_all_released(&dev, "kept then released");
}

#[test]
fn the_compile_budget_stops_before_the_compiler_and_the_cache_resumes() {
    let s = Setup::new("cbudget");
    let k = linear(64, 64, WeightMode::Fp16);
    let (mil, w) = (k.mil_text(), &k.weights);
    let cfg = AppleConfig {
        max_compiles: Some(2),
        ..AppleConfig::default()
    };
    let dev = s.device_cfg(Script::default(), cfg.clone());
    dev.compile(&mil, w).unwrap();
    dev.compile(&mil, w).unwrap();
    let writes = dev.runtime().writes().len();
    let e = dev.compile(&mil, w).unwrap_err();
    assert_eq!(e.rule(), Some(Rule::CompileBudget), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("2 compiles") && msg.contains("run anelm again"), "{msg}");
    assert!(msg.contains("ANELM_ANE_MAX_COMPILES"), "{msg}");
    assert_eq!(
        dev.runtime().count("compile qos"),
        2,
        "the third never reached the compiler"
    );
    assert_eq!(dev.runtime().writes().len(), writes, "nothing written for it");
    assert_eq!(dev.runtime().live_models(), 2);
    // A program the service already holds still loads: cache loads do not count.
    let h = dev.load_without_compile(&mil, w).unwrap();
    assert_eq!(dev.stats().compile_attempts, 2);
    dev.signature(h).unwrap();
    // A failed compile counts too (the leak is per call).
    let dev = s.device_cfg(
        Script {
            compile_error: Some("bad".into()),
            ..Script::default()
        },
        cfg,
    );
    assert!(dev.compile(&mil, w).is_err());
    assert!(dev.compile(&mil, w).is_err());
    assert_eq!(dev.compile(&mil, w).unwrap_err().rule(), Some(Rule::CompileBudget));
    assert_all_released(&dev, "budget");
}

#[test]
fn the_compile_budget_comes_from_the_environment_value() {
    assert_eq!(parse_max_compiles(None, Some(119)), Some(119));
    assert_eq!(parse_max_compiles(Some("0"), Some(119)), None);
    assert_eq!(parse_max_compiles(Some(" 300 "), Some(119)), Some(300));
    assert_eq!(parse_max_compiles(Some("lots"), Some(119)), Some(119));
    assert_eq!(AppleConfig::default().max_compiles, Some(119));
}

#[test]
fn lifecycle_errors_match_the_emulator() {
    let s = Setup::new("life");
    let dev = s.device(Script::default());
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

/// `anelm doctor --report`'s dispatch sweep on the device logic: every size compiles, loads,
/// evaluates and is released; the identifier length the report shows is the framework's.
#[test]
fn the_dispatch_sweep_runs_on_the_device_and_records_the_identifier_length() {
    let s = Setup::new("sweep");
    let id = super::modeldir::tests::hex_identifier();
    let dev = s.device(Script {
        hex: Some(Some(id)),
        ..Script::default()
    });
    assert_eq!(dev.stats().identifier_bytes, 0);
    let pts = crate::dispatch_sweep::dispatch_sweep(&dev, &[64, 128], 3).unwrap();
    assert_eq!(pts.iter().map(|p| p.size).collect::<Vec<_>>(), vec![64, 128]);
    assert!(pts[1].bytes > pts[0].bytes, "{pts:?}");
    assert!(
        pts.iter()
            .all(|p| p.ane_seconds.is_finite() && p.wall_seconds.is_finite())
    );
    let st = dev.stats();
    assert_eq!(st.identifier_bytes, 194);
    // One warm-up, three timed dispatches and three through the runtime's own path per size;
    // nothing left loaded.
    assert!(pts.iter().all(|p| p.run_seconds.is_finite() && p.run_seconds > 0.0));
    assert_eq!(st.dispatches, 14);
    assert_eq!(st.loaded, 0);
}

// ---- Issue 37: a fake framework as strict as the real one, and the defects it catches ----

/// `a − b` over two `[1, 64, 1, 32]` inputs declared in the order `first`, `second`.
fn difference(first: &str, second: &str) -> String {
    let head = "program(1.0)\n[buildInfo = dict<tensor<string, []>, tensor<string, []>>({{\"coremlc-version\", \
                \"3505.4.1\"}})]\n{\n";
    format!(
        "{head}    func main<ios16>(tensor<fp16, [1, 64, 1, 32]> {first}, tensor<fp16, [1, 64, 1, 32]> {second}) {{\n        \
         tensor<fp16, [1, 64, 1, 32]> y = sub(x = a, y = b)[name = tensor<string, []>(\"y\")];\n    }} -> (y);\n}}\n"
    )
}

/// Item 5: the identifier is the framework's (three uppercase SHA-256 digests: MIL, weights,
/// options), equal for equal programs across processes and different when the weights differ.
#[test]
fn the_identifier_is_computed_as_the_framework_does() {
    let s = Setup::new("ident");
    let k = linear(64, 64, WeightMode::Fp16);
    let id = id_of(&k);
    let parts: Vec<&str> = id.split('_').collect();
    assert_eq!(parts.len(), 3, "{id}");
    assert!(
        parts
            .iter()
            .all(|p| p.len() == 64 && p.chars().all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())),
        "{id}"
    );
    assert_eq!(id.len(), 194);
    assert_eq!(
        parts[2], "E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
        "no options: the digest of the empty string"
    );
    // Same MIL, other weights: only the weights digest changes.
    let other = lower(
        &AneKernel::Linear { rows: 64, cols: 64 },
        &[&vec![0.5; 64 * 64]],
        WeightMode::Fp16,
    )
    .unwrap();
    assert_eq!(other.mil_text(), k.mil_text());
    let id2 = id_of(&other);
    assert_eq!(id2.split('_').next(), Some(parts[0]));
    assert_ne!(id2.split('_').nth(1), Some(parts[1]));
    // The device names the directory with it, and the fake's compile found every file there.
    let dev = s.device(Script::default());
    let h = dev.compile(&k.mil_text(), &k.weights).unwrap();
    assert_eq!(dev.stats().identifier_bytes, 194);
    assert!(s.temp.join(&id).join("model.mil").is_file());
    assert!(dev.runtime().service_ids().contains(&id));
    dev.load(h).unwrap();
}

/// Item 5: compile needs `model.mil` and every BLOBFILE with the dictionary's bytes under
/// `<tmp>/<id>`; load needs a compiled (or cached) program; unload removes the directory.
#[test]
fn the_fake_compiles_only_what_is_on_disk_and_loads_only_what_was_compiled() {
    use super::runtime::Runtime;
    let s = Setup::new("strict");
    let rt = Fake::with(Script::default(), s.temp.clone());
    let k = linear(64, 64, WeightMode::Int8 { block: None });
    let mil = k.mil_text();
    let dir = s.temp.join(id_of(&k));
    let model = {
        let m = rt.data(mil.as_bytes()).unwrap();
        let w = super::foundation::weights_dictionary(&rt, &k.weights).unwrap();
        let d = rt.descriptor(m, w).unwrap();
        rt.in_memory_model(d).unwrap()
    };
    let options = rt.empty_dictionary().unwrap();
    assert_eq!(rt.hex_string_identifier(model), Some(id_of(&k)));
    // Nothing on disk, then only model.mil, then a weight file with other bytes.
    let e = rt.compile(model, 21, options).unwrap_err();
    assert!(e.contains("model.mil"), "{e}");
    fs::create_dir_all(dir.join("weights")).unwrap();
    fs::write(dir.join("model.mil"), &mil).unwrap();
    let e = rt.compile(model, 21, options).unwrap_err();
    assert!(e.contains("weights/"), "{e}");
    for (key, bytes) in k.weights.iter() {
        let mut b = bytes.to_vec();
        b[200] ^= 1;
        fs::write(dir.join(key.strip_prefix("@model_path/").unwrap()), b).unwrap();
    }
    let e = rt.compile(model, 21, options).unwrap_err();
    assert!(e.contains("differs"), "{e}");
    // Not compiled: no load.
    let e = rt.load(model, 21, options).unwrap_err();
    assert!(e.contains("no compiled program"), "{e}");
    super::modeldir::write_model_dir(&dir, &mil, &k.weights).unwrap();
    rt.compile(model, 21, options).unwrap();
    rt.load(model, 21, options).unwrap();
    assert!(dir.exists());
    rt.unload(model, 21).unwrap();
    assert!(!dir.exists(), "unload removes the model directory");
    // The service still holds the program: it loads again without the directory.
    rt.load(model, 21, options).unwrap();
}

/// Items 3 and 5: the framework binds surfaces by sorted name; the device lists them in that
/// order whatever the MIL declares, so `a − b` comes out right even when `b` is declared first.
#[test]
fn surfaces_bind_by_sorted_name_on_the_fake() {
    let s = Setup::new("sorted");
    let dev = s.device(Script::default());
    let a = Surface::pack(64, &[&[3.0; 64]]).unwrap();
    let b = Surface::pack(64, &[&[1.0; 64]]).unwrap();
    for mil in [difference("a", "b"), difference("b", "a")] {
        let h = compile_and_load(&dev, &mil, &anelm_mil::WeightFiles::new()).unwrap();
        let mut y = [Surface::new(64)];
        dev.evaluate(h, &[&a, &b], &mut y).unwrap();
        assert_eq!(y[0].read_lane(0).unwrap(), vec![2.0; 64], "{mil}");
        dev.release(h).unwrap();
    }
}

/// Items 2 and 5: `linear_residual`'s inputs differ in size (`attn` 1024 channels, `xres` 64):
/// allocated separately they would be 65,536 and 49,152 bytes, which the strict fake refuses
/// with status 0x1d as Orion saw; the device allocates both at 65,536 and the kernel runs.
#[test]
fn inputs_of_unequal_size_share_one_allocation_size() {
    let s = Setup::new("equal");
    let k = lower(
        &AneKernel::LinearResidual { rows: 64, cols: 1024 },
        &[&vec![0.01; 64 * 1024]],
        WeightMode::Fp16,
    )
    .unwrap();
    let dev = s.device(Script::default());
    let h = compile_and_load(&dev, &k.mil_text(), &k.weights).unwrap();
    assert_eq!(
        dev.runtime().count("IOSurfaceCreate 65536"),
        2,
        "both inputs at the larger size"
    );
    assert_eq!(dev.runtime().count("IOSurfaceCreate 49152"), 1, "the one output");
    let x = Surface::pack(1024, &[&vec![1.0; 1024]]).unwrap();
    let r = Surface::pack(64, &[&vec![0.5; 64]]).unwrap();
    let mut y = [Surface::new(64)];
    dev.evaluate(h, &[&x, &r], &mut y).unwrap();
    let got = y[0].read_lane(0).unwrap();
    assert!(got.iter().all(|v| (v - 10.74).abs() < 0.05), "{:?}", &got[..4]);
}

/// Item 5: the strict fake refuses unequal allocations, and the switch lets them through.
#[test]
fn the_fake_refuses_unequal_allocations_unless_told_otherwise() {
    use super::runtime::Runtime;
    for lenient in [false, true] {
        let s = Setup::new("unequal");
        let rt = Fake::with(
            Script {
                unequal_sizes_ok: lenient,
                ..Script::default()
            },
            s.temp.clone(),
        );
        let mil = difference("a", "b");
        let no_weights = anelm_mil::WeightFiles::new();
        let dir = s.temp.join(identifier(mil.as_bytes(), &no_weights));
        super::modeldir::write_model_dir(&dir, &mil, &no_weights).unwrap();
        let options = rt.empty_dictionary().unwrap();
        let m = rt.data(mil.as_bytes()).unwrap();
        let w = rt.empty_dictionary().unwrap();
        let model = rt.in_memory_model(rt.descriptor(m, w).unwrap()).unwrap();
        rt.compile(model, 21, options).unwrap();
        rt.load(model, 21, options).unwrap();
        let surface = |bytes: usize| {
            let props = super::foundation::surface_property_dictionary(&rt, bytes).unwrap();
            let s = rt.create_surface(props).unwrap();
            rt.surface_object(s).unwrap()
        };
        let ins = rt.array(&[surface(49_152), surface(65_536)]).unwrap();
        let outs = rt.array(&[surface(49_152)]).unwrap();
        let idx2 = super::foundation::index_array(&rt, 2).unwrap();
        let idx1 = super::foundation::index_array(&rt, 1).unwrap();
        let proc0 = rt.number_int(0).unwrap();
        let req = rt.request(ins, idx2, outs, idx1, proc0).unwrap();
        let r = rt.evaluate(model, 21, options, req);
        if lenient {
            r.unwrap();
        } else {
            let e = r.unwrap_err();
            assert!(e.contains("0x1d") && e.contains("unequal input"), "{e}");
        }
    }
}

/// Item 5: the fake's compiler has a budget of its own (its per-process leak); the device's
/// budget stops before it.
#[test]
fn the_fakes_compiler_leaks_and_the_devices_budget_stops_first() {
    let s = Setup::new("leak");
    let k = linear(64, 64, WeightMode::Fp16);
    let (mil, w) = (k.mil_text(), &k.weights);
    let leaky = Script {
        compile_budget: Some(2),
        ..Script::default()
    };
    let off = AppleConfig {
        max_compiles: None,
        ..AppleConfig::default()
    };
    let dev = s.device_cfg(leaky.clone(), off);
    dev.compile(&mil, w).unwrap();
    dev.compile(&mil, w).unwrap();
    let e = dev.compile(&mil, w).unwrap_err();
    assert!(
        matches!(&e, AneError::Framework(m) if m.contains("ANECCompile() FAILED")),
        "{e}"
    );
    let budget = AppleConfig {
        max_compiles: Some(2),
        ..AppleConfig::default()
    };
    let dev = s.device_cfg(leaky, budget);
    dev.compile(&mil, w).unwrap();
    dev.compile(&mil, w).unwrap();
    assert_eq!(dev.compile(&mil, w).unwrap_err().rule(), Some(Rule::CompileBudget));
    assert_eq!(dev.runtime().count("compile qos"), 2);
}

/// Item 5: every selector the runtime sends has as many colons as the message type it is sent
/// with has arguments, and every method checked at open is among them.
#[test]
fn each_selectors_colon_count_is_its_message_types_argument_count() {
    use super::framework::{DIRECT_EVAL_SELECTOR, OPTIONAL_MODEL_METHODS, REQUIRED_METHODS, SELECTOR_ARITIES};
    assert!(SELECTOR_ARITIES.len() >= 29, "{}", SELECTOR_ARITIES.len());
    for (sel, args) in SELECTOR_ARITIES {
        let name = sel.to_str().unwrap();
        assert_eq!(name.matches(':').count(), *args, "{name}");
    }
    let sent: Vec<&std::ffi::CStr> = SELECTOR_ARITIES.iter().map(|(s, _)| *s).collect();
    for sel in REQUIRED_METHODS
        .iter()
        .map(|(_, s, _)| *s)
        .chain(OPTIONAL_MODEL_METHODS)
        .chain([DIRECT_EVAL_SELECTOR])
    {
        assert!(sent.contains(&sel), "{sel:?} is not in the typed selector table");
    }
}

/// Items 1 and 5: a spent compile budget stops the build without a refusal (no fallback, no form
/// marked refused, the LM head not moved to the CPU), says how many programs the model needs,
/// and the next process resumes from the compile cache.
#[test]
fn a_spent_compile_budget_is_not_a_refusal_and_the_next_process_resumes() {
    use crate::program_build::{BuildError, FfnWeights, ProgramBuilder};
    use std::sync::Arc;
    let s = Setup::new("resume");
    let cache = CompileCache::new(&s.markers);
    let cfg = AppleConfig {
        max_compiles: Some(2),
        ..AppleConfig::default()
    };
    let weights = |n: usize| -> Vec<f32> { (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 16.0).collect() };
    let mats: Vec<(usize, Vec<f32>)> = [64, 96, 128].iter().map(|&r| (r, weights(r * 64))).collect();
    let build = |b: &ProgramBuilder<Device<Fake>>| -> Vec<Result<(), BuildError>> {
        mats.iter()
            .map(|(rows, m)| b.linear(&format!("proj {rows}"), *rows, 64, m).map(|_| ()))
            .collect()
    };
    let first = Arc::new(s.device_cfg(Script::default(), cfg.clone()));
    let b = ProgramBuilder::new(Arc::clone(&first), WeightMode::Fp16, Some(cache.clone()));
    let forecast = b.expect_programs(3).expect("the device has a budget");
    assert!(!forecast.fits());
    assert_eq!(forecast.runs(), Some(2));
    assert!(forecast.to_string().contains("3 ANE programs"), "{forecast}");
    let results = build(&b);
    assert!(results[0].is_ok() && results[1].is_ok(), "{results:?}");
    let Err(BuildError::Budget(msg)) = &results[2] else {
        panic!("expected a budget error, got {:?}", results[2]);
    };
    assert!(msg.contains("of the 3 this model needs"), "{msg}");
    assert!(msg.contains("run the same command again"), "{msg}");
    // No fallback ran: not the FFN chain, not the LM head's move to the CPU.
    let (g, u, d) = (weights(128 * 64), weights(128 * 64), weights(64 * 128));
    let ffn = FfnWeights {
        gate: &g,
        up: &u,
        down: &d,
        hidden: 64,
        inter: 128,
    };
    assert!(matches!(b.ffn("ffn", &ffn), Err(BuildError::Budget(_))));
    // An LM head the budget stops is a budget error too (a refusal would move it to the CPU).
    assert!(matches!(
        b.rows("lm_head", 32, 64, &weights(32 * 64)),
        Err(BuildError::Budget(_))
    ));
    assert!(b.counters().fallbacks().is_empty(), "{:?}", b.counters().fallbacks());
    assert_eq!(first.stats().compile_attempts, 2, "no compile was spent on a fallback");
    // The next process loads the two compiled programs from the cache and compiles the third.
    let next = Arc::new(s.next_device(&first, Script::default(), cfg));
    let b2 = ProgramBuilder::new(Arc::clone(&next), WeightMode::Fp16, Some(cache));
    assert!(build(&b2).iter().all(Result::is_ok));
    let st = b2.counters().stats();
    assert_eq!((st.programs, st.compiled, st.cache_loads), (3, 1, 2));
}

/// Item 2 on the fake: a program that compiles and loads but fails its first evaluation is
/// refused by the smoke dispatch and released; the FFN falls back to the next form.
#[test]
fn the_smoke_dispatch_turns_an_evaluation_failure_into_a_fallback() {
    use crate::program_build::{FfnWeights, ProgramBuilder};
    use std::sync::Arc;
    let s = Setup::new("smoke");
    let dev = Arc::new(s.device(Script {
        eval_error_when: Some("xnorm".into()),
        ..Script::default()
    }));
    let b = ProgramBuilder::new(Arc::clone(&dev), WeightMode::Fp16, None);
    let w = |n: usize| -> Vec<f32> { (0..n).map(|i| ((i % 5) as f32 - 2.0) / 8.0).collect() };
    let (g, u, d) = (w(128 * 64), w(128 * 64), w(64 * 128));
    let ffn = FfnWeights {
        gate: &g,
        up: &u,
        down: &d,
        hidden: 64,
        inter: 128,
    };
    let layout = b.ffn("ffn layer0", &ffn).expect("the plain form");
    assert!(matches!(layout, crate::ProgramLayout::AddOnHost(_)), "{layout:?}");
    let fb = b.counters().fallbacks();
    assert_eq!(fb.len(), 1, "{fb:?}");
    assert!(fb[0].reason.contains("status=0x1d"), "{}", fb[0].reason);
    assert_eq!(dev.stats().loaded, 1);
    assert_eq!(dev.runtime().live_models(), 1, "the refused program was released");
}

/// Item 4: after a cache-hit load the model no longer holds its descriptor (the second copy of
/// the weights); the kernel still runs, unloads and reloads.
#[test]
fn no_descriptor_bytes_are_held_after_a_cache_hit_load() {
    let s = Setup::new("desc");
    let cache = CompileCache::new(&s.markers);
    let k = linear(64, 64, WeightMode::Fp16);
    let first = s.device(Script::default());
    through_cache(&first, &cache, &k);
    assert_eq!(
        first.runtime().retained_descriptor_bytes(),
        0,
        "the compile path let go of it"
    );
    // Where the class lacks setDescriptor:, the bytes stay (the fake sees them).
    let old = s.next_device(
        &first,
        Script {
            no_set_descriptor: true,
            ..Script::default()
        },
        AppleConfig::default(),
    );
    let (_, outcome) = through_cache(&old, &cache, &k);
    assert_eq!(outcome, CacheOutcome::Loaded);
    assert!(old.runtime().retained_descriptor_bytes() >= k.weights.total_bytes());
    drop(old);
    let dev = s.next_device(&first, Script::default(), AppleConfig::default());
    let (h, outcome) = through_cache(&dev, &cache, &k);
    assert_eq!(outcome, CacheOutcome::Loaded);
    assert_eq!(dev.runtime().count("setDescriptor:nil"), 1);
    assert_eq!(dev.runtime().retained_descriptor_bytes(), 0);
    let x = vec![0.75f32; 64];
    assert_eq!(run(&dev, h, &x), expected(&k, &x));
    dev.unload(h).unwrap();
    dev.load(h).unwrap();
    assert_eq!(run(&dev, h, &x), expected(&k, &x));
}
