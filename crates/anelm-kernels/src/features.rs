//! What this CPU can run ([`Features`]) and the switches that narrow it for A/B measurements
//! ([`Tuning`], the `ANELM_*` environment variables), each read once per process into one value
//! that every kernel, the engine's own loops and `anelm doctor` ask, so no two places detect or
//! parse the same thing.

use std::sync::OnceLock;

/// The instruction-set extensions the kernels choose between, detected once per process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// x86-64: 256-bit integer and float vectors.
    pub avx2: bool,
    /// x86-64: fused multiply-add.
    pub fma: bool,
    /// x86-64: f16 ↔ f32 conversion instructions.
    pub f16c: bool,
    /// x86-64: AVX-512 foundation.
    pub avx512f: bool,
    /// x86-64: AVX-512 byte and word instructions.
    pub avx512bw: bool,
    /// x86-64: AVX-512 doubleword and quadword instructions.
    pub avx512dq: bool,
    /// x86-64: AVX-512 at 128/256-bit widths (and 32 vector registers there).
    pub avx512vl: bool,
    /// x86-64: AVX-512 integer dot products (`vpdpbusd`).
    pub avx512vnni: bool,
    /// x86-64: AVX-512 bf16 dot products (`vdpbf16ps`).
    pub avx512bf16: bool,
    /// x86-64: Galois-field byte instructions (the wide kernels' nibble unpacking).
    pub gfni: bool,
    /// aarch64: Advanced SIMD.
    pub neon: bool,
    /// aarch64: int8 dot products (`sdot`/`udot`).
    pub dotprod: bool,
    /// aarch64: int8 matrix multiply (`smmla`).
    pub i8mm: bool,
}

impl Features {
    /// This CPU's features (detected on the first call).
    pub fn get() -> &'static Features {
        static FEATURES: OnceLock<Features> = OnceLock::new();
        FEATURES.get_or_init(Features::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> Features {
        use std::arch::is_x86_feature_detected as has;
        Features {
            avx2: has!("avx2"),
            fma: has!("fma"),
            f16c: has!("avx") && has!("f16c"),
            avx512f: has!("avx512f"),
            avx512bw: has!("avx512bw"),
            avx512dq: has!("avx512dq"),
            avx512vl: has!("avx512vl"),
            avx512vnni: has!("avx512vnni"),
            avx512bf16: has!("avx512bf16"),
            gfni: has!("gfni"),
            ..Features::default()
        }
    }

    #[cfg(target_arch = "aarch64")]
    fn detect() -> Features {
        use std::arch::is_aarch64_feature_detected as has;
        Features {
            neon: has!("neon"),
            dotprod: has!("dotprod"),
            i8mm: has!("i8mm"),
            ..Features::default()
        }
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fn detect() -> Features {
        Features::default()
    }

    /// AVX2 with FMA and F16C: what the 256-bit f32 and f16 loops are compiled for.
    pub fn avx2_fma_f16c(&self) -> bool {
        self.avx2 && self.fma && self.f16c
    }

    /// AVX-512 F, DQ, BW and VL: the subsets the 512-bit copies of plain f32 loops are
    /// compiled for.
    pub fn avx512(&self) -> bool {
        self.avx512f && self.avx512dq && self.avx512bw && self.avx512vl
    }

    /// Every feature with whether this CPU has it, for reports (`anelm doctor`).
    pub fn list(&self) -> Vec<(&'static str, bool)> {
        if cfg!(target_arch = "aarch64") {
            return vec![("neon", self.neon), ("dotprod", self.dotprod), ("i8mm", self.i8mm)];
        }
        vec![
            ("avx2", self.avx2),
            ("fma", self.fma),
            ("f16c", self.f16c),
            ("avx512f", self.avx512f),
            ("avx512bw", self.avx512bw),
            ("avx512dq", self.avx512dq),
            ("avx512vl", self.avx512vl),
            ("avx512vnni", self.avx512vnni),
            ("avx512bf16", self.avx512bf16),
            ("gfni", self.gfni),
        ]
    }
}

/// The `ANELM_*` switches for A/B measurements, read once per process. Defaults are the fast
/// paths; each switch only turns a path off or pins a choice, never turns on something the CPU
/// lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// `ANELM_KERNELS=scalar|avx2|avx2+vnni|neon|neon+dotprod`: the matmul path to use instead of
    /// the best.
    pub kernels: Option<String>,
    /// `ANELM_PACKED=0`: keep matrices row-major (no interleaved packing at load).
    pub packed: bool,
    /// `ANELM_PACK_WIDE=0`: pack in groups of 8 rows even where the 16-row AVX-512 kernels run.
    pub pack_wide: bool,
    /// `ANELM_PREFETCH=0`: finished matmul loops do not hint their successor's weights.
    pub prefetch_successor: bool,
    /// `ANELM_WEIGHT_PREFETCH=nta|t0`: the wide kernels' weight prefetch hint instead of the
    /// vendor default.
    pub weight_prefetch: Option<String>,
    /// `ANELM_GFNI=0`: the wide kernels do not use GFNI.
    pub gfni: bool,
    /// `ANELM_ATTN_WIDE=0`: attention rows stay on the 256-bit loops.
    pub attention_wide: bool,
    /// `ANELM_ENGINE_SIMD=base|avx2`: cap the engine's own f32 loops at this width.
    pub engine_simd: Option<String>,
    /// `ANELM_BF16=0`: embedding models keep f32 matmuls instead of bf16 × bf16.
    pub bf16: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            kernels: None,
            packed: true,
            pack_wide: true,
            prefetch_successor: true,
            weight_prefetch: None,
            gfni: true,
            attention_wide: true,
            engine_simd: None,
            bf16: true,
        }
    }
}

