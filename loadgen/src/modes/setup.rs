//! What a benchmark session runs with: [`BenchConfig`], every setting of the
//! plain benchmark as plain data, built once by `cli` after validation (as
//! the server's `SchedulerKnobs` are), and where the servers come from
//! ([`Servers`]). The modes read it and never see a flag; `loadgen compare`
//! gets one per series, `loadgen calibrate` one aimed at its mock.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{ConnConfig, ProgressMode};
use crate::measure::scrape::ScrapeConfig;
use crate::measure::session::Sessions;
use crate::measure::slo::Slo;
use crate::measure::sweep::SweepConfig;
use crate::modes::spawn::SpawnConfig;
use crate::workload::schedule::ArrivalConfig;
use crate::workload::WorkloadConfig;

/// Where the outputs go.
#[derive(Debug, Clone, Default)]
pub struct Outputs {
    /// `--json`.
    pub json: Option<PathBuf>,
    /// `--requests-out`.
    pub requests_out: Option<PathBuf>,
    /// `--report DIR`.
    pub report: Option<PathBuf>,
}

/// Every setting of one benchmark session.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// How to reach the servers.
    pub conn: ConnConfig,
    /// What the requests are.
    pub workload: WorkloadConfig,
    /// When they fire.
    pub arrivals: ArrivalConfig,
    /// `--max-concurrency` (with sessions: sessions at once).
    pub max_concurrency: Option<usize>,
    /// `--turns` above 1: each fired request opens a session.
    pub sessions: Option<Sessions>,
    /// `--warmup-runs`.
    pub warmup_runs: usize,
    /// `--repeat-runs`.
    pub repeat_runs: usize,
    /// `--start-at`: the first run's t0 on the wall clock, Unix seconds.
    pub start_at: Option<f64>,
    /// `--timeout`, per request.
    pub timeout: Duration,
    /// The sweep, if one was asked for.
    pub sweep: SweepConfig,
    /// `--slo`.
    pub slo: Option<Slo>,
    /// `--scrape-metrics`, `--gpu-telemetry`.
    pub scrape: ScrapeConfig,
    /// `--progress`.
    pub progress: ProgressMode,
    /// `--progress-interval-s`.
    pub progress_interval: Duration,
    /// `--json`, `--requests-out`, `--report`.
    pub outputs: Outputs,
    /// Every flag as given or defaulted (the API key redacted): the
    /// outputs' `config`.
    pub flags: serde_json::Value,
}

/// Where the servers of a plain benchmark come from.
#[derive(Debug, Clone)]
pub enum Servers {
    /// These URLs (`--target` / `--base-url`, normalized).
    Given(Vec<String>),
    /// `--spawn-server`: start one and use its address.
    Spawn(SpawnConfig),
}
