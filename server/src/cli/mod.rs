//! `ember-server`'s flags and their validation.
//!
//! Every flag has a long name, an `EMBER_*` environment variable and a doc
//! comment that becomes `--help`. [`Args::validate`] turns the raw flags into a
//! [`ServerConfig`] or fails fast with an error that names the flag, so a bad
//! value stops the process before anything is loaded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ember_engine::model::{ModelSource, Preset};
use ember_engine::{
    CpuTuning, DeviceOptions, DeviceSpec, EngineConfig, KernelTuning, PrefillBounds,
};

mod capacity;
mod flag_error;

pub use capacity::{CapacityArgs, PolicyFlag};
pub use flag_error::FlagError;

use crate::logging::LogFormat;
use crate::scheduler::SchedulerKnobs;
use crate::service::doors::{DoorArgs, DoorConfig};
use flag_error::positive;

/// Ember: a continuous-batching GPT-2 inference server (gRPC, streaming).
#[derive(Debug, Clone, Parser)]
#[command(name = "ember-server", version, about, long_about = None, allow_negative_numbers = true)]
pub struct Args {
    /// Address to serve gRPC on. Port 0 picks a free port; the bound address is
    /// printed as the first stdout line: `listening on <ip:port>`.
    #[arg(long, env = "EMBER_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Where the model runs: cpu, cuda (= cuda:0), cuda:N, or auto: cuda:0 if
    /// this binary has CUDA and a test kernel runs there, else the CPU with a
    /// warning giving the reason (a CPU-only build: the CPU).
    #[arg(long, env = "EMBER_DEVICE", default_value = "auto")]
    pub device: String,

    /// A HuggingFace GPT-2 directory (config.json, model.safetensors, optionally
    /// tokenizer.json or vocab.json + merges.txt). Overrides --preset.
    #[arg(long, env = "EMBER_MODEL_DIR")]
    pub model_dir: Option<PathBuf>,

    /// Built-in architecture with seeded random weights, used without
    /// --model-dir: gpt2 (124M) or tiny (2 layers, 4 heads, 128 wide; for tests).
    #[arg(long, env = "EMBER_PRESET", default_value = "gpt2")]
    pub preset: String,

    /// Seed of the random weights (presets) and of requests that set no seed.
    #[arg(long, env = "EMBER_SEED", default_value_t = 0)]
    pub seed: u64,

    /// Decode batch knob: most sequences in one decode step.
    #[arg(long, env = "EMBER_MAX_BATCH_SIZE", default_value_t = 32)]
    pub max_batch_size: usize,

    /// Prefill batch knob: most requests admitted into one batched prefill.
    /// Default: --max-batch-size.
    #[arg(long, env = "EMBER_PREFILL_MAX_BATCH_SIZE")]
    pub prefill_max_batch_size: Option<usize>,

    /// Most prompt tokens computed in one scheduler iteration's prefill step. A
    /// longer prompt is prefilled in chunks of at most this many tokens over
    /// several iterations, each followed by a decode step of the running
    /// requests (lower: smoother inter-token latency while long prompts
    /// arrive; higher: faster time to first token for them).
    #[arg(long, env = "EMBER_PREFILL_MAX_TOKENS", default_value_t = 8192)]
    pub prefill_max_tokens: usize,

    /// Most requests waiting for admission; beyond it new requests get
    /// RESOURCE_EXHAUSTED at once.
    #[arg(long, env = "EMBER_MAX_PENDING", default_value_t = 1024)]
    pub max_pending: usize,

    /// Largest max_new_tokens a request may ask for.
    #[arg(long, env = "EMBER_MAX_NEW_TOKENS_LIMIT", default_value_t = 1024)]
    pub max_new_tokens_limit: usize,

    /// Tokens per KV cache block.
    #[arg(long, env = "EMBER_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: usize,

    /// On SIGTERM/SIGINT: seconds to let running and queued requests finish
    /// before the rest are cancelled.
    #[arg(long, env = "EMBER_SHUTDOWN_TIMEOUT", default_value_t = 30.0)]
    pub shutdown_timeout: f64,

