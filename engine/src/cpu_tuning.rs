//! [`CpuTuning`]: the knobs of Ember's CPU kernels, in one typed struct (the
//! CPU counterpart of [`crate::tuning::KernelTuning`]).
//!
//! The binaries flatten it into their flags (the `clap` feature derives
//! them: `--cpu-weights` / `EMBER_CPU_WEIGHTS` and `--cpu-isa` /
//! `EMBER_CPU_ISA`, listed in `--help`), the CPU
//! device is opened with it (`crate::device`), and from there it travels to
//! the ops inside [`crate::ops::CpuKernels`]. No kernel reads the
//! environment. On CUDA none of these is read.

use std::fmt;
use std::str::FromStr;

use crate::ops::cpu::isa::CpuIsa;

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

/// `--cpu-isa`: the instruction set the CPU kernels run on: the best this
/// CPU has (`auto`), or a lower one named (to compare the code paths on one
/// machine, or to pin a fleet of mixed CPUs to one). A name this CPU cannot
/// run is refused when the flag is parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsaChoice {
    /// [`CpuIsa::detect`].
    #[default]
    Auto,
    /// This one (available on this CPU when parsed from a flag).
    Fixed(CpuIsa),
}

impl IsaChoice {
    /// The instruction set to run: the named one if this CPU has it, else
    /// (a choice built in code for another CPU) the detected one, so that
    /// no kernel runs instructions the CPU lacks.
    pub fn resolve(self) -> CpuIsa {
        match self {
            Self::Fixed(isa) if CpuIsa::available().contains(&isa) => isa,
            Self::Fixed(isa) => {
                tracing::warn!(requested = %isa, "--cpu-isa: not available on this CPU, detecting");
                CpuIsa::detect()
            }
            Self::Auto => CpuIsa::detect(),
        }
    }
}

impl FromStr for IsaChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        let isa: CpuIsa = s.parse()?;
        let here = CpuIsa::available();
        if !here.contains(&isa) {
            let names: Vec<String> = here.iter().map(ToString::to_string).collect();
            return Err(format!(
                "--cpu-isa {isa}: this CPU cannot run it (it can: auto, {})",
                names.join(", ")
            ));
        }
        Ok(Self::Fixed(isa))
    }
}

impl fmt::Display for IsaChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(isa) => isa.fmt(f),
        }
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
    /// CPU: instruction set of the kernels: auto (the best this CPU has) or
    /// one of avx512-bf16, avx512, avx2, portable that it can run (a lower
    /// one to compare code paths; avx512-bf16 multiplies bf16 weights
    /// natively, the others widen them to f32).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_CPU_ISA",
            default_value = "auto",
            help_heading = "CPU"
        )
    )]
    pub cpu_isa: IsaChoice,
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

    #[test]
    fn isa_choices_parse_resolve_to_what_this_cpu_runs_and_a_bad_one_names_the_flag() {
        assert_eq!("auto".parse::<IsaChoice>(), Ok(IsaChoice::Auto));
        assert_eq!(IsaChoice::Auto.resolve(), CpuIsa::detect());
        for isa in CpuIsa::available() {
            let choice: IsaChoice = isa.to_string().parse().unwrap();
            assert_eq!(choice, IsaChoice::Fixed(isa));
            assert_eq!(choice.resolve(), isa);
            assert_eq!(choice.to_string(), isa.to_string());
        }
        // One this CPU lacks (if any) is refused at parsing, and resolves to
        // the detected one when built in code.
        if let Some(&missing) = CpuIsa::ALL
            .iter()
            .find(|i| !CpuIsa::available().contains(i))
        {
            let err = missing.to_string().parse::<IsaChoice>().unwrap_err();
            assert!(err.starts_with("--cpu-isa"), "{err}");
            assert_eq!(IsaChoice::Fixed(missing).resolve(), CpuIsa::detect());
        }
        let err = "avx1024".parse::<IsaChoice>().unwrap_err();
        assert!(err.starts_with("--cpu-isa"), "{err}");
    }
}
