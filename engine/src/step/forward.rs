//! The model's forward pass over one step's inputs: the one function both
//! eager steps and captured decode graphs run.

use burn::prelude::*;

use super::inputs::{resolve_tokens, StepInputs};
use crate::model::{Gpt2, KvCache};
use crate::ops::cpu::pool;
use crate::ops::Ops;

/// Runs `model` over `inputs`, writing the step's K/V into `cache`; returns
/// the logits `[B, vocab]` of each row's last token. On the CPU the pass
/// runs on the kernels' rayon pool ([`pool::on_pool`]).
pub fn forward(model: &Gpt2, ops: &Ops, cache: &mut KvCache, inputs: StepInputs) -> Tensor<2> {
    let StepInputs {
        tokens,
        positions,
        last_rows,
        meta,
        previous,
    } = inputs;
    let tokens = match previous {
        Some(previous) => resolve_tokens(tokens, previous),
        None => tokens,
    };
    let on_cpu = pool::is_cpu(&tokens.device());
    let pass = || model.forward(ops, tokens, positions, last_rows, &meta, cache);
    if on_cpu {
        return pool::on_pool(pass);
    }
    pass()
}