    /// Serve Prometheus metrics on this port (HTTP /metrics, same IP as
    /// --listen). Off when not given.
    #[arg(long, env = "EMBER_METRICS_PORT")]
    pub metrics_port: Option<u16>,

    /// Turn the prefix cache off: by default full KV blocks are kept,
    /// addressed by their content and whole prefix, and a request sharing a
    /// prefix with an earlier one reuses them instead of recomputing them.
    #[arg(long, env = "EMBER_NO_PREFIX_CACHE")]
    pub no_prefix_cache: bool,

    /// Skip the startup warmup (health turns SERVING right after loading).
    /// Decode steps are captured as CUDA graphs at the end of the warmup, so
    /// this also runs every decode step eager.
    #[arg(long, env = "EMBER_NO_WARMUP")]
    pub no_warmup: bool,

    /// CUDA only: run every step eager instead of replaying the CUDA graph
    /// captured at warmup for each decode bucket and each prefill shape of up
    /// to 4,096 tokens (for comparison and debugging; vLLM's `--enforce-eager`).
    #[arg(long, env = "EMBER_NO_CUDA_GRAPHS")]
    pub no_cuda_graphs: bool,

    /// Run each decode step to the end before planning the next. By default
    /// the scheduler queues step N+1 on the device before it reads step N's
    /// tokens, so its own work (streaming, planning, the next step's inputs)
    /// overlaps the GPU's (vLLM's --async-scheduling); a request that ends
    /// at step N costs one wasted row in step N+1, never an extra token.
    #[arg(long, env = "EMBER_NO_ASYNC_SCHEDULING")]
    pub no_async_scheduling: bool,

    /// CUDA only: where CubeCL keeps autotune results and compiled kernels, so a
    /// restart does not tune and compile again. Each GPU model, driver and
    /// NVRTC version gets its own subdirectory, so a cache made on another GPU
    /// is never used. Default: $XDG_CACHE_HOME/ember/kernels (or
    /// ~/.cache/ember/kernels).
    #[arg(long, env = "EMBER_KERNEL_CACHE_DIR")]
    pub kernel_cache_dir: Option<PathBuf>,

    /// Fill --kernel-cache-dir and exit: load the model, run the whole warmup
    /// (every kernel compiled, every shape tuned, the graphs captured), print
    /// a summary and exit 0, serving nothing. Run it once per GPU model (an
    /// image build step on a GPU host, or a Kubernetes init container) so
    /// servers start from a warm cache.
    #[arg(long, env = "EMBER_PREPARE_CACHE")]
    pub prepare_cache: bool,

    /// Log line format on stderr: text (colours only on a terminal) or json
    /// (one object per line). RUST_LOG sets the level (default info).
    #[arg(long, env = "EMBER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The CUDA kernels' knobs (defaults: the fastest measured; see
    /// docs/performance.md).
    #[command(flatten)]
    pub tuning: KernelTuning,

    /// The front doors' flags: --http-listen, --served-model-name, TLS, API
    /// keys (`service::doors`).
    #[command(flatten)]
    pub doors: DoorArgs,

    /// The CPU kernels' knobs.
    #[command(flatten)]
    pub cpu: CpuTuning,

    /// The KV cache's size and the scheduling policy.
    #[command(flatten)]
    pub capacity: CapacityArgs,
}

/// Validated startup configuration: what each layer is built from.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub device: DeviceSpec,
    /// The kernel cache and the kernel knobs (CUDA and CPU).
    pub device_options: DeviceOptions,
    /// The engine (model, KV cache, step bounds, graphs), whole.
    pub engine: EngineConfig,
    pub knobs: SchedulerKnobs,
    pub seed: u64,
    pub shutdown_timeout: Duration,
    pub metrics_addr: Option<SocketAddr>,
    pub warmup: bool,
    /// The front doors: HTTP, the served name, TLS, API keys.
    pub doors: DoorConfig,
    /// `--prepare-cache`: warm up into the kernel cache, then exit.
    pub prepare_cache: bool,
}

