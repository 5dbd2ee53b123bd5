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
//!
//! On a GPU the "in use" figure normally comes after a profiling run of the
//! largest steps (`super::startup`), which costs a second or more of every
//! start. [`profile_unneeded`] says when it cannot change the answer: when
//! the capped cache, plus [`step_workspace_bound`] (a loose upper bound on
//! what those steps allocate, from the model's shape), fits in what is left
//! after loading the model, [`plan`] picks the cap whatever the profile
//! would measure, so the profile is skipped and the reason logged.

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
                let (allowed, in_use, left) = gpu_room(u, total, free);
                let affordable = affordable_blocks(left, config, per_block);
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

/// `(allowed, in_use, left)` bytes of a GPU of `total` bytes with `free`
/// free, under `--gpu-memory-utilization u`.
fn gpu_room(u: f64, total: usize, free: usize) -> (usize, usize, usize) {
    let allowed = (total as f64 * u) as usize;
    let in_use = total.saturating_sub(free);
    (allowed, in_use, allowed.saturating_sub(in_use))
}

/// Blocks of `per_block` bytes a cache may take of `left` bytes: the cache
/// is `2 * n_layer` tensors, and [`WORKSPACE_PAGES`] more of their size stay
/// free (see the module docs).
fn affordable_blocks(left: usize, config: &Gpt2Config, per_block: usize) -> usize {
    let tensors = 2 * config.n_layer;
    left / (tensors + WORKSPACE_PAGES) * tensors / per_block.max(1)
}

/// An upper bound on the device memory the largest steps allocate besides
/// the weights and the KV cache: a prefill step of `tokens` flat tokens and
/// steps of up to `rows` rows, on a model of `config`. Deliberately loose:
/// a bound too low could let the cache take memory a step needs later (an
/// out-of-memory while serving), one too high only costs the profile.
///
/// Every element is counted as 4 bytes (CUDA runs f16). Per token, one
/// layer's intermediates (residual, LayerNorm out, qkv `3E`, attention out,
/// projection out, the MLP's hidden and its GELU `2 x 4E`, MLP out: `16E`),
/// twice for two layers in flight; the logits of every token with their
/// log-softmax and top-n (prompt logprobs score each position), and 16
/// `[rows, vocab]` buffers for sampling; all of it twice for CubeCL's pool
/// rounding, plus 1 GiB for everything fixed (cuBLASLt's workspace,
/// kernels, metadata, the tuning's inputs).
pub fn step_workspace_bound(config: &Gpt2Config, tokens: usize, rows: usize) -> usize {
    const ELEM: usize = 4;
    let layers = 2 * tokens * 16 * config.n_embd * ELEM;
    let vocab = (3 * tokens + 16 * rows) * config.vocab_size * ELEM;
    2 * (layers + vocab) + (1 << 30)
}

