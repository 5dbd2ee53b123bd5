//! Host-side construction of one step's inputs from block tables.
//!
//! Everything here is small integer bookkeeping done on the host and uploaded
//! as a handful of index tensors per step; the masks are computed on device
//! from per-sequence lengths (no `[B, Q, T]` upload).
//!
//! - Prefill pads prompts on the right to `Q = longest prompt`. Padding rows are
//!   computed but never written to the cache (`write_rows` lists the real
//!   ones) and never read (the causal+padding mask hides them), and logits are
//!   taken only at each prompt's last row.
//! - Decode has one new token per sequence at its own position; its context
//!   (`T = longest context`) is gathered from the cache through the block table.

use burn::prelude::*;
use burn::tensor::TensorData;

use super::blocks::slot_of;
use crate::model::{AttentionMeta, MASK_BIAS};

/// Everything [`Gpt2::forward`](crate::model::Gpt2::forward) needs for one step.
#[derive(Debug, Clone)]
pub struct StepInputs<B: Backend> {
    /// `[B, Q]`
    pub tokens: Tensor<B, 2, Int>,
    /// `[B, Q]`
    pub positions: Tensor<B, 2, Int>,
    /// `[B]`, rows of the flattened `[B*Q]` whose logits are needed.
    pub last_rows: Tensor<B, 1, Int>,
    pub meta: AttentionMeta<B>,
}

/// One prompt to prefill and the blocks reserved for it.
#[derive(Debug, Clone, Copy)]
pub struct PrefillSeq<'a> {
    pub prompt: &'a [u32],
    pub table: &'a [u32],
}

/// One sequence to advance by one token.
#[derive(Debug, Clone, Copy)]
pub struct DecodeSeq<'a> {
    /// The token to feed (the last one sampled).
    pub token: u32,
    /// Its position (= tokens already in the cache).
    pub pos: usize,
    pub table: &'a [u32],
}