impl Args {
    pub fn validate(self) -> Result<ServerConfig, FlagError> {
        let device = self.device.parse::<DeviceSpec>().map_err(FlagError)?;
        let model = self.model_source()?;
        let max_batch_size = positive("max-batch-size", self.max_batch_size)?;
        let prefill_max_batch_size = positive(
            "prefill-max-batch-size",
            self.prefill_max_batch_size.unwrap_or(max_batch_size),
        )?;
        let knobs = SchedulerKnobs {
            max_batch_size,
            prefill_max_batch_size,
            prefill_max_tokens: positive("prefill-max-tokens", self.prefill_max_tokens)?,
            max_pending: positive("max-pending", self.max_pending)?,
            max_new_tokens_limit: positive("max-new-tokens-limit", self.max_new_tokens_limit)?,
            policy: self.capacity.policy()?,
            async_scheduling: !self.no_async_scheduling,
        };
        let engine = EngineConfig {
            model,
            block_size: positive("block-size", self.block_size)?,
            kv: self.capacity.kv_budget()?,
            max_sequences: knobs.max_running(),
            max_batch: max_batch_size,
            prefill: PrefillBounds {
                max_rows: knobs.prefill_max_batch_size,
                max_tokens: knobs.prefill_max_tokens,
            },
            prefix_caching: !self.no_prefix_cache,
            cuda_graphs: !self.no_cuda_graphs,
            bucketed: None,
        };
        let tuning = self
            .tuning
            .validate()
            .map_err(|e| FlagError(e.to_string()))?;
        if !(self.shutdown_timeout.is_finite() && self.shutdown_timeout >= 0.0) {
            return Err(FlagError(format!(
                "--shutdown-timeout must be a non-negative number of seconds, got {}",
                self.shutdown_timeout
            )));
        }
        let doors = self.doors.validate().map_err(FlagError)?;
        let metrics_addr = match self.metrics_port {
            Some(0) => return Err(FlagError("--metrics-port must be positive, got 0".into())),
            Some(port) => Some(SocketAddr::new(self.listen.ip(), port)),
            None => None,
        };
        if self.prepare_cache && self.no_warmup {
            return Err(FlagError(
                "--prepare-cache runs the warmup; it cannot be combined with --no-warmup".into(),
            ));
        }
        let kernel_cache_dir = kernel_cache_dir(self.kernel_cache_dir)?;
        Ok(ServerConfig {
            listen: self.listen,
            device,
            device_options: DeviceOptions {
                kernel_cache_dir,
                tuning,
                cpu: self.cpu,
            },
            engine,
            knobs,
            seed: self.seed,
            shutdown_timeout: Duration::from_secs_f64(self.shutdown_timeout),
            metrics_addr,
            warmup: !self.no_warmup,
            doors,
            prepare_cache: self.prepare_cache,
        })
    }

    /// `--model-dir` (an existing directory), else `--preset` with `--seed`.
    fn model_source(&self) -> Result<ModelSource, FlagError> {
        match &self.model_dir {
            Some(dir) if !dir.is_dir() => Err(FlagError(format!(
                "--model-dir {} is not a directory",
                dir.display()
            ))),
            Some(dir) => Ok(ModelSource::Dir(dir.clone())),
            None => Ok(ModelSource::Preset {
                preset: self.preset.parse::<Preset>().map_err(|_| {
                    FlagError(format!(
                        "--preset must be gpt2 or tiny, got {:?}",
                        self.preset
                    ))
                })?,
                seed: self.seed,
            }),
        }
    }
}