/// Why the KV-sizing profile of the largest steps can be skipped on a GPU
/// whose memory, read once the model is loaded, is `memory`: the cache of
/// `max_sequences` sequences at full context (the cap [`plan`] applies) and
/// `workspace` bytes for the steps ([`step_workspace_bound`]) fit in what
/// `--gpu-memory-utilization u` leaves, so [`plan`] picks the cap whatever
/// the profile would measure. `None`: memory could bind (or is not a GPU's),
/// so profile. The cache's other arguments are [`plan`]'s.
pub fn profile_unneeded(
    u: f64,
    config: &Gpt2Config,
    block_size: usize,
    elem_bytes: usize,
    max_sequences: usize,
    workspace: usize,
    memory: Option<DeviceMemory>,
) -> Option<String> {
    let Some(DeviceMemory::Gpu { total, free }) = memory else {
        return None;
    };
    let per_block = kv_bytes_per_block(config, block_size.max(1), elem_bytes).max(1);
    let per_seq = config.n_positions.div_ceil(block_size.max(1));
    let cap = max_sequences.max(1) * per_seq;
    let (allowed, in_use, left) = gpu_room(u, total, free);
    let after_steps = left.checked_sub(workspace)?;
    if affordable_blocks(after_steps, config, per_block) < cap {
        return None;
    }
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    Some(format!(
        "{max_sequences} sequences at full context ({:.2} GiB of KV) and at most {:.2} GiB for the largest steps fit in the {:.2} GiB left of {:.2} GiB allowed by --gpu-memory-utilization {u} ({:.2} GiB in use with the model loaded): the profile could not change the size",
        gib(cap * per_block),
        gib(workspace),
        gib(left),
        gib(allowed),
        gib(in_use)
    ))
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

    fn xl() -> Gpt2Config {
        Gpt2Config::new(48, 25, 1600, 1024, 50257)
    }

    #[test]
    fn the_step_workspace_bound_grows_with_the_step_and_is_loose() {
        // GPT-2 XL at the default bounds (8,192 prefill tokens, 32 rows):
        // ~14 GiB, where the profile measured well under one.
        let bound = step_workspace_bound(&xl(), 8192, 32);
        assert!(bound > 12 * GIB && bound < 16 * GIB, "{bound}");
        assert!(step_workspace_bound(&xl(), 4096, 32) < bound);
        assert!(step_workspace_bound(&xl(), 8192, 256) > bound);
        assert!(step_workspace_bound(&gpt2(), 8192, 32) < bound);
        assert!(step_workspace_bound(&gpt2(), 1, 1) > GIB, "the fixed part");
    }

    #[test]
    fn the_profile_is_skipped_only_when_the_capped_cache_and_the_steps_fit() {
        let h200 = |free| {
            Some(DeviceMemory::Gpu {
                total: 140 * GIB,
                free,
            })
        };
        let work = step_workspace_bound(&xl(), 8192, 32);
        // The issue-48 restart: XL loaded (~4 GiB in use), 32 sequences
        // (9.4 GiB of KV) and the bound fit in 0.9 of an H200: skip, and
        // the plan on the same reading is the cap.
        let why = profile_unneeded(0.9, &xl(), 16, 2, 32, work, h200(136 * GIB)).unwrap();
        assert!(why.contains("32 sequences at full context"), "{why}");
        assert!(why.contains("--gpu-memory-utilization 0.9"), "{why}");
        let dev = KvBudget::Device {
            gpu_memory_utilization: 0.9,
        };
        let plan_ = plan(dev, &xl(), 16, 2, 32, h200(136 * GIB)).unwrap();
        assert_eq!(plan_.blocks, 32 * 64);
        // 1,024 sequences would need 300 GiB: memory binds, so profile.
        assert_eq!(
            profile_unneeded(0.9, &xl(), 16, 2, 1024, work, h200(136 * GIB)),
            None
        );
        // A small share, or a GPU mostly taken by others: profile.
        assert_eq!(
            profile_unneeded(0.1, &xl(), 16, 2, 32, work, h200(136 * GIB)),
            None
        );
        assert_eq!(
            profile_unneeded(0.9, &xl(), 16, 2, 32, work, h200(30 * GIB)),
            None
        );
        // The workspace alone over what is left: profile (no underflow).
        assert_eq!(
            profile_unneeded(0.9, &xl(), 16, 2, 1, usize::MAX, h200(136 * GIB)),
            None
        );
        // The CPU and an unreadable device never skip here (no profile runs
        // there anyway, or the plan takes the cap).
        let host = Some(DeviceMemory::Host { available: 1 << 40 });
        assert_eq!(profile_unneeded(0.9, &gpt2(), 16, 4, 32, 0, host), None);
        assert_eq!(profile_unneeded(0.9, &gpt2(), 16, 2, 32, 0, None), None);
    }

    #[test]
    fn a_skipped_profile_never_changes_the_plan() {
        // Wherever the rule skips, the plan on any reading the profile could
        // have left (up to `work` more in use) is still the cap.
        let work = step_workspace_bound(&gpt2(), 8192, 32);
        let dev = KvBudget::Device {
            gpu_memory_utilization: 0.9,
        };
        for total_gib in [16, 24, 40, 80] {
            for used_mib in (0..total_gib * 1024).step_by(512) {
                let free = (total_gib << 30) - (used_mib << 20);
                let before = Some(DeviceMemory::Gpu {
                    total: total_gib << 30,
                    free,
                });
                for seqs in [1, 32, 256] {
                    if profile_unneeded(0.9, &gpt2(), 16, 2, seqs, work, before).is_none() {
                        continue;
                    }
                    let after = Some(DeviceMemory::Gpu {
                        total: total_gib << 30,
                        free: free - work,
                    });
                    let p = plan(dev, &gpt2(), 16, 2, seqs, after).unwrap();
                    assert_eq!(
                        p.blocks,
                        seqs * 64,
                        "{total_gib} GiB, {used_mib} MiB used, {seqs}"
                    );
                }
            }
        }
    }
}
