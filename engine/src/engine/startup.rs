//! Building an engine's device half: load the model, size the KV cache
//! ([`super::kv_sizing`]) and allocate it in a [`StepRunner`].
//!
//! Sizing the cache to the device (the default) needs to know what the rest
//! of the engine takes. On a GPU the model is loaded, then a throwaway runner
//! with a one-block cache runs the largest prefill step and the largest
//! decode step (greedy and sampling), so CubeCL's pool holds the workspace
//! they need, and only then is the device's free memory read: vLLM's
//! profiling run. The runner then goes, its pool pages stay (the real steps
//! reuse them), and the real cache takes what the budget leaves. The CPU
//! needs no profile: its workspace is small next to the RAM. Nor does a GPU
//! where the capped cache and a loose bound on the steps' workspace fit
//! anyway ([`kv_sizing::profile_unneeded`]): the profile could not change
//! the size there, so it is skipped (GPT-2 XL on an H200: ~1 s of a
//! restart, 7.5 s of a first start) and `KV-sizing profile skipped` says
//! why. The warmup then allocates that workspace after the cache.

use std::time::Instant;

use super::config::EngineConfig;
use super::kv_sizing::{self, KvBudget};
use crate::device::EngineDevice;
use crate::error::EngineError;
use crate::model::kv_cache::kv_dtype;
use crate::model::{load_model, Gpt2, Gpt2Config};
use crate::sampling::SamplingTable;
use crate::step::{RunnerShape, StepRunner};

/// Loads the model `config` names onto `device`, sizes the KV cache and
/// allocates it; returns the runner and the number of blocks.
pub(super) fn runner(
    config: &EngineConfig,
    device: &EngineDevice,
) -> Result<(StepRunner, usize), EngineError> {
    let (model, model_config) = load_model(&config.model, &device.device)?;
    let model = match device.ops.matrix_dtype() {
        Some(dtype) => model.with_matrix_dtype(dtype),
        None => model,
    };
    model_config
        .validate()
        .map_err(|e| EngineError::InvalidConfig(e.to_string()))?;
    let shape = |num_blocks| RunnerShape {
        block_size: config.block_size,
        num_blocks,
        max_batch: config.max_batch,
        prefill: config.prefill,
        bucketed: config.bucketed.unwrap_or(device.bucketed),
    };
    let memory = match config.kv {
        KvBudget::Device {
            gpu_memory_utilization,
        } => {
            let loaded = device.memory();
            if device.cuda_index.is_none() {
                loaded
            } else if let Some(why) = profile_unneeded(
                config,
                &model_config,
                device,
                gpu_memory_utilization,
                loaded,
            ) {
                tracing::info!(why = %why, "KV-sizing profile skipped");
                loaded
            } else {
                profile(&model, &model_config, device, shape(1))?;
                device.memory()
            }
        }
        KvBudget::Blocks(_) | KvBudget::Memory(_) => None,
    };
    // bf16 K/V (with bf16 CPU weights): twice the blocks a byte.
    let kv_elem_bytes = kv_dtype(&device.ops).map_or(device.float_bytes, |d| d.size());
    let plan = kv_sizing::plan(
        config.kv,
        &model_config,
        config.block_size,
        kv_elem_bytes,
        config.max_sequences,
        memory,
    )?;
    tracing::info!(
        blocks = plan.blocks,
        gib = format!("{:.2}", plan.bytes as f64 / (1u64 << 30) as f64),
        block_size = config.block_size,
        prefix_caching = config.prefix_caching,
        why = %plan.reason,
        "KV cache sized"
    );
    let runner = StepRunner::new(
        model,
        model_config,
        device.ops.clone(),
        shape(plan.blocks),
        device.device.clone(),
    )?;
    Ok((runner, plan.blocks))
}

/// [`kv_sizing::profile_unneeded`] for this engine: the largest steps are
/// the prefill bounds and the larger of the two batch knobs, rounded up to
/// their power-of-two buckets. Never on the tensor-op prefill attention
/// (`--prefill-attention false`, or heads wider than its kernel's 64),
/// whose scores the bound does not cover: that one is always profiled.
fn profile_unneeded(
    config: &EngineConfig,
    model: &Gpt2Config,
    device: &EngineDevice,
    gpu_memory_utilization: f64,
    loaded: Option<kv_sizing::DeviceMemory>,
) -> Option<String> {
    if !device.ops.tuning().prefill_attention || model.head_dim() > 64 {
        return None;
    }
    let tokens = config.prefill.max_tokens.max(1).next_power_of_two();
    let rows = config
        .max_batch
        .max(config.prefill.max_rows)
        .max(1)
        .next_power_of_two();
    kv_sizing::profile_unneeded(
        gpu_memory_utilization,
        model,
        config.block_size,
        device.float_bytes,
        config.max_sequences,
        kv_sizing::step_workspace_bound(model, tokens, rows),
        loaded,
    )
}

/// Runs the largest prefill step and the largest decode bucket (greedy and
/// sampling) on a throwaway runner with a one-block cache (see the module
/// docs); padding rows only, which touch the padding block alone.
fn profile(
    model: &Gpt2,
    config: &Gpt2Config,
    device: &EngineDevice,
    shape: RunnerShape,
) -> Result<(), EngineError> {
    let started = Instant::now();
    let mut runner = StepRunner::new(
        model.clone(),
        config.clone(),
        device.ops.clone(),
        shape,
        device.device.clone(),
    )?;
    let prefill = runner.prefill_shape(shape.prefill.max_rows, shape.prefill.max_tokens);
    runner.warm_prefill(prefill)?;
    let bucket = runner.decode_bucket(shape.max_batch);
    runner.warm_decode(bucket, &SamplingTable::default())?;
    runner.warm_decode(bucket, &super::warmup::filtering_table())?;
    tracing::info!(
        prefill_tokens = prefill.tokens,
        decode_rows = bucket,
        seconds = started.elapsed().as_secs_f64(),
        "profiled the largest steps for KV sizing"
    );
    Ok(())
}
