//! [`CpuTuning`]: the knobs of Ember's CPU kernels, in one typed struct (the
//! CPU counterpart of [`crate::tuning::KernelTuning`]).
//!
//! The binaries flatten it into their flags (the `clap` feature derives
//! them: `--cpu-weights` / `EMBER_CPU_WEIGHTS`, listed in `--help`), the CPU
//! device is opened with it (`crate::device`), and from there it travels to
//! the ops inside [`crate::ops::CpuKernels`]. No kernel reads the
//! environment. On CUDA none of these is read.

use std::fmt;
use std::str::FromStr;

/// How the CPU stores the weight matrices a decode step streams (every
/// projection and the tied embedding / LM head).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuWeights {
    /// f32, as loaded (the default; the reference check holds it to 1e-4).
    #[default]
    F32,
    /// bfloat16 (the top half of each f32, rounded to nearest even): half
    /// the bytes to read per step; the kernels widen each weight back to f32
    /// exactly and accumulate in f32, so only the weights are rounded.
    /// Activations, the KV cache and LayerNorm stay f32.
    Bf16,
}

impl CpuWeights {
    /// Bytes of one weight element.
    pub fn bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 2,
        }
    }
}

impl FromStr for CpuWeights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            other => Err(format!("--cpu-weights must be f32 or bf16, got {other:?}")),
        }
    }
}

impl fmt::Display for CpuWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        })
    }
}

/// The CPU kernels' knobs (see the module docs). `Default` is what the
/// server runs with when no flag is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct CpuTuning {
    /// CPU: weight format of the projections and the LM head: f32 (exact) or
    /// bf16 (half the bytes a decode step reads; products accumulate in f32,
    /// the weights are rounded: docs/performance.md gives the error).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_CPU_WEIGHTS",
            default_value = "f32",
            help_heading = "CPU"
        )
    )]
    pub cpu_weights: CpuWeights,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_print_and_a_bad_one_names_the_flag() {
        for w in [CpuWeights::F32, CpuWeights::Bf16] {
            assert_eq!(w.to_string().parse::<CpuWeights>(), Ok(w));
        }
        assert_eq!(CpuTuning::default().cpu_weights, CpuWeights::F32);
        let err = "fp8".parse::<CpuWeights>().unwrap_err();
        assert!(err.starts_with("--cpu-weights"), "{err}");
        assert_eq!(CpuWeights::Bf16.bytes(), 2);
    }
}
