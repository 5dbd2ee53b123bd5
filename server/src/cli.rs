//! `ember-server`'s flags and their validation.
//!
//! Every flag has a long name, an `EMBER_*` environment variable and a doc
//! comment that becomes `--help`. [`Args::validate`] turns the raw flags into a
//! [`ServerConfig`] or fails fast with an error that names the flag, so a bad
//! value stops the process before anything is loaded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;

use crate::logging::LogFormat;
use crate::model::{ModelSource, Preset};
use crate::service::doors::{DoorArgs, DoorConfig};

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

    /// KV cache capacity in blocks. Default: room for every running sequence at
    /// full context, capped by --kv-memory-mb.
    #[arg(long, env = "EMBER_KV_BLOCKS")]
    pub kv_blocks: Option<usize>,

    /// KV cache memory budget in MiB, used when --kv-blocks is not given.
    #[arg(long, env = "EMBER_KV_MEMORY_MB", default_value_t = 2048)]
    pub kv_memory_mb: usize,

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

    /// CUDA only: run every decode step eager instead of replaying each decode
    /// bucket's captured CUDA graph (for comparison and debugging).
    #[arg(long, env = "EMBER_NO_CUDA_GRAPHS")]
    pub no_cuda_graphs: bool,

    /// CUDA only: where CubeCL keeps autotune results and compiled kernels, so a
    /// restart does not tune and compile again. Default:
    /// $XDG_CACHE_HOME/ember/kernels (or ~/.cache/ember/kernels).
    #[arg(long, env = "EMBER_KERNEL_CACHE_DIR")]
    pub kernel_cache_dir: Option<PathBuf>,

    /// Log line format on stderr: text (colours only on a terminal) or json
    /// (one object per line). RUST_LOG sets the level (default info).
    #[arg(long, env = "EMBER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The front doors' flags: --http-listen, --served-model-name, TLS, API
    /// keys (`service::doors`).
    #[command(flatten)]
    pub doors: DoorArgs,
}

/// `$XDG_CACHE_HOME/ember/kernels`, else `$HOME/.cache/ember/kernels`.
pub fn default_kernel_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("ember").join("kernels"))
}

/// Where the engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// CUDA device 0 if the binary has CUDA and it starts, else the CPU
    /// (`device::choose_auto`).
    Auto,
    Cpu,
    Cuda(usize),
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| format!("--device must be auto, cpu, cuda or cuda:N, got {s:?}")),
        }
    }
}

/// The scheduler's knobs, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerKnobs {
    pub max_batch_size: usize,
    pub prefill_max_batch_size: usize,
    pub prefill_max_tokens: usize,
    pub max_pending: usize,
    pub max_new_tokens_limit: usize,
    pub block_size: usize,
    /// Reuse cached KV blocks of shared prefixes (`--no-prefix-cache` turns it off).
    pub prefix_caching: bool,
}

impl SchedulerKnobs {
    /// Most sequences that may be running (admitted, not finished) at once. The
    /// prefill knob may exceed the decode knob, so admission alone can fill a
    /// larger running set; decode then rotates through it `max_batch_size` at a
    /// time.
    pub fn max_running(&self) -> usize {
        self.max_batch_size.max(self.prefill_max_batch_size)
    }
}

/// Validated startup configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub device: DeviceSpec,
    pub model: ModelSource,
    pub seed: u64,
    pub knobs: SchedulerKnobs,
    pub kv_blocks: Option<usize>,
    pub kv_memory_bytes: usize,
    pub shutdown_timeout: Duration,
    pub metrics_addr: Option<SocketAddr>,
    pub warmup: bool,
    /// Replay decode steps as CUDA graphs (CUDA).
    pub cuda_graphs: bool,
    /// CubeCL's autotune and kernel cache (CUDA).
    pub kernel_cache_dir: Option<PathBuf>,
    /// The front doors: HTTP, the served name, TLS, API keys.
    pub doors: DoorConfig,
}

/// A flag with a value it cannot take; the message names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

impl Args {
    pub fn validate(self) -> Result<ServerConfig, FlagError> {
        fn positive(flag: &str, v: usize) -> Result<usize, FlagError> {
            if v == 0 {
                Err(FlagError(format!("--{flag} must be positive, got 0")))
            } else {
                Ok(v)
            }
        }
        let device = self.device.parse::<DeviceSpec>().map_err(FlagError)?;
        let model = match &self.model_dir {
            Some(dir) if !dir.is_dir() => {
                return Err(FlagError(format!(
                    "--model-dir {} is not a directory",
                    dir.display()
                )))
            }
            Some(dir) => ModelSource::Dir(dir.clone()),
            None => ModelSource::Preset {
                preset: self.preset.parse::<Preset>().map_err(|_| {
                    FlagError(format!(
                        "--preset must be gpt2 or tiny, got {:?}",
                        self.preset
                    ))
                })?,
                seed: self.seed,
            },
        };
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
            block_size: positive("block-size", self.block_size)?,
            prefix_caching: !self.no_prefix_cache,
        };
        if let Some(b) = self.kv_blocks {
            positive("kv-blocks", b)?;
        }
        positive("kv-memory-mb", self.kv_memory_mb)?;
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
        Ok(ServerConfig {
            listen: self.listen,
            device,
            model,
            seed: self.seed,
            knobs,
            kv_blocks: self.kv_blocks,
            kv_memory_bytes: self.kv_memory_mb.saturating_mul(1 << 20),
            shutdown_timeout: Duration::from_secs_f64(self.shutdown_timeout),
            metrics_addr,
            warmup: !self.no_warmup,
            cuda_graphs: !self.no_cuda_graphs,
            kernel_cache_dir: match self.kernel_cache_dir {
                Some(dir) if dir.as_os_str().is_empty() => {
                    return Err(FlagError("--kernel-cache-dir must not be empty".into()))
                }
                Some(dir) => Some(dir),
                None => default_kernel_cache_dir(),
            },
            doors,
        })
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
        assert!(cfg.knobs.prefix_caching);
        assert!(!parse(&["--no-prefix-cache"]).unwrap().knobs.prefix_caching);
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
        ] {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
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
    fn device_specs() {
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
    }

    #[test]
    fn prefill_knob_separate_from_decode_knob() {
        let cfg = parse(&["--max-batch-size", "16", "--prefill-max-batch-size", "32"]).unwrap();
        assert_eq!(cfg.knobs.max_batch_size, 16);
        assert_eq!(cfg.knobs.prefill_max_batch_size, 32);
        assert_eq!(cfg.knobs.max_running(), 32);
    }
}
