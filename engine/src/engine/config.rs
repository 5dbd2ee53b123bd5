//! [`EngineConfig`]: everything an [`Engine`](super::Engine) is built from,
//! in one struct (the binaries fill it from their flags); the KV sizing it
//! implies is [`super::kv_sizing`]'s.

pub use super::kv_sizing::KvBudget;
use crate::model::ModelSource;
pub use crate::step::shapes::PrefillBounds;

/// What an engine is built from (see [`super::Engine::new`]): every engine
/// setting, settled here once. The end-of-sequence token is the model's
/// (`config.json`'s `eos_token_id`), so it is no setting.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The weights: an HF directory or a seeded random preset.
    pub model: ModelSource,
    /// Tokens per KV block.
    pub block_size: usize,
    /// How many blocks the cache (shared by all sequences) holds.
    pub kv: KvBudget,
    /// Most sequences running at once (the scheduler's): the cache never
    /// holds more than they can use at full context.
    pub max_sequences: usize,
    /// Most sequences in one decode step (the largest decode bucket).
    pub max_batch: usize,
    /// Most rows and tokens in one prefill step.
    pub prefill: PrefillBounds,
    /// Keep full blocks content-addressed and reuse them for requests that
    /// share a prefix (`crate::kv`).
    pub prefix_caching: bool,
    /// Capture each decode bucket's step and each prefill shape of at most
    /// `crate::step::PREFILL_GRAPH_MAX_TOKENS` tokens at warmup and replay
    /// them as CUDA graphs, where shapes are bucketed: [`super::Engine::new`]
    /// drops it otherwise (on the CPU a "graph" would re-run the step, no
    /// speed-up).
    pub cuda_graphs: bool,
    /// Pad step shapes to power-of-two buckets; `None`: the device's choice
    /// (CUDA: yes, a bounded set of shapes to compile, tune and capture; the
    /// CPU: no, padding would be pure extra work).
    pub bucketed: Option<bool>,
}

impl EngineConfig {
    /// A config for `model` with the server's defaults: 16-token blocks, the
    /// cache sized to the device (`--gpu-memory-utilization 0.9`) for up to
    /// 32 running sequences, decode batches of up to 32, prefill steps of up
    /// to 32 rows and 8192 tokens, prefix caching on, no graphs.
    pub fn new(model: ModelSource) -> Self {
        Self {
            model,
            block_size: 16,
            kv: KvBudget::Device {
                gpu_memory_utilization: 0.9,
            },
            max_sequences: 32,
            max_batch: 32,
            prefill: PrefillBounds {
                max_rows: 32,
                max_tokens: 8192,
            },
            prefix_caching: true,
            cuda_graphs: false,
            bucketed: None,
        }
    }
}
