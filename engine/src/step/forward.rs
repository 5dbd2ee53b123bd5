//! The model's forward pass over one step's inputs: the one function both
//! eager steps and captured decode graphs run.

use burn::prelude::*;

use super::inputs::StepInputs;
use crate::model::{Gpt2, KvCache};
use crate::ops::Ops;

/// Runs `model` over `inputs`, writing the step's K/V into `cache`; returns
/// the logits `[B, vocab]` of each row's last token.
pub fn forward(model: &Gpt2, ops: &Ops, cache: &mut KvCache, inputs: StepInputs) -> Tensor<2> {
    let StepInputs {
        tokens,
        positions,
        last_rows,
        meta,
    } = inputs;
    model.forward(ops, tokens, positions, last_rows, &meta, cache)
}
