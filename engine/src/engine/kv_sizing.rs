//! How many KV blocks to allocate: [`KvBudget`] (what the flags asked for)
//! and [`plan`], a pure function of the budget, the model and what the
//! device has left once the model is loaded (unit-tested below with made-up
//! memory figures; `super::Engine::new` measures the real ones).
//!
//! The default is vLLM's: a GPU gets `--gpu-memory-utilization` (0.9) of its
//! total memory for this process, and what the weights, the largest step's
//! workspace and everything else already on the device do not use goes to
//! the cache. The CPU gets a quarter of the RAM available at startup. Either
//! way the cache is capped by what `max_sequences` sequences at full context
//! can use (more would never be touched), and must hold at least one such
//! sequence, or the server refuses to start, naming the flag.
//!
//! CubeCL carves allocations made after the cache from pages the size of
//! its largest allocation (one layer's K or V), so two such pages are kept
//! free for the workspace the warmup and the graphs allocate later.

pub use crate::device::DeviceMemory;
use crate::error::EngineError;
use crate::model::Gpt2Config;

/// Share of the RAM available at startup that a CPU's default cache may take.
pub const CPU_RAM_SHARE: f64 = 0.25;

/// Pages of one cache tensor's size left free for allocations made after
/// the cache (see the module docs).
const WORKSPACE_PAGES: usize = 2;

/// How many KV blocks to allocate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvBudget {
    /// Exactly this many blocks (`--kv-blocks`).
    Blocks(usize),
    /// At most this many bytes of K/V (`--kv-memory-mb`), capped by what
    /// the running sequences can use, and at least one full sequence.
    Memory(usize),
    /// Sized to the device (the default): on a GPU, this fraction of its
    /// total memory less what is in use once the model is loaded and the
    /// largest step ran (`--gpu-memory-utilization`); on the CPU,
    /// [`CPU_RAM_SHARE`] of the available RAM. Capped like `Memory`.
    Device { gpu_memory_utilization: f64 },
}

/// The cache size chosen and why (logged at startup).
#[derive(Debug, Clone, PartialEq)]
pub struct KvPlan {
    pub blocks: usize,
    pub bytes: usize,
    pub reason: String,
}

/// K/V bytes one block takes over all layers (K and V).
pub fn kv_bytes_per_block(config: &Gpt2Config, block_size: usize, elem_bytes: usize) -> usize {
    2 * config.n_layer * block_size * config.n_embd * elem_bytes
}

