//! Which vector instructions the CPU kernels use, detected once.
//!
//! [`CpuIsa::detect`] asks the CPU (CPUID, through `std`'s feature detection)
//! when the device is opened (`crate::device`); the answer travels to every
//! op inside [`crate::ops::Ops`], so no kernel probes anything itself. One
//! binary serves every x86-64 machine: the AVX-512 (with and without
//! AVX512_BF16) and AVX2 code paths are compiled in with `#[target_feature]`
//! and only the detected one runs. `--cpu-isa` ([`crate::cpu_tuning`]) may
//! pick a lower one than detected (to compare them, or to pin a fleet to one
//! code path); never a higher one.
//!
//! [`simd_flags`] lists the SIMD features that matter for the CPU path
//! (logged at startup and written beside every CPU benchmark figure).

use std::fmt;
use std::str::FromStr;

/// The instruction set the CPU kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuIsa {
    /// AVX-512F, BW and AVX512_BF16: as [`CpuIsa::Avx512`], and bf16
    /// weights are multiplied natively (`vdpbf16ps`: 32 bf16 products per
    /// instruction, summed in pairs into 16 f32 lanes).
    Avx512Bf16,
    /// AVX-512F (16 f32 lanes, 32 vector registers).
    Avx512,
    /// AVX2 with FMA (8 f32 lanes, 16 vector registers).
    Avx2,
    /// Plain Rust loops the compiler vectorizes for the build's baseline
    /// (SSE2 on x86-64; NEON on aarch64).
    Portable,
}

impl CpuIsa {
    /// The best instruction set this CPU has.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx512bw") && has!("avx512bf16") {
                return Self::Avx512Bf16;
            }
            if has!("avx512f") {
                return Self::Avx512;
            }
            if has!("avx2") && has!("fma") {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Every instruction set this CPU can run, best first (tests run each,
    /// so the fallbacks are tested on the best CPU too).
    pub fn available() -> Vec<Self> {
        let best = Self::detect();
        Self::ALL
            .into_iter()
            .skip_while(|isa| *isa != best)
            .collect()
    }

    /// Every instruction set the kernels are written for, best first.
    pub const ALL: [Self; 4] = [Self::Avx512Bf16, Self::Avx512, Self::Avx2, Self::Portable];

    /// Whether bf16 weights are multiplied natively ([`CpuIsa::Avx512Bf16`]);
    /// everywhere else they are widened to f32 first.
    pub fn native_bf16(self) -> bool {
        self == Self::Avx512Bf16
    }
}

impl FromStr for CpuIsa {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|isa| isa.to_string() == s)
            .ok_or_else(|| {
                let names: Vec<String> = Self::ALL.iter().map(ToString::to_string).collect();
                format!(
                    "--cpu-isa must be auto or one of {}, got {s:?}",
                    names.join(", ")
                )
            })
    }
}

impl fmt::Display for CpuIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Avx512Bf16 => "avx512-bf16",
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Portable => "portable",
        })
    }
}

/// The CPU's SIMD features that matter here, space-separated in `/proc/cpuinfo`
/// spelling (e.g. `avx2 fma avx512f avx512bw avx512vl avx512_bf16`): from
/// `/proc/cpuinfo` where there is one (AMX included), else from `std`'s
/// detection.
pub fn simd_flags() -> String {
    let relevant = |f: &str| {
        ["avx2", "fma", "f16c"].contains(&f) || f.starts_with("avx512") || f.starts_with("amx")
    };
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        if let Some(line) = info.lines().find(|l| l.starts_with("flags")) {
            let flags: Vec<&str> = line
                .split(':')
                .nth(1)
                .unwrap_or("")
                .split_whitespace()
                .filter(|f| relevant(f))
                .collect();
            return flags.join(" ");
        }
    }
    detected_flags()
}

/// [`simd_flags`] without `/proc/cpuinfo` (AMX is not detectable on stable).
fn detected_flags() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let flags = [
            ("avx2", has!("avx2")),
            ("fma", has!("fma")),
            ("avx512f", has!("avx512f")),
            ("avx512bw", has!("avx512bw")),
            ("avx512vl", has!("avx512vl")),
            ("avx512_vnni", has!("avx512vnni")),
            ("avx512_bf16", has!("avx512bf16")),
        ];
        let on: Vec<&str> = flags.iter().filter(|f| f.1).map(|f| f.0).collect();
        on.join(" ")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_detected_isa_comes_first_and_portable_is_always_there() {
        let all = CpuIsa::available();
        assert_eq!(all[0], CpuIsa::detect());
        assert_eq!(all.last(), Some(&CpuIsa::Portable));
    }

    #[test]
    fn avx512_implies_the_flags_it_needs() {
        let flags = simd_flags();
        match CpuIsa::detect() {
            CpuIsa::Avx512 => assert!(flags.contains("avx512f"), "{flags}"),
            CpuIsa::Avx512Bf16 => {
                for f in ["avx512f", "avx512bw", "avx512_bf16"] {
                    assert!(flags.contains(f), "{f} not in {flags}");
                }
            }
            _ => {}
        }
    }

    #[test]
    fn names_parse_back_and_a_bad_one_names_the_flag() {
        for isa in CpuIsa::ALL {
            assert_eq!(isa.to_string().parse::<CpuIsa>(), Ok(isa));
        }
        let err = "sse9".parse::<CpuIsa>().unwrap_err();
        assert!(err.starts_with("--cpu-isa"), "{err}");
        assert!(CpuIsa::Avx512Bf16.native_bf16() && !CpuIsa::Avx512.native_bf16());
    }
}