/// `--kernel-cache-dir` (not empty), else the default under the user's cache.
fn kernel_cache_dir(
    flag: Option<std::path::PathBuf>,
) -> Result<Option<std::path::PathBuf>, FlagError> {
    match flag {
        Some(dir) if dir.as_os_str().is_empty() => {
            Err(FlagError("--kernel-cache-dir must not be empty".into()))
        }
        Some(dir) => Ok(Some(dir)),
        None => Ok(ember_engine::device::default_kernel_cache_dir()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServerConfig, FlagError> {
        let mut full = vec!["ember-server"];
        full.extend_from_slice(args);
        Args::try_parse_from(full).expect("clap parses").validate()
    }

    #[test]
    fn defaults_are_valid() {
        let cfg = parse(&[]).unwrap();
        assert_eq!(cfg.knobs.prefill_max_batch_size, cfg.knobs.max_batch_size);
        assert_eq!(cfg.device, DeviceSpec::Auto);
        assert!(cfg.warmup);
        assert!(cfg.engine.prefix_caching);
        assert!(!parse(&["--no-prefix-cache"]).unwrap().engine.prefix_caching);
        assert_eq!(cfg.device_options.tuning, KernelTuning::default());
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (
                &["--prefill-max-batch-size", "0"][..],
                "--prefill-max-batch-size must be positive",
            ),
            (
                &["--max-batch-size", "0"][..],
                "--max-batch-size must be positive",
            ),
            (&["--block-size", "0"][..], "--block-size"),
            (&["--max-pending", "0"][..], "--max-pending"),
            (&["--kv-blocks", "0"][..], "--kv-blocks"),
            (&["--device", "tpu"][..], "--device"),
            (&["--device", "cuda:x"][..], "--device"),
            (&["--preset", "huge"][..], "--preset"),
            (&["--shutdown-timeout", "-1"][..], "--shutdown-timeout"),
            (&["--metrics-port", "0"][..], "--metrics-port"),
            (&["--model-dir", "/nonexistent/dir"][..], "--model-dir"),
            (&["--mma-warps", "12"][..], "--mma-warps"),
            (&["--attention-splits", "65"][..], "--attention-splits"),
            (&["--prepare-cache", "--no-warmup"][..], "--prepare-cache"),
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }

    #[test]
    fn cpu_weights_is_f32_or_bf16_and_a_bad_one_names_the_flag() {
        assert_eq!(
            parse(&[]).unwrap().device_options.cpu.cpu_weights,
            ember_engine::CpuWeights::F32
        );
        let cfg = parse(&["--cpu-weights", "bf16"]).unwrap();
        assert_eq!(
            cfg.device_options.cpu.cpu_weights,
            ember_engine::CpuWeights::Bf16
        );
        let mut full = vec!["ember-server", "--cpu-weights", "int4"];
        let err = Args::try_parse_from(full.drain(..))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--cpu-weights"), "{err}");
        let help = <Args as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        assert!(help.contains("EMBER_CPU_WEIGHTS"), "--help lacks it");
    }

    #[test]
    fn log_format_is_text_or_json_and_a_bad_one_names_the_flag() {
        let format = |args: &[&str]| {
            let mut full = vec!["ember-server"];
            full.extend_from_slice(args);
            Args::try_parse_from(full).map(|a| a.log_format)
        };
        assert_eq!(format(&[]).unwrap(), LogFormat::Text);
        assert_eq!(format(&["--log-format", "json"]).unwrap(), LogFormat::Json);
        assert_eq!(format(&["--log-format", "text"]).unwrap(), LogFormat::Text);
        let err = format(&["--log-format", "xml"]).unwrap_err().to_string();
        assert!(err.contains("--log-format"), "{err}");
        assert!(err.contains("json"), "lists the choices: {err}");
    }

    #[test]
    fn kernel_knobs_are_flags_with_env_aliases() {
        let cfg = parse(&["--gemv-max-rows", "0", "--prefill-attention", "false"]).unwrap();
        assert_eq!(cfg.device_options.tuning.gemv_max_rows, 0);
        assert!(!cfg.device_options.tuning.prefill_attention);
        let help = <Args as clap::CommandFactory>::command()
            .render_long_help()
            .to_string();
        for flag in [
            "--gemv-max-rows",
            "--lm-head-gemv-max-rows",
            "--mma-min-rows",
            "--mma-warps",
            "--mma-row-tiles",
            "--attention-splits",
            "--prefill-attention",
            "EMBER_ATTENTION_SPLITS",
        ] {
            assert!(help.contains(flag), "--help lacks {flag}");
        }
    }

    #[test]
    fn prefill_knob_separate_from_decode_knob() {
        let cfg = parse(&["--max-batch-size", "16", "--prefill-max-batch-size", "32"]).unwrap();
        assert_eq!(cfg.knobs.max_batch_size, 16);
        assert_eq!(cfg.knobs.prefill_max_batch_size, 32);
        assert_eq!(cfg.knobs.max_running(), 32);
        // The KV cache is capped by what every running sequence can use.
        assert_eq!(cfg.engine.max_sequences, 32);
    }
}
