//! [`EngineConfig`]: everything an [`Engine`](super::Engine) is built from,
//! in one struct (the binaries fill it from their flags), and the KV sizing
//! it implies.

use crate::model::{Gpt2Config, ModelSource};
pub use crate::step::shapes::PrefillBounds;

/// How many KV blocks to allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvBudget {
    /// Exactly this many blocks (`--kv-blocks`).
    Blocks(usize),
    /// Room for `sequences` sequences at full context, capped by `bytes` of
    /// K/V memory (`--kv-memory-mb`), and at least one sequence's worth.
    Memory { bytes: usize, sequences: usize },
}

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
    /// Most sequences in one decode step (the largest decode bucket).
    pub max_batch: usize,
    /// Most rows and tokens in one prefill step.
    pub prefill: PrefillBounds,
    /// Keep full blocks content-addressed and reuse them for requests that
    /// share a prefix (`crate::kv`).
    pub prefix_caching: bool,
    /// Capture each decode bucket's step at warmup and replay it as a CUDA
    /// graph, where shapes are bucketed: [`super::Engine::new`] drops it
    /// otherwise (on the CPU a "graph" would re-run the step, no speed-up).
    pub decode_graphs: bool,
    /// Pad step shapes to power-of-two buckets; `None`: the device's choice
    /// (CUDA: yes, a bounded set of shapes to compile, tune and capture; the
    /// CPU: no, padding would be pure extra work).
    pub bucketed: Option<bool>,
}

impl EngineConfig {
    /// A config for `model` with the server's defaults: 16-token blocks,
    /// room for 32 sequences within 2 GiB, decode batches of up to 32,
    /// prefill steps of up to 32 rows and 8192 tokens, prefix caching on,
    /// no graphs.
    pub fn new(model: ModelSource) -> Self {
        Self {
            model,
            block_size: 16,
            kv: KvBudget::Memory {
                bytes: 2 << 30,
                sequences: 32,
            },
            max_batch: 32,
            prefill: PrefillBounds {
                max_rows: 32,
                max_tokens: 8192,
            },
            prefix_caching: true,
            decode_graphs: false,
            bucketed: None,
        }
    }
}

/// K/V bytes one block takes over all layers (K and V).
pub fn kv_bytes_per_block(config: &Gpt2Config, block_size: usize, elem_bytes: usize) -> usize {
    2 * config.n_layer * block_size * config.n_embd * elem_bytes
}

/// The number of blocks `budget` gives a model of `config` with `elem_bytes`
/// per stored element (warns when the memory cap leaves fewer blocks than
/// every sequence at full context needs).
pub fn num_blocks(
    budget: KvBudget,
    config: &Gpt2Config,
    block_size: usize,
    elem_bytes: usize,
) -> usize {
    match budget {
        KvBudget::Blocks(n) => n,
        KvBudget::Memory { bytes, sequences } => {
            let per_block = kv_bytes_per_block(config, block_size, elem_bytes).max(1);
            let per_seq = config.n_positions.div_ceil(block_size.max(1));
            let wanted = sequences * per_seq;
            let affordable = bytes / per_block;
            if affordable < wanted {
                tracing::warn!(
                    wanted,
                    affordable,
                    "--kv-memory-mb holds fewer blocks than every running sequence at full context; requests may wait for blocks"
                );
            }
            wanted.min(affordable).max(per_seq)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_budgets_cap_the_wanted_blocks_and_keep_one_sequence() {
        let gpt2 = Gpt2Config::gpt2(); // 12 x 768, 1024 positions
        let per_block = kv_bytes_per_block(&gpt2, 16, 2);
        assert_eq!(per_block, 2 * 12 * 16 * 768 * 2);
        assert_eq!(num_blocks(KvBudget::Blocks(7), &gpt2, 16, 2), 7);
        let roomy = KvBudget::Memory {
            bytes: 1 << 40,
            sequences: 4,
        };
        assert_eq!(num_blocks(roomy, &gpt2, 16, 2), 4 * 64);
        let tight = KvBudget::Memory {
            bytes: 10 * per_block,
            sequences: 4,
        };
        assert_eq!(
            num_blocks(tight, &gpt2, 16, 2),
            64,
            "one full sequence at least"
        );
        let some = KvBudget::Memory {
            bytes: 100 * per_block,
            sequences: 4,
        };
        assert_eq!(num_blocks(some, &gpt2, 16, 2), 100);
    }
}
