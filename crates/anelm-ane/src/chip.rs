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

use std::time::Duration;

/// The ratio of the field guide's dispatch-fit bandwidth to ANEMLL-Bench's CoreML figure on
/// the one chip that has both (M3 Max: 78 / 120).
pub const FIT_TO_ANEMLL_RATIO: f64 = 78.0 / 120.0;

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
        bandwidth_source: "ANEMLL-Bench ANE bandwidth (landscape.md §1) × 78/120 (the M3 Max fit-to-ANEMLL ratio)",
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
