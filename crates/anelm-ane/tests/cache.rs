//! The compile cache: marker files, the load-without-compile-first decision, recompile on a
//! stale marker, content identifiers, and the emulator's cache-hit path.

use std::cell::Cell;
use std::path::PathBuf;

use anelm_ane::{
    AneDevice, AneKernel, CacheOutcome, CompileCache, EmuAne, EmuConfig, Surface, WeightMode, compile_or_load,
    content_id, lower,
};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("anelm-ane-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn markers_are_plain_files_named_by_identifier() {
    let d = TempDir::new("markers");
    let c = CompileCache::new(&d.0);
    assert!(!c.has_marker("abc123"));
    c.write_marker("abc123").unwrap();
    let p = c.marker_path("abc123").unwrap();
    assert_eq!(p, d.0.join("compiled_markers/abc123.ok"));
    assert_eq!(std::fs::read(&p).unwrap(), b"ok");
    assert!(c.has_marker("abc123"));
    assert_eq!(c.marker_count(), 1);
    c.remove_marker("abc123").unwrap();
    assert!(!c.has_marker("abc123"));
    c.remove_marker("abc123").unwrap(); // absent is fine
    // Identifiers never become paths.
    for bad in ["", "../x", "a/b", "a.b", "x y"] {
        assert!(c.marker_path(bad).is_none(), "{bad:?}");
        assert!(c.write_marker(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_miss_compiles_and_writes_the_marker_then_a_hit_loads_without_compiling() {
    let d = TempDir::new("flow");
    let c = CompileCache::new(&d.0);
    let (loads, compiles) = (Cell::new(0), Cell::new(0));
    let load = || -> Result<u32, String> {
        loads.set(loads.get() + 1);
        Ok(1)
    };
    let compile = || -> Result<u32, String> {
        compiles.set(compiles.get() + 1);
        Ok(2)
    };
    assert_eq!(
        compile_or_load(Some(&c), "id1", load, compile),
        Ok((2, CacheOutcome::Compiled))
    );
    assert_eq!((loads.get(), compiles.get()), (0, 1), "no marker: load is not tried");
    assert!(c.has_marker("id1"));
    assert_eq!(
        compile_or_load(Some(&c), "id1", load, compile),
        Ok((1, CacheOutcome::Loaded))
    );
    assert_eq!((loads.get(), compiles.get()), (1, 1), "marker: loaded, not compiled");
}

#[test]
fn a_stale_marker_is_removed_and_the_program_recompiled() {
    let d = TempDir::new("stale");
    let c = CompileCache::new(&d.0);
    c.write_marker("id2").unwrap();
    let out = compile_or_load(Some(&c), "id2", || Err::<u32, _>("evicted".to_string()), || Ok(7));
    assert_eq!(out, Ok((7, CacheOutcome::Recompiled)));
    assert!(c.has_marker("id2"), "the recompiled program gets a fresh marker");
    // A compile failure leaves no marker behind.
    c.write_marker("id3").unwrap();
    let out = compile_or_load(
        Some(&c),
        "id3",
        || Err::<u32, _>("evicted".to_string()),
        || Err("refused".to_string()),
    );
    assert_eq!(out, Err("refused".to_string()));
    assert!(!c.has_marker("id3"));
}

#[test]
fn without_a_cache_only_the_compiler_runs() {
    let out = compile_or_load(
        None,
        "ignored",
        || -> Result<u32, ()> { panic!("no load without a cache") },
        || Ok(3),
    );
    assert_eq!(out, Ok((3, CacheOutcome::Uncached)));
}

#[test]
fn content_ids_follow_every_byte() {
    let k = AneKernel::Linear { rows: 2, cols: 3 };
    let w = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let a = lower(&k, &[&w], WeightMode::Fp16).unwrap();
    let id = |salt: &str, l: &anelm_ane::Lowered| content_id(salt, &l.mil_text(), l.weights.iter());
    let base = id("ane-emu", &a);
    assert_eq!(base.len(), 64);
    assert!(base.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(
        base,
        id("ane-emu", &lower(&k, &[&w], WeightMode::Fp16).unwrap()),
        "deterministic"
    );
    let mut w2 = w;
    w2[5] = 6.5;
    assert_ne!(
        base,
        id("ane-emu", &lower(&k, &[&w2], WeightMode::Fp16).unwrap()),
        "weights"
    );
    assert_ne!(
        base,
        id("ane-emu", &lower(&k, &[&w], WeightMode::INT8_PER_ROW).unwrap()),
        "mode"
    );
    assert_ne!(base, id("ane 26.3", &a), "salt");
}

/// The emulator through the cache: a second compile of the same program is a cache load, its
/// results equal the compiled program's, and a program that breaks a rule is never marked.
#[test]
fn the_emulator_loads_cached_programs_without_compiling() {
    let d = TempDir::new("emu");
    let c = CompileCache::new(&d.0);
    let ane = EmuAne::default();
    let k = AneKernel::Linear { rows: 2, cols: 3 };
    let low = lower(&k, &[&[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]], WeightMode::Fp16).unwrap();
    let text = low.mil_text();
    let id = content_id(&ane.cache_salt(), &text, low.weights.iter());
    let build = || {
        compile_or_load(
            Some(&c),
            &id,
            || ane.load_without_compile(&text, &low.weights),
            || {
                let h = ane.compile(&text, &low.weights)?;
                ane.load(h)?;
                Ok::<_, anelm_ane::AneError>(h)
            },
        )
        .unwrap()
    };
    let (h1, o1) = build();
    let (h2, o2) = build();
    assert_eq!((o1, o2), (CacheOutcome::Compiled, CacheOutcome::Loaded));
    let s = ane.stats();
    assert_eq!((s.compiles, s.cache_loads, s.loaded), (1, 1, 2));
    let x = Surface::pack(3, &[&[1.0, 2.0, 3.0]]).unwrap();
    let run = |h| {
        let mut y = [Surface::new(2)];
        ane.evaluate(h, &[&x], &mut y).unwrap();
        y[0].read_lane(0).unwrap()
    };
    assert_eq!(run(h1), vec![1.0, 5.0]);
    assert_eq!(run(h2), run(h1));
    // A different emulator configuration is a different identifier.
    let strict = EmuAne::new(EmuConfig {
        limits: anelm_ane::Limits {
            max_dim: 1024,
            ..anelm_ane::Limits::default()
        },
        ..EmuConfig::default()
    });
    assert_ne!(strict.cache_salt(), ane.cache_salt());
    // A refused program (runtime input W = 16, rule io-lanes-32) gets no marker.
    let bad = text.replace(", 32]", ", 16]");
    let bad_id = content_id(&ane.cache_salt(), &bad, low.weights.iter());
    let out = compile_or_load(
        Some(&c),
        &bad_id,
        || ane.load_without_compile(&bad, &low.weights),
        || ane.compile(&bad, &low.weights),
    );
    assert!(out.is_err());
    assert!(!c.has_marker(&bad_id));
}
