//! Chip profiles for the dispatch cost model `t = fixed + bytes / bandwidth`.
//!
//! Every constant carries its source. Only the M3 Max has a measured in-process dispatch fit
//! (119 µs + bytes / 78 GB/s, field guide, `ane-hardware.md` §4.5). For the other chips the
//! only per-chip figure is ANEMLL-Bench's ANE bandwidth on a 1 GB LM-head model through CoreML
//! (`landscape.md` §1: M1 61, M1 Pro/Max ≈ 55, M2 family ≈ 60–62, M3 63, M3 Max 120, M4 64,
//! M4 Pro 126, M4 Max 119, M5 70, M5 Max 148 GB/s). Those are scaled by the M3 Max ratio
//! between the two methods, 78 / 120 = 0.65, so that every profile means the same thing (an
//! in-process eval-only dispatch). The fixed cost is the M3 Max figure except on M5, where the
//! MX QoS sweep implies 60–100 µs (`ane-hardware.md` §4.5; 80 µs is the midpoint). None of
//! these constants was fitted to the tok/s figures the plan is checked against.
//!
//! Each profile also carries the host side of a step ([`HostProfile`]: the CPU work between
//! dispatches, `plan_host.rs`) and the efficiency of int8 weight streams. Those few constants are
//! the ones calibrated against the C++ system's tok/s table (`ane-runtime.md` §11); their sources
//! are on [`HostProfile::M3_MAX`] and [`INT8_STREAM_EFFICIENCY`]. Only the M3 Max has
//! measurements; every other chip reuses them.

use std::time::Duration;

/// The ratio of the field guide's dispatch-fit bandwidth to ANEMLL-Bench's CoreML figure on
/// the one chip that has both (M3 Max: 78 / 120).
pub const FIT_TO_ANEMLL_RATIO: f64 = 78.0 / 120.0;

/// The ratio of the in-decode streaming rate (109 GB/s, [`ChipProfile::stream_gb_s`]) to
/// ANEMLL-Bench's CoreML figure on the M3 Max (120 GB/s); both measure large weight streams.
pub const STREAM_TO_ANEMLL_RATIO: f64 = 109.0 / 120.0;

/// The fraction of the fp16 byte rate at which int8 weights stream through a dispatch.
///
/// Calibrated: the C++ system measured int8 decode only 27 % faster than fp16 on Qwen3.5-4B
/// (9.21 → 11.66 tok/s, `ane-runtime.md` §11), 27 % in commit `c7da175` and 35 % in `1a2a04e`
/// (§3.6), where halving the bytes at the fp16 rate would give ~80 %. The ANE expands
/// `constexpr_blockwise_shift_scale` weights on the fly; this says it does so at about this
/// fraction of the fp16 streaming rate (int8 still wins: 1 byte at 0.66 of the rate costs
/// 0.76 of 2 bytes at the full rate). Needs a Mac to confirm (`anelm doctor` dispatch sweep in
/// both modes).
pub const INT8_STREAM_EFFICIENCY: f64 = 0.66;

