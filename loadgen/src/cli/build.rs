//! Validated flags become the settings the layers below read: a
//! `modes::setup::BenchConfig` (and its parts, each defined beside the code
//! that reads it) and where the servers come from. This is the only place
//! that turns a flag into a setting; nothing below `cli` sees a flag.

use std::time::Duration;

use crate::cli::{Args, DEFAULT_NUM_REQUESTS};
use crate::config::Backend;
use crate::error::Error;
use crate::measure::scrape::ScrapeConfig;
use crate::measure::session::Sessions;
use crate::modes::session::Outcome;
use crate::modes::setup::{BenchConfig, Outputs, Servers};
use crate::modes::spawn::SpawnConfig;
use crate::workload::schedule::ArrivalConfig;
use crate::workload::{Sampling, WorkloadConfig};

impl Args {
    /// Checks every value (the error names the flag), then builds the
    /// settings and says where the servers come from.
    pub fn validate(&self) -> Result<(BenchConfig, Servers), Error> {
        self.check()?;
        let servers = if self.spawn_server {
            Servers::Spawn(SpawnConfig {
                server_bin: self.server_bin.clone(),
                server_log: self.server_log.clone(),
                start_timeout_s: self.server_start_timeout,
                server_args: self.server_args.clone(),
            })
        } else {
            Servers::Given(self.conn.urls())
        };
        Ok((self.build()?, servers))
    }

    /// Every check but the targets' (`loadgen calibrate` aims at its own
    /// mock, whose address is known only once it listens), then the
    /// settings.
    pub fn bench_config(&self) -> Result<BenchConfig, Error> {
        self.check_settings()?;
        self.conn.validate_options()?;
        self.build()
    }

    /// Runs the plain benchmark the flags describe.
    pub async fn run(self) -> Result<Outcome, Error> {
        let (config, servers) = self.validate()?;
        crate::modes::run::run(config, servers).await
    }

    /// `--json`, `--requests-out`, `--report`.
    pub fn outputs(&self) -> Outputs {
        Outputs {
            json: self.json.clone(),
            requests_out: self.requests_out.clone(),
            report: self.view.report.clone(),
        }
    }

    /// The settings of validated flags.
    fn build(&self) -> Result<BenchConfig, Error> {
        Ok(BenchConfig {
            conn: self.conn.config(),
            workload: self.workload_config(),
            arrivals: ArrivalConfig {
                arrival: self.arrival,
                submit_schedule: self.submit_schedule,
                submit_interval_ms: self.submit_interval_ms,
                request_rate: self.request_rate,
                burstiness: self.burstiness,
                trace_time_scale: self.trace_time_scale,
                seed: self.seed,
                num_requests: match (self.num_requests, self.shape.duration) {
                    (Some(n), _) => n,
                    (None, Some(_)) => usize::MAX,
                    (None, None) => DEFAULT_NUM_REQUESTS,
                },
                duration: self.shape.duration,
                grace: self.shape.duration_grace,
            },
            max_concurrency: self.max_concurrency,
            sessions: (self.shape.turns > 1).then(|| Sessions {
                turns: self.shape.turns,
                think: Duration::from_secs_f64(self.shape.think_time_ms / 1e3),
            }),
            warmup_runs: self.warmup_runs,
            repeat_runs: self.repeat_runs,
            start_at: self.start_at,
            timeout: Duration::from_secs_f64(self.timeout),
            sweep: self.sweep.config(),
            slo: self.view.slo,
            scrape: ScrapeConfig {
                url: self.observe.scrape_metrics.clone(),
                gpu: self.observe.gpu_telemetry,
                interval: Duration::from_secs_f64(self.observe.scrape_interval_ms / 1e3),
            },
            progress: self.view.progress,
            progress_interval: Duration::from_secs_f64(self.view.progress_interval_s),
            outputs: self.outputs(),
            flags: serde_json::to_value(self)?,
        })
    }

    fn workload_config(&self) -> WorkloadConfig {
        let sampling = (self.temperature.is_some()
            || self.top_k.is_some()
            || self.top_p.is_some()
            || self.min_p.is_some())
        .then_some(Sampling {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: None,
        });
        WorkloadConfig {
            base_prompt: vec![self.prompt.as_str(); self.prompt_repeats].join(" "),
            dataset: self
                .data
                .dataset
                .clone()
                .map(|path| (path, self.data.dataset_format)),
            input_len: self.data.input_len,
            output_len: self.data.output_len,
            // A shared prefix is followed by a unique suffix.
            unique: self.unique_prompts || self.shape.shared_prefix_len.is_some(),
            pretok: self.pretok,
            text_only: self.conn.config().text_only(),
            max_new_tokens: self.max_new_tokens.0,
            stream: self.shape.stream,
            shared_prefix: self
                .shape
                .shared_prefix_len
                .map(|len| (len, self.shape.num_prefixes)),
            turns: self.shape.turns,
            count_prompt_tokens: self.max_new_tokens.0.is_none()
                && self.conn.backend == Backend::Ember,
            ignore_eos: self.no_stop_on_eos,
            sampling,
            seed: self.seed,
            nonce: self.shape.nonce.clone().unwrap_or_else(random_nonce),
        }
    }
}

/// A fresh nonce: six hex digits.
pub(crate) fn random_nonce() -> String {
    format!("{:06x}", rand::random::<u32>() & 0xff_ffff)
}
