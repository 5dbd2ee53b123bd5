//! The flag groups added to [`Args`](crate::cli::Args) with `flatten`: the
//! workload's data source, sweeps, and the outputs people look at (SLOs, the
//! live view, the HTML report). Each group validates itself, naming the flag.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use serde::Serialize;

use crate::config::{ProgressMode, SweepMode};
use crate::error::Error;
use crate::measure::slo::Slo;
use crate::measure::sweep::SweepConfig;
use crate::workload::dataset::DatasetFormat;
use crate::workload::lengths::LenDist;

/// Where prompts and output lengths come from.
#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct DataArgs {
    /// Prompts from this file (see --dataset-format); request i uses entry
    /// i % entries. JSONL lines have `prompt`, `prompt_token_ids` or
    /// `input_length`, optional `max_new_tokens` and `timestamp` (ms, for
    /// --arrival trace).
    #[arg(long, env = "LOADGEN_DATASET", value_name = "PATH")]
    pub dataset: Option<PathBuf>,

    /// Format of --dataset: jsonl (one object per line) or sharegpt (a JSON
    /// array of conversations; the first human turn is the prompt).
    #[arg(long, env = "LOADGEN_DATASET_FORMAT", value_enum, default_value_t = DatasetFormat::Jsonl)]
    pub dataset_format: DatasetFormat,

    /// Synthetic prompts of this many random token ids, drawn per request:
    /// N, fixed:N, uniform:LO..HI or normal:MEAN,STDEV (seeded by --seed).
    #[arg(long, env = "LOADGEN_INPUT_LEN", value_name = "DIST")]
    pub input_len: Option<LenDist>,

    /// max_new_tokens drawn per request from this distribution (same syntax as
    /// --input-len); a dataset entry's own max_new_tokens wins.
    #[arg(long, env = "LOADGEN_OUTPUT_LEN", value_name = "DIST")]
    pub output_len: Option<LenDist>,
}

impl DataArgs {
    /// Rejects combinations that would silently ignore a flag.
    pub fn validate(&self) -> Result<(), Error> {
        if self.dataset.is_some() && self.input_len.is_some() {
            return Err(Error::invalid(
                "--input-len",
                "cannot be combined with --dataset (the file sets the prompts)",
            ));
        }
        Ok(())
    }
}

/// Runs at several request rates, one report row each.
#[derive(Debug, Clone, Default, ClapArgs, Serialize)]
pub struct SweepArgs {
    /// Run once at each of these request rates (req/s), e.g. 2,4,8; the
    /// arrival process is --arrival (fixed gaps of 1/R, poisson or gamma).
    #[arg(
        long,
        env = "LOADGEN_SWEEP_RATES",
        value_delimiter = ',',
        value_name = "R,..."
    )]
    pub sweep_rates: Vec<f64>,

    /// auto: measure the concurrency-1 baseline and the saturation
    /// throughput, then sweep --sweep-steps rates between them.
    #[arg(long, env = "LOADGEN_SWEEP", value_enum, value_name = "MODE")]
    pub sweep: Option<SweepMode>,

    /// Rates between baseline and saturation for --sweep auto.
    #[arg(
        long,
        env = "LOADGEN_SWEEP_STEPS",
        default_value_t = 4,
        value_name = "N"
    )]
    pub sweep_steps: usize,

    /// With --slo: after the sweep, bisect this many more rates between the
    /// highest rate that met the SLOs and the lowest that did not.
    #[arg(
        long,
        env = "LOADGEN_SWEEP_SEARCH_STEPS",
        default_value_t = 2,
        value_name = "N"
    )]
    pub sweep_search_steps: usize,

    /// A rate "meets the SLOs" when at least this share of its requests is
    /// good (0..1].
    #[arg(
        long,
        env = "LOADGEN_SLO_MIN_SHARE",
        default_value_t = 0.9,
        value_name = "F"
    )]
    pub slo_min_share: f64,

    /// Stop a run early when the client is the bottleneck: the submit lag p99
    /// exceeds this (checked from 50 submissions on). Default: off for plain
    /// runs, 50 ms in sweeps.
    #[arg(long, env = "LOADGEN_MAX_SUBMIT_LAG_MS", value_name = "MS")]
    pub max_submit_lag_ms: Option<f64>,
}

impl SweepArgs {
    /// Whether a sweep was asked for.
    pub fn active(&self) -> bool {
        self.sweep.is_some() || !self.sweep_rates.is_empty()
    }

    /// The settings the sweep driver reads.
    pub fn config(&self) -> SweepConfig {
        SweepConfig {
            mode: self.sweep,
            rates: self.sweep_rates.clone(),
            steps: self.sweep_steps,
            search_steps: self.sweep_search_steps,
            slo_min_share: self.slo_min_share,
            max_submit_lag_ms: self.max_submit_lag_ms,
        }
    }

    /// Validates the sweep flags on their own.
    pub fn validate(&self) -> Result<(), Error> {
        if self.sweep.is_some() && !self.sweep_rates.is_empty() {
            return Err(Error::invalid(
                "--sweep",
                "give either --sweep auto or --sweep-rates",
            ));
        }
        if let Some(r) = self
            .sweep_rates
            .iter()
            .find(|r| !(r.is_finite() && **r > 0.0))
        {
            return Err(Error::invalid(
                "--sweep-rates",
                format!("every rate must be > 0 (got {r})"),
            ));
        }
        if self.sweep.is_some() && self.sweep_steps == 0 {
            return Err(Error::invalid("--sweep-steps", "must be >= 1 (got 0)"));
        }
        if !(self.slo_min_share > 0.0 && self.slo_min_share <= 1.0) {
            return Err(Error::invalid(
                "--slo-min-share",
                format!("must be in (0, 1] (got {})", self.slo_min_share),
            ));
        }
        if let Some(ms) = self.max_submit_lag_ms {
            if !(ms.is_finite() && ms > 0.0) {
                return Err(Error::invalid(
                    "--max-submit-lag-ms",
                    format!("must be > 0 (got {ms})"),
                ));
            }
        }
        Ok(())
    }
}

/// What people look at: goodput, the live view, the HTML report.
#[derive(Debug, Clone, ClapArgs, Serialize)]
pub struct ViewArgs {
    /// Service-level objectives, any subset: ttft=200ms,tpot=50ms,e2e=5s
    /// (units us, ms, s). A request is good if it finished OK within all of
    /// them; goodput (req/s and share) is reported next to throughput.
    #[arg(long, env = "LOADGEN_SLO", value_name = "OBJECTIVES")]
    pub slo: Option<Slo>,

    /// Write a self-contained HTML report (charts inlined) and the SVG charts
    /// into this directory (created if missing).
    #[arg(long, env = "LOADGEN_REPORT", value_name = "DIR")]
    pub report: Option<PathBuf>,

    /// Live view on stderr: auto (a bar on a terminal, else a status line
    /// every --progress-interval-s), bar, line or off.
    #[arg(long, env = "LOADGEN_PROGRESS", value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,

    /// Seconds between status lines when stderr is not a terminal.
    #[arg(
        long,
        env = "LOADGEN_PROGRESS_INTERVAL_S",
        default_value_t = 10.0,
        value_name = "SECS"
    )]
    pub progress_interval_s: f64,
}

impl ViewArgs {
    /// Validates the view flags.
    pub fn validate(&self) -> Result<(), Error> {
        if !(self.progress_interval_s.is_finite() && self.progress_interval_s > 0.0) {
            return Err(Error::invalid(
                "--progress-interval-s",
                format!("must be > 0 (got {})", self.progress_interval_s),
            ));
        }
        Ok(())
    }
}