/// The host (CPU) constants of one chip: what the work between dispatches costs.
///
/// The plan models one performance core doing that work, as the C++ runtime's decode loop does
/// (`ane-runtime.md` §7.2: per-session CPU work in a loop; evaluate is synchronous).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostProfile {
    /// Effective f32 GFLOP/s of one performance core on the host loops (norms, RoPE, attention,
    /// the DeltaNet recurrence, sampling): NEON/Accelerate code that is partly memory-bound.
    pub gflops: f64,
    /// One performance core's copy bandwidth, GB/s (state, KV and surface traffic).
    pub gb_s: f64,
    /// Host time per dispatch beyond the ANE's own fixed cost (building the call, waking up
    /// after the synchronous evaluate), µs.
    pub dispatch_us: f64,
    /// One element through a scalar per-element loop (fp32 ↔ fp16 with the hardware
    /// conversion, lane gather/scatter), ns.
    pub element_ns: f64,
    /// One element through a software fp32 → fp16 conversion (the C++ batched packer
    /// truncates bit by bit, `ane-runtime.md` §5), ns.
    pub soft_convert_ns: f64,
    /// Host time per dispatch of a runtime that evaluates a request built once per kernel, on
    /// surfaces that stay bound to it, with no allocation per dispatch (anelm's `apple/device.rs`
    /// since issue 38), µs: what such a runtime adds to the ANE's own fixed cost.
    pub reused_dispatch_us: f64,
    /// Cores the per-stream and per-head host work is spread over (the kernel pool's threads).
    pub cores: usize,
    /// The fraction of linear speed-up parallel host sections reach (memory bandwidth shared
    /// between cores, uneven tasks, efficiency cores).
    pub parallel_efficiency: f64,
    /// One hand-off of a parallel section to the spinning pool and back, µs.
    pub section_us: f64,
    /// Memory bandwidth all cores together reach, GB/s of read + write traffic: the ceiling on a
    /// parallel section's bytes however many cores share them.
    pub memory_gb_s: f64,
    /// Where these come from.
    pub source: &'static str,
}

impl HostProfile {
    /// M3 Max performance core (4.05 GHz). Sources:
    /// - `gb_s` 97: the measured IOSurface memcpy, 13.1 MB in 0.27 ms (`ane-hardware.md` §8.7), is
    ///   48.5 GB/s each way, 97 GB/s of read + write traffic (the unit the model counts bytes in).
    /// - `gflops` 96: three quarters of the core's fp32 FMA peak (4 × 128-bit FMA pipes, 129.6
    ///   GFLOP/s). Cross-check: it puts one Qwen3.5-4B stream's host work at 2.9 ms per token
    ///   against the 2.6 ms (`3dc1c69`) and 3.2 ms (`2a1ce5e`: 19.4 ms for 6 sessions) the C++
    ///   system measured (`ane-runtime.md` §11).
    /// - `dispatch_us` 117: the C++ per-kernel decode profile of Qwen3-4B fits 246 µs + bytes /
    ///   109 GB/s per dispatch (`ane-runtime.md` §6.4, see [`ChipProfile::stream_gb_s`]); less the
    ///   ANE's 119 µs and ~10 µs of lane-0 surface traffic, 117 µs are the host's.
    /// - `element_ns` 0.3: one element per ~1.2 cycles (a load, a convert, a strided store).
    /// - `soft_convert_ns` 1.5: calibrated on the serve rows c2 / c4 (`ane-runtime.md` §11), the
    ///   only figures that see the C++ batched packer; ~6 cycles of integer bit work per element.
    /// - `reused_dispatch_us` 20: **assumed, needs a Mac**. The 119 µs fixed cost of the
    ///   dispatch fit comes from an eval-only loop re-evaluating one prebuilt request, so that
    ///   loop's own call overhead is inside the ANE's fixed cost already; what anelm adds per
    ///   dispatch is a kernel lookup, a mutex, an autorelease pool and the surface memcpys (counted
    ///   apart). The C++ decode loop's 117 µs (above) includes its per-dispatch locking and
    ///   staging. `anelm doctor --report` measures it (`host per dispatch`).
    /// - `cores` 12: the M3 Max's performance cores (12 P + 4 E in the 16-core part).
    /// - `parallel_efficiency` 0.51: calibrated on the one measured parallel host section, the
    ///   C++ system's per-session CPU work of 6 sessions on a thread each, 19.4 → 6.3 ms
    ///   (`ane-runtime.md` §11, `2a1ce5e`): 3.08× on 6 tasks.
    /// - `section_us` 5: waking the spinning workers and joining them, a few cache-line
    ///   round trips between cores (assumed).
    /// - `memory_gb_s` 240: the CPU clusters' own reach, below the SoC's 400 GB/s; AnandTech
    ///   measured 224–243 GB/s from the CPU cores of the M1 Max (the same 512-bit LPDDR5 class);
    ///   no M3 Max figure is at hand.
    pub const M3_MAX: HostProfile = HostProfile {
        gflops: 96.0,
        gb_s: 97.0,
        dispatch_us: 117.0,
        element_ns: 0.3,
        soft_convert_ns: 1.5,
        reused_dispatch_us: 20.0,
        cores: 12,
        parallel_efficiency: 0.51,
        section_us: 5.0,
        memory_gb_s: 240.0,
        source: "M3 Max P-core: memcpy traffic (ane-hardware.md §8.7), FMA peak, the §6.4 dispatch profile; \
                 soft conversion calibrated on ane-runtime.md §11 (docs/field-guide.md, 2026-12-06)",
    };
}