/// The cache for `budget`: a model of `config`, blocks of `block_size`
/// tokens of `elem_bytes` per element, at most `max_sequences` running, on a
/// device with `memory` left (`None`: unknown, the cap is taken).
pub fn plan(
    budget: KvBudget,
    config: &Gpt2Config,
    block_size: usize,
    elem_bytes: usize,
    max_sequences: usize,
    memory: Option<DeviceMemory>,
) -> Result<KvPlan, EngineError> {
    let per_block = kv_bytes_per_block(config, block_size.max(1), elem_bytes).max(1);
    let per_seq = config.n_positions.div_ceil(block_size.max(1));
    let cap = max_sequences.max(1) * per_seq;
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    let done = |blocks: usize, reason: String| KvPlan {
        blocks,
        bytes: blocks * per_block,
        reason,
    };
    let capped = |affordable: usize, source: String| {
        if affordable >= cap {
            done(cap, format!("{max_sequences} sequences at full context ({per_seq} blocks each), within {source}"))
        } else {
            done(affordable, format!("{source}: room for {} sequences at full context of the {max_sequences} that may run (the rest wait or are preempted)", affordable / per_seq))
        }
    };
    match budget {
        KvBudget::Blocks(n) => Ok(done(n, "--kv-blocks".into())),
        KvBudget::Memory(bytes) => {
            let affordable = (bytes / per_block).max(per_seq);
            Ok(capped(affordable, format!("--kv-memory-mb {}", bytes >> 20)))
        }
        KvBudget::Device {
            gpu_memory_utilization: u,
        } => match memory {
            None => Ok(done(cap, format!("{max_sequences} sequences at full context (the device's free memory is unknown)"))),
            Some(DeviceMemory::Gpu { total, free }) => {
                let allowed = (total as f64 * u) as usize;
                let in_use = total.saturating_sub(free);
                let left = allowed.saturating_sub(in_use);
                // The cache is 2 * n_layer tensors; keep WORKSPACE_PAGES more.
                let tensors = 2 * config.n_layer;
                let for_cache = left / (tensors + WORKSPACE_PAGES) * tensors;
                let affordable = for_cache / per_block;
                if affordable < per_seq {
                    return Err(EngineError::InvalidConfig(format!(
                        "--gpu-memory-utilization {u}: {:.2} GiB of the GPU's {:.2} GiB allowed, {:.2} GiB already in use (the model, the largest step, other processes): room for {affordable} KV blocks, fewer than one sequence at full context needs ({per_seq}); raise --gpu-memory-utilization, free the GPU, or lower --prefill-max-tokens",
                        gib(allowed), gib(total), gib(in_use)
                    )));
                }
                Ok(capped(affordable, format!("--gpu-memory-utilization {u} ({:.2} GiB left of {:.2} GiB allowed)", gib(left), gib(allowed))))
            }
            Some(DeviceMemory::Host { available }) => {
                let affordable = (available as f64 * CPU_RAM_SHARE) as usize / per_block;
                if affordable < per_seq {
                    return Err(EngineError::InvalidConfig(format!(
                        "a quarter of the available RAM ({:.2} GiB) holds {affordable} KV blocks, fewer than one sequence at full context needs ({per_seq}); set --kv-blocks or --kv-memory-mb",
                        gib(available)
                    )));
                }
                Ok(capped(affordable, format!("a quarter of the available RAM ({:.2} GiB)", gib(available))))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: usize = 1 << 30;

    fn gpt2() -> Gpt2Config {
        Gpt2Config::gpt2() // 12 x 768, 1024 positions: 64 blocks of 16 a sequence
    }

    #[test]
    fn explicit_blocks_and_memory_win_memory_capped_and_at_least_one_sequence() {
        let per_block = kv_bytes_per_block(&gpt2(), 16, 2);
        assert_eq!(per_block, 2 * 12 * 16 * 768 * 2);
        let p = |b| plan(b, &gpt2(), 16, 2, 4, None).unwrap().blocks;
        assert_eq!(p(KvBudget::Blocks(7)), 7);
        assert_eq!(p(KvBudget::Memory(1 << 40)), 4 * 64, "capped");
        assert_eq!(p(KvBudget::Memory(10 * per_block)), 64, "one sequence");
        assert_eq!(p(KvBudget::Memory(100 * per_block)), 100);
    }

    #[test]
    fn a_gpu_gets_its_share_less_what_is_in_use_and_capped_by_the_batch() {
        let per_block = kv_bytes_per_block(&gpt2(), 16, 2); // 589,824 bytes
        let h100 = |free| DeviceMemory::Gpu {
            total: 80 * GIB,
            free,
        };
        let dev = KvBudget::Device {
            gpu_memory_utilization: 0.9,
        };
        // 256 sequences need 16,384 blocks (9 GiB): the cap, well inside.
        let roomy = plan(dev, &gpt2(), 16, 2, 256, Some(h100(79 * GIB))).unwrap();
        assert_eq!(roomy.blocks, 256 * 64);
        assert!(roomy.reason.contains("256 sequences"), "{}", roomy.reason);
        // 4,096 sequences would need 144 GiB: the budget decides. 72 GiB
        // allowed, 1 GiB in use, 71 GiB left of which 24/26 go to the cache.
        let big = plan(dev, &gpt2(), 16, 2, 4096, Some(h100(79 * GIB))).unwrap();
        let want = 71 * GIB / 26 * 24 / per_block;
        assert_eq!(big.blocks, want);
        assert!(big.bytes <= 66 * GIB, "{}", big.bytes);
        // A smaller share leaves less.
        let half = KvBudget::Device {
            gpu_memory_utilization: 0.5,
        };
        let less = plan(half, &gpt2(), 16, 2, 4096, Some(h100(79 * GIB))).unwrap();
        assert_eq!(less.blocks, 39 * GIB / 26 * 24 / per_block);
    }

    #[test]
    fn a_model_that_leaves_no_room_is_a_clear_error_naming_the_flag() {
        let dev = KvBudget::Device {
            gpu_memory_utilization: 0.5,
        };
        // 40 GiB allowed, 41 GiB in use already.
        let full = DeviceMemory::Gpu {
            total: 80 * GIB,
            free: 39 * GIB,
        };
        let err = plan(dev, &gpt2(), 16, 2, 32, Some(full)).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("--gpu-memory-utilization 0.5"), "{msg}");
        assert!(msg.contains("fewer than one sequence"), "{msg}");
        // The CPU: a quarter of 100 MiB holds too few blocks of GPT-2.
        let host = DeviceMemory::Host {
            available: 100 << 20,
        };
        let msg = plan(dev, &gpt2(), 16, 4, 32, Some(host))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("--kv-blocks"), "{msg}");
    }

    #[test]
    fn the_cpu_takes_a_quarter_of_the_available_ram_capped() {
        let dev = KvBudget::Device {
            gpu_memory_utilization: 0.9,
        };
        let per_block = kv_bytes_per_block(&gpt2(), 16, 4);
        let host = |available| Some(DeviceMemory::Host { available });
        assert_eq!(
            plan(dev, &gpt2(), 16, 4, 32, host(64 * GIB))
                .unwrap()
                .blocks,
            32 * 64
        );
        assert_eq!(
            plan(dev, &gpt2(), 16, 4, 32, host(GIB)).unwrap().blocks,
            GIB / 4 / per_block
        );
    }
}