impl Tuning {
    /// The process's switches (read from the environment on the first call).
    pub fn get() -> &'static Tuning {
        static TUNING: OnceLock<Tuning> = OnceLock::new();
        TUNING.get_or_init(|| Tuning::from_vars(|k| std::env::var(k).ok()))
    }

    /// The switches as `var` reads them (the environment, or a test's map).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Tuning {
        let on = |k: &str| var(k).as_deref().map(str::trim) != Some("0");
        let named = |k: &str| var(k).filter(|v| !v.is_empty());
        Tuning {
            kernels: named("ANELM_KERNELS"),
            packed: on("ANELM_PACKED"),
            pack_wide: on("ANELM_PACK_WIDE"),
            prefetch_successor: on("ANELM_PREFETCH"),
            weight_prefetch: named("ANELM_WEIGHT_PREFETCH"),
            gfni: on("ANELM_GFNI"),
            attention_wide: on("ANELM_ATTN_WIDE"),
            engine_simd: named("ANELM_ENGINE_SIMD"),
            bf16: on("ANELM_BF16"),
        }
    }

    /// The switches that differ from the defaults, as `NAME=value`, for reports.
    pub fn changed(&self) -> Vec<String> {
        let mut out = Vec::new();
        let d = Tuning::default();
        let mut flag = |name: &str, v: bool, def: bool| {
            if v != def {
                out.push(format!("{name}={}", u8::from(v)));
            }
        };
        flag("ANELM_PACKED", self.packed, d.packed);
        flag("ANELM_PACK_WIDE", self.pack_wide, d.pack_wide);
        flag("ANELM_PREFETCH", self.prefetch_successor, d.prefetch_successor);
        flag("ANELM_GFNI", self.gfni, d.gfni);
        flag("ANELM_ATTN_WIDE", self.attention_wide, d.attention_wide);
        flag("ANELM_BF16", self.bf16, d.bf16);
        for (name, v) in [
            ("ANELM_KERNELS", &self.kernels),
            ("ANELM_WEIGHT_PREFETCH", &self.weight_prefetch),
            ("ANELM_ENGINE_SIMD", &self.engine_simd),
        ] {
            if let Some(v) = v {
                out.push(format!("{name}={v}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switches_default_to_the_fast_paths_and_only_zero_turns_one_off() {
        let none = Tuning::from_vars(|_| None);
        assert_eq!(none, Tuning::default());
        assert!(none.changed().is_empty());
        let set = Tuning::from_vars(|k| match k {
            "ANELM_PACKED" => Some("0".into()),
            "ANELM_GFNI" => Some("1".into()),
            "ANELM_KERNELS" => Some("avx2".into()),
            "ANELM_ENGINE_SIMD" => Some(String::new()),
            _ => None,
        });
        assert!(!set.packed && set.gfni && set.pack_wide);
        assert_eq!(set.kernels.as_deref(), Some("avx2"));
        assert_eq!(set.engine_simd, None, "an empty value is no value");
        assert_eq!(set.changed(), ["ANELM_PACKED=0", "ANELM_KERNELS=avx2"]);
    }

    #[test]
    fn features_agree_with_the_standard_library_and_are_consistent() {
        let f = Features::get();
        assert_eq!(f, &Features::detect());
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(f.avx2, std::arch::is_x86_feature_detected!("avx2"));
            assert_eq!(f.avx512vnni, std::arch::is_x86_feature_detected!("avx512vnni"));
        }
        #[cfg(target_arch = "aarch64")]
        {
            assert!(f.neon, "NEON is in every aarch64 CPU");
            assert_eq!(f.dotprod, std::arch::is_aarch64_feature_detected!("dotprod"));
            assert_eq!(
                crate::Isa::NeonDot.available(),
                f.dotprod,
                "sdot kernels only with dotprod"
            );
        }
        if f.avx512() {
            assert!(f.avx512f && f.avx512vl);
        }
        assert_eq!(
            f.list().iter().any(|&(n, _)| n == "avx2"),
            cfg!(not(target_arch = "aarch64"))
        );
    }
}