/// Dispatch cost constants of one chip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChipProfile {
    /// `--chip` name (`m1`, `m3-max`, …).
    pub name: &'static str,
    /// Fixed cost per dispatch, µs.
    pub fixed_us: f64,
    /// Where the fixed cost comes from.
    pub fixed_source: &'static str,
    /// Effective streaming bandwidth of a dispatch, GB/s (10⁹ bytes per second).
    pub bandwidth_gb_s: f64,
    /// Where the bandwidth comes from.
    pub bandwidth_source: &'static str,
    /// Streaming rate of large weight dispatches in a decode loop, GB/s: the planner's ANE rate.
    /// M3 Max: the least-squares line through the C++ system's per-kernel decode profile of
    /// Qwen3-4B fp16 (`ane-runtime.md` §6.4, commit `4c120d3`: QKV 32 MB in 0.578 ms, O-proj 22 MB
    /// in 0.406 ms, FFN 150 MB in 1.631 ms, LM-head chunk 156 MB in 1.66 ms per dispatch) is
    /// 246 µs + bytes / 109 GB/s (residuals within ±9 %). The emulator's eval-only fit
    /// ([`ChipProfile::bandwidth_gb_s`], 78 GB/s) comes from small kernels and predicts the FFN
    /// 25 % slower than that profile measured it. Other chips: ANEMLL × 109/120.
    pub stream_gb_s: f64,
    /// Fraction of the fp16 byte rate int8 weights stream at ([`INT8_STREAM_EFFICIENCY`]).
    pub int8_efficiency: f64,
    /// The host side of a step.
    pub host: HostProfile,
}

const FIXED_M3_MAX: &str =
    "M3 Max dispatch fit 119 µs (field guide; ane-hardware.md §4.5); no measurement for this chip";
const FIXED_M5: &str = "60–100 µs implied by the M5 QoS sweep (ane-hardware.md §4.5), midpoint";

const fn scaled(name: &'static str, anemll_gb_s: f64, fixed_us: f64, fixed_source: &'static str) -> ChipProfile {
    ChipProfile {
        name,
        fixed_us,
        fixed_source,
        bandwidth_gb_s: anemll_gb_s * FIT_TO_ANEMLL_RATIO,
        stream_gb_s: anemll_gb_s * STREAM_TO_ANEMLL_RATIO,
        bandwidth_source: "ANEMLL-Bench ANE bandwidth (landscape.md §1) × 78/120 (the M3 Max fit-to-ANEMLL ratio)",
        int8_efficiency: INT8_STREAM_EFFICIENCY,
        host: HostProfile::M3_MAX,
    }
}

