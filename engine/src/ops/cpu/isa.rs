//! Which vector instructions the CPU kernels use, detected once.
//!
//! [`CpuIsa::detect`] asks the CPU (CPUID, through `std`'s feature detection)
//! when the device is opened (`crate::device`); the answer travels to every
//! op inside [`crate::ops::Ops`], so no kernel probes anything itself. One
//! binary serves every x86-64 machine: the AVX-512 and AVX2 code paths are
//! compiled in with `#[target_feature]` and only the detected one runs.
//!
//! [`simd_flags`] lists the SIMD features that matter for the CPU path
//! (logged at startup and written beside every CPU benchmark figure).

use std::fmt;

/// The instruction set the CPU kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuIsa {
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
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Self::Avx2;
            }
        }
        Self::Portable
    }

    /// Every instruction set this CPU can run, best first (tests run each).
    pub fn available() -> Vec<Self> {
        let best = Self::detect();
        [Self::Avx512, Self::Avx2, Self::Portable]
            .into_iter()
            .skip_while(|isa| *isa != best)
            .collect()
    }
}

impl fmt::Display for CpuIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
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
        if CpuIsa::detect() == CpuIsa::Avx512 {
            assert!(simd_flags().contains("avx512f"), "{}", simd_flags());
        }
    }
}
