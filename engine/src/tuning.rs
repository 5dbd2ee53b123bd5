//! [`KernelTuning`]: every knob of Ember's CUDA kernels, in one typed struct.
//!
//! The binaries build it once from their validated flags (each knob is a
//! `--flag` with an `EMBER_*` environment alias, listed in `--help`; the
//! `clap` feature derives the flags from this struct, so there is one
//! definition), the device setup logs it and hands it to [`crate::ops::Ops`],
//! and from there it is passed down to every launch that needs it. No kernel
//! reads the environment.
//!
//! The defaults are the fastest measured on an H100 and an H200
//! (docs/performance.md); `0` in a count knob means "chosen from the shape".
//! On the CPU none of these is read.

use std::fmt;

/// The CUDA kernels' knobs (see the module docs). `Default` is what the
/// server runs with when no flag is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct KernelTuning {
    /// CUDA: most rows a projection sends through Ember's decode kernels (the
    /// GEMV, then the tensor-core kernel from --mma-min-rows) instead of the
    /// general matmul; 0 sends every projection to the matmul.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_GEMV_MAX_ROWS",
            default_value_t = 256,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub gemv_max_rows: usize,

    /// CUDA: the same cap for the LM head (never above --gemv-max-rows).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_LM_HEAD_GEMV_MAX_ROWS",
            default_value_t = 8,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub lm_head_gemv_max_rows: usize,

    /// CUDA: fewest rows (at least 16) a projection takes to the tensor-core
    /// kernel instead of the GEMV.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_MMA_MIN_ROWS",
            default_value_t = 16,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub mma_min_rows: usize,

    /// CUDA: warps per cube of the tensor-core projection: 8, 16 or 32; 0 =
    /// 16 up to 64 rows, 8 above.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_MMA_WARPS",
            default_value_t = 0,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub mma_warps: usize,

    /// CUDA: most 16-row tiles one cube of the tensor-core projection takes
    /// (1, 2 or 4).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_MMA_ROW_TILES",
            default_value_t = 4,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub mma_row_tiles: usize,

    /// CUDA: cubes that share one sequence's context in decode attention
    /// (1 to 64; 1 turns splitting off); 0 = enough for about two cubes per
    /// SM, at most 16.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_ATTENTION_SPLITS",
            default_value_t = 0,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub attention_splits: usize,

    /// CUDA: prefill attention on Ember's causal tensor-core kernel (true) or
    /// on Burn's flash kernel with a mask (false).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_PREFILL_ATTENTION",
            default_value_t = true,
            action = clap::ArgAction::Set,
            value_parser = parse_switch,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub prefill_attention: bool,

    /// CUDA: let projections run on cuBLASLt where the warmup measures it
    /// faster than Ember's kernels (and for every shape they do not cover);
    /// false keeps every projection on CubeCL (Ember's kernels and CubeCL's
    /// matmul). Without libcublasLt this is off, with a warning.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_CUBLASLT",
            default_value_t = true,
            action = clap::ArgAction::Set,
            value_parser = parse_switch,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub cublaslt: bool,

    /// CUDA: sample every row with Ember's sampling kernel, inside the step
    /// (true), or send every sampled row through the host sampler (false:
    /// the spec the kernel is checked against, for comparison and debugging).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_DEVICE_SAMPLER",
            default_value_t = true,
            action = clap::ArgAction::Set,
            value_parser = parse_switch,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub device_sampler: bool,

    /// CUDA: keep a decoding sequence's penalty counts on the device, where
    /// the sampling kernel reads them (true), or apply penalties as host
    /// edits of the logits (false: for comparison). Needs --device-sampler.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            env = "EMBER_DEVICE_PENALTIES",
            default_value_t = true,
            action = clap::ArgAction::Set,
            value_parser = parse_switch,
            help_heading = "Kernel tuning (CUDA)"
        )
    )]
    pub device_penalties: bool,
}

impl Default for KernelTuning {
    fn default() -> Self {
        Self {
            gemv_max_rows: 256,
            lm_head_gemv_max_rows: 8,
            mma_min_rows: 16,
            mma_warps: 0,
            mma_row_tiles: 4,
            attention_splits: 0,
            prefill_attention: true,
            cublaslt: true,
            device_sampler: true,
            device_penalties: true,
        }
    }
}