/// Every profile, by `--chip` name.
pub const CHIPS: [ChipProfile; 13] = [
    scaled("m1", 61.0, 119.0, FIXED_M3_MAX),
    scaled("m1-pro", 55.0, 119.0, FIXED_M3_MAX),
    scaled("m1-max", 55.0, 119.0, FIXED_M3_MAX),
    scaled("m2", 61.0, 119.0, FIXED_M3_MAX),
    scaled("m2-pro", 61.0, 119.0, FIXED_M3_MAX),
    scaled("m2-max", 61.0, 119.0, FIXED_M3_MAX),
    scaled("m3", 63.0, 119.0, FIXED_M3_MAX),
    ChipProfile {
        name: "m3-max",
        fixed_us: 119.0,
        fixed_source: "field-guide dispatch fit, M3 Max, macOS 26.3.1 (ane-hardware.md §4.5)",
        bandwidth_gb_s: 78.0,
        bandwidth_source: "field-guide dispatch fit, M3 Max (ane-hardware.md §4.5)",
        stream_gb_s: 109.0,
        int8_efficiency: INT8_STREAM_EFFICIENCY,
        host: HostProfile::M3_MAX,
    },
    scaled("m4", 64.0, 119.0, FIXED_M3_MAX),
    scaled("m4-pro", 126.0, 119.0, FIXED_M3_MAX),
    scaled("m4-max", 119.0, 119.0, FIXED_M3_MAX),
    scaled("m5", 70.0, 80.0, FIXED_M5),
    scaled("m5-max", 148.0, 80.0, FIXED_M5),
];

impl ChipProfile {
    /// The profile called `name` (case-insensitive, `_` or `-`).
    pub fn by_name(name: &str) -> Option<ChipProfile> {
        let n = name.trim().to_ascii_lowercase().replace('_', "-");
        CHIPS.iter().copied().find(|c| c.name == n)
    }

    /// The M3 Max profile (the one with a measured fit).
    pub fn m3_max() -> ChipProfile {
        CHIPS[7]
    }

    /// Every profile name, comma-separated (for error messages).
    pub fn names() -> String {
        CHIPS.iter().map(|c| c.name).collect::<Vec<_>>().join(", ")
    }

    /// Whether this chip needs every runtime input and output tensor to be a multiple of 128 bytes
    /// (the M5 family; [`crate::Rule::M5Alignment`]).
    pub fn aligns_io_to_128(&self) -> bool {
        self.name.starts_with("m5")
    }

    /// Modelled time of one dispatch moving `bytes` (weights + input and output surfaces), seconds.
    pub fn dispatch_seconds(&self, bytes: u64) -> f64 {
        self.fixed_us * 1e-6 + bytes as f64 / (self.bandwidth_gb_s * 1e9)
    }

    /// The planner's ANE time of one dispatch streaming `weight_bytes` stored in `mode` plus
    /// `io_bytes` of surfaces, seconds: the fixed cost plus the bytes at
    /// [`ChipProfile::stream_gb_s`], int8 weights at [`ChipProfile::int8_efficiency`] of that rate.
    /// The emulator's clock ([`ChipProfile::dispatch_time`]) keeps the eval-only fit.
    pub fn weights_dispatch_seconds(&self, weight_bytes: u64, io_bytes: u64, mode: crate::WeightMode) -> f64 {
        let w = match mode {
            crate::WeightMode::Fp16 => weight_bytes as f64,
            crate::WeightMode::Int8 { .. } => weight_bytes as f64 / self.int8_efficiency.max(1e-3),
        };
        self.fixed_us * 1e-6 + (w + io_bytes as f64) / (self.stream_gb_s * 1e9)
    }

    /// [`ChipProfile::dispatch_seconds`] as a `Duration`.
    pub fn dispatch_time(&self, bytes: u64) -> Duration {
        Duration::from_secs_f64(self.dispatch_seconds(bytes))
    }
}

impl Default for ChipProfile {
    fn default() -> Self {
        ChipProfile::m3_max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m3_max_matches_the_fit_and_primary_checks() {
        let c = ChipProfile::by_name("M3_Max").unwrap();
        assert_eq!(c.name, "m3-max");
        // ane-hardware.md §4.5: const conv 2560×2560 (13.1 MB + 0.33 MB I/O) predicted ~0.29 ms.
        let t = c.dispatch_seconds(13_107_200 + 327_680) * 1e3;
        assert!((t - 0.29).abs() < 0.01, "{t}");
        assert!(ChipProfile::by_name("m9").is_none());
        assert!(CHIPS.iter().all(|c| c.bandwidth_gb_s > 0.0 && c.fixed_us > 0.0));
    }
}