fn ints<B: Backend, const D: usize>(
    values: Vec<i64>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Builds the padded prefill batch (prompts must be non-empty).
pub fn prefill_inputs<B: Backend>(
    seqs: &[PrefillSeq<'_>],
    block_size: usize,
    device: &B::Device,
) -> StepInputs<B> {
    let b = seqs.len();
    let q = seqs
        .iter()
        .map(|s| s.prompt.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut tokens = vec![0i64; b * q];
    let mut positions = vec![0i64; b * q];
    let mut write_rows = Vec::new();
    let mut write_slots = Vec::new();
    let mut last_rows = Vec::with_capacity(b);
    let mut lengths = Vec::with_capacity(b);
    for (i, s) in seqs.iter().enumerate() {
        for p in 0..q {
            positions[i * q + p] = p as i64;
        }
        for (p, &tok) in s.prompt.iter().enumerate() {
            tokens[i * q + p] = i64::from(tok);
            write_rows.push((i * q + p) as i64);
            write_slots.push(slot_of(s.table, block_size, p) as i64);
        }
        last_rows.push((i * q + s.prompt.len().max(1) - 1) as i64);
        lengths.push(s.prompt.len() as i64);
    }
    let n = write_rows.len();
    let lengths = ints::<B, 1>(lengths, [b], device);

    // masked[b, 0, i, j] = j > i (future) || j >= len[b] (padding key).
    let shape = [b, 1, q, q];
    let i = Tensor::<B, 1, Int>::arange(0..q as i64, device)
        .reshape([1, 1, q, 1])
        .expand(shape);
    let j = Tensor::<B, 1, Int>::arange(0..q as i64, device)
        .reshape([1, 1, 1, q])
        .expand(shape);
    let len = lengths.reshape([b, 1, 1, 1]).expand(shape);
    let masked = j.clone().greater(i).bool_or(j.greater_equal(len));
    let mask_bias = Tensor::<B, 4>::zeros(shape, device).mask_fill(masked, MASK_BIAS);

    StepInputs {
        tokens: ints(tokens, [b, q], device),
        positions: ints(positions, [b, q], device),
        last_rows: ints(last_rows, [b], device),
        meta: AttentionMeta {
            write_rows: (n < b * q).then(|| ints(write_rows, [n], device)),
            write_slots: ints(write_slots, [n, 1], device),
            context_slots: None,
            context_len: q,
            mask_bias,
        },
    }
}

/// Builds a decode batch: one token per sequence, context gathered by slot.
pub fn decode_inputs<B: Backend>(
    seqs: &[DecodeSeq<'_>],
    block_size: usize,
    device: &B::Device,
) -> StepInputs<B> {
    let b = seqs.len();
    // Context of each sequence = its cached tokens plus the new one.
    let t = seqs.iter().map(|s| s.pos + 1).max().unwrap_or(1);
    let mut tokens = Vec::with_capacity(b);
    let mut positions = Vec::with_capacity(b);
    let mut write_slots = Vec::with_capacity(b);
    let mut context = Vec::with_capacity(b * t);
    let mut lengths = Vec::with_capacity(b);
    for s in seqs {
        tokens.push(i64::from(s.token));
        positions.push(s.pos as i64);
        write_slots.push(slot_of(s.table, block_size, s.pos) as i64);
        let len = s.pos + 1;
        context.extend((0..len).map(|p| slot_of(s.table, block_size, p) as i64));
        // Padding points at a valid slot of the same sequence; it is masked.
        let pad = slot_of(s.table, block_size, 0) as i64;
        context.extend(std::iter::repeat_n(pad, t - len));
        lengths.push(len as i64);
    }
    let shape = [b, 1, 1, t];
    let j = Tensor::<B, 1, Int>::arange(0..t as i64, device)
        .reshape([1, 1, 1, t])
        .expand(shape);
    let len = ints::<B, 1>(lengths, [b], device)
        .reshape([b, 1, 1, 1])
        .expand(shape);
    let mask_bias = Tensor::<B, 4>::zeros(shape, device).mask_fill(j.greater_equal(len), MASK_BIAS);

    StepInputs {
        tokens: ints(tokens, [b, 1], device),
        positions: ints(positions, [b, 1], device),
        last_rows: Tensor::arange(0..b as i64, device),
        meta: AttentionMeta {
            write_rows: None,
            write_slots: ints(write_slots, [b, 1], device),
            context_slots: Some(ints(context, [b * t], device)),
            context_len: t,
            mask_bias,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray<f32>;

    fn values<const D: usize>(t: Tensor<TestBackend, D>) -> Vec<f32> {
        t.into_data().iter::<f32>().collect()
    }

    #[test]
    fn prefill_mask_is_causal_and_hides_padding() {
        let dev = Default::default();
        let (a, b) = ([1u32, 2, 3], [7u32]);
        let seqs = [
            PrefillSeq {
                prompt: &a,
                table: &[0],
            },
            PrefillSeq {
                prompt: &b,
                table: &[1],
            },
        ];
        let inputs = prefill_inputs::<TestBackend>(&seqs, 4, &dev);
        let m: Vec<bool> = values(inputs.meta.mask_bias)
            .iter()
            .map(|&x| x < 0.0)
            .collect();
        #[rustfmt::skip]
        let expected = [
            false, true, true,   false, false, true,   false, false, false, // seq 0: causal
            false, true, true,   false, true, true,    false, true, true,   // seq 1: one key
        ];
        assert_eq!(m, expected);
        let slots: Vec<i64> = inputs.meta.write_slots.into_data().iter::<i64>().collect();
        assert_eq!(slots, [0, 1, 2, 4]);
        let rows: Vec<i64> = inputs
            .meta
            .write_rows
            .unwrap()
            .into_data()
            .iter::<i64>()
            .collect();
        assert_eq!(rows, [0, 1, 2, 3]);
        let last: Vec<i64> = inputs.last_rows.into_data().iter::<i64>().collect();
        assert_eq!(last, [2, 3]);
    }

    #[test]
    fn decode_gathers_context_through_block_tables() {
        let dev = Default::default();
        let seqs = [
            DecodeSeq {
                token: 5,
                pos: 2,
                table: &[3, 0],
            },
            DecodeSeq {
                token: 6,
                pos: 0,
                table: &[1],
            },
        ];
        let inputs = decode_inputs::<TestBackend>(&seqs, 2, &dev);
        let ctx: Vec<i64> = inputs
            .meta
            .context_slots
            .unwrap()
            .into_data()
            .iter::<i64>()
            .collect();
        // seq 0: positions 0,1 in block 3, position 2 in block 0; seq 1: one slot + padding.
        assert_eq!(ctx, [6, 7, 0, 2, 2, 2]);
        let slots: Vec<i64> = inputs.meta.write_slots.into_data().iter::<i64>().collect();
        assert_eq!(slots, [0, 2]);
        let m: Vec<bool> = values(inputs.meta.mask_bias)
            .iter()
            .map(|&x| x < 0.0)
            .collect();
        assert_eq!(m, [false, false, false, false, true, true]);
    }
}