/// A knob with a value the kernels cannot take; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag} {message}")]
pub struct TuningError {
    pub flag: &'static str,
    pub message: String,
}

impl KernelTuning {
    /// Checks every knob against what the kernels accept.
    pub fn validate(self) -> Result<Self, TuningError> {
        let bad = |flag, message: &str| {
            Err(TuningError {
                flag,
                message: message.to_string(),
            })
        };
        if self.mma_min_rows < 16 {
            return bad(
                "mma-min-rows",
                &format!("must be at least 16, got {}", self.mma_min_rows),
            );
        }
        if !matches!(self.mma_warps, 0 | 8 | 16 | 32) {
            return bad(
                "mma-warps",
                &format!("must be 0 (auto), 8, 16 or 32, got {}", self.mma_warps),
            );
        }
        if !matches!(self.mma_row_tiles, 1 | 2 | 4) {
            return bad(
                "mma-row-tiles",
                &format!("must be 1, 2 or 4, got {}", self.mma_row_tiles),
            );
        }
        if self.attention_splits > 64 {
            return bad(
                "attention-splits",
                &format!("must be 0 (auto) to 64, got {}", self.attention_splits),
            );
        }
        Ok(self)
    }

    /// Most rows the LM head sends through the GEMV (never above
    /// [`KernelTuning::gemv_max_rows`]).
    pub fn lm_head_rows(&self) -> usize {
        self.lm_head_gemv_max_rows.min(self.gemv_max_rows)
    }
}

impl fmt::Display for KernelTuning {
    /// One line for the startup log: `flag=value` pairs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auto = |v: usize| match v {
            0 => "auto".to_string(),
            v => v.to_string(),
        };
        write!(
            f,
            "gemv-max-rows={} lm-head-gemv-max-rows={} mma-min-rows={} mma-warps={} \
             mma-row-tiles={} attention-splits={} prefill-attention={} cublaslt={} \
             device-sampler={} device-penalties={}",
            self.gemv_max_rows,
            self.lm_head_gemv_max_rows,
            self.mma_min_rows,
            auto(self.mma_warps),
            self.mma_row_tiles,
            auto(self.attention_splits),
            self.prefill_attention,
            self.cublaslt,
            self.device_sampler,
            self.device_penalties
        )
    }
}

/// `true`/`false`, also as `1`/`0` (the environment variable's old form).
#[cfg(feature = "clap")]
fn parse_switch(s: &str) -> Result<bool, String> {
    match s {
        "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        other => Err(format!("expected true or false (or 1/0), got {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_match_the_documented_values() {
        let t = KernelTuning::default().validate().unwrap();
        assert_eq!(t.gemv_max_rows, 256);
        assert_eq!(t.lm_head_rows(), 8);
        assert!(t.prefill_attention);
        assert_eq!(
            t.to_string(),
            "gemv-max-rows=256 lm-head-gemv-max-rows=8 mma-min-rows=16 mma-warps=auto \
             mma-row-tiles=4 attention-splits=auto prefill-attention=true cublaslt=true \
             device-sampler=true device-penalties=true"
        );
    }

    #[test]
    fn a_bad_knob_names_its_flag() {
        let cases = [
            (
                KernelTuning {
                    mma_min_rows: 8,
                    ..Default::default()
                },
                "--mma-min-rows",
            ),
            (
                KernelTuning {
                    mma_warps: 12,
                    ..Default::default()
                },
                "--mma-warps",
            ),
            (
                KernelTuning {
                    mma_row_tiles: 3,
                    ..Default::default()
                },
                "--mma-row-tiles",
            ),
            (
                KernelTuning {
                    attention_splits: 65,
                    ..Default::default()
                },
                "--attention-splits",
            ),
        ];
        for (tuning, flag) in cases {
            let err = tuning.validate().unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
        }
    }

    #[test]
    fn the_lm_head_cap_never_exceeds_the_projection_cap() {
        let t = KernelTuning {
            gemv_max_rows: 4,
            lm_head_gemv_max_rows: 8,
            ..Default::default()
        };
        assert_eq!(t.lm_head_rows(), 4);
    }
}
