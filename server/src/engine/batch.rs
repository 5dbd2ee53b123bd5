//! One step's model inputs: prefill batches built on the host, decode batches
//! derived on the device from the persistent [`DecodeBuffers`].
//!
//! - Prefill pads prompts on the right to `Q` (the longest prompt, or its
//!   bucket) and the batch to `B` rows (the count, or its bucket). Every row is
//!   written to the cache: a real token at its sequence's slot, a padding token
//!   at the padding block's first slot, which nothing real ever reads. The
//!   causal+padding mask hides padding keys; logits are taken only at each
//!   prompt's last row.
//! - Decode feeds one token per row. Each row's context is read from the cache
//!   through its block table: the slot list `table[t / bs] * bs + t % bs` for
//!   `t < T` is computed on the device from the block-table buffer (`T` =
//!   `ctx_blocks * bs`, the batch's context bucket), and a mask built from the
//!   context-length buffer hides positions `>= len`. Nothing is read
//!   back or uploaded here: the step's inputs were written into the buffers once.

use burn::prelude::*;

use super::blocks::slot_of;
use super::buffers::DecodeBuffers;
use crate::model::AttentionMeta;

/// Everything [`Gpt2::forward`](crate::model::Gpt2::forward) needs for one step.
#[derive(Debug, Clone)]
pub struct StepInputs {
    /// `[B, Q]`
    pub tokens: Tensor<2, Int>,
    /// `[B, Q]`
    pub positions: Tensor<2, Int>,
    /// `[B]`, rows of the flattened `[B*Q]` whose logits are needed.
    pub last_rows: Tensor<1, Int>,
    pub meta: AttentionMeta,
}

/// One prompt to prefill and the blocks reserved for it.
#[derive(Debug, Clone, Copy)]
pub struct PrefillSeq<'a> {
    pub prompt: &'a [u32],
    pub table: &'a [u32],
}

/// The padded shape of a prefill batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillShape {
    /// Rows (sequences plus padding rows).
    pub rows: usize,
    /// Tokens per row.
    pub len: usize,
}

fn ints<const D: usize>(values: Vec<i32>, shape: [usize; D], device: &Device) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Builds the padded prefill batch (`shape` at least the batch's own size;
/// prompts must be non-empty). `pad_slot` takes the padding rows' K/V.
pub fn prefill_inputs(
    seqs: &[PrefillSeq<'_>],
    shape: PrefillShape,
    block_size: usize,
    pad_slot: usize,
    device: &Device,
) -> StepInputs {
    let PrefillShape { rows: b, len: q } = shape;
    debug_assert!(b >= seqs.len() && seqs.iter().all(|s| s.prompt.len() <= q));
    let mut tokens = vec![0i32; b * q];
    let mut positions = vec![0i32; b * q];
    let mut write_slots = vec![pad_slot as i32; b * q];
    let mut last_rows = vec![0i32; b];
    let mut lengths = vec![0i32; b];
    for (i, s) in seqs.iter().enumerate() {
        for p in 0..q {
            positions[i * q + p] = p as i32;
        }
        for (p, &tok) in s.prompt.iter().enumerate() {
            tokens[i * q + p] = tok as i32;
            write_slots[i * q + p] = slot_of(s.table, block_size, p) as i32;
        }
        last_rows[i] = (i * q + s.prompt.len().max(1) - 1) as i32;
        lengths[i] = s.prompt.len() as i32;
    }
    let lengths = ints::<1>(lengths, [b], device);

    // masked[b, 0, i, j] = j > i (future) || j >= len[b] (padding key).
    let mask = [b, 1, q, q];
    let i = Tensor::<1, Int>::arange(0..q as i64, device)
        .reshape([1, 1, q, 1])
        .expand(mask);
    let j = Tensor::<1, Int>::arange(0..q as i64, device)
        .reshape([1, 1, 1, q])
        .expand(mask);
    let len = lengths.reshape([b, 1, 1, 1]).expand(mask);
    let masked = j.clone().greater(i).bool_or(j.greater_equal(len));

    StepInputs {
        tokens: ints(tokens, [b, q], device),
        positions: ints(positions, [b, q], device),
        last_rows: ints(last_rows, [b], device),
        meta: AttentionMeta {
            write_slots: ints(write_slots, [b * q], device),
            context_slots: None,
            context_len: q,
            context_lens: None,
            mask: masked,
        },
    }
}

/// The decode step's inputs from `buffers` (already written for this step),
/// attending over the first `ctx_blocks` blocks of each row's table.
pub fn decode_inputs(buffers: &DecodeBuffers, ctx_blocks: usize, block_size: usize) -> StepInputs {
    let b = buffers.rows();
    let t = ctx_blocks * block_size;
    let device = buffers.device();
    let tables = buffers.tables.tensor().slice([0..b, 0..ctx_blocks]); // [B, nb]
    let offsets =
        Tensor::<1, Int>::arange(0..block_size as i64, device).reshape([1, 1, block_size]);
    let context_slots = (tables
        .mul_scalar(block_size as i64)
        .reshape([b, ctx_blocks, 1])
        + offsets)
        .reshape([b * t]); // [B*T]

    let shape = [b, 1, 1, t];
    let j = Tensor::<1, Int>::arange(0..t as i64, device)
        .reshape([1, 1, 1, t])
        .expand(shape);
    let len = buffers
        .context_lens
        .tensor()
        .reshape([b, 1, 1, 1])
        .expand(shape);

    StepInputs {
        tokens: buffers.tokens.tensor().reshape([b, 1]),
        positions: buffers.positions.tensor().reshape([b, 1]),
        last_rows: buffers.last_rows.clone(),
        meta: AttentionMeta {
            write_slots: buffers.write_slots.tensor(),
            context_slots: Some(context_slots),
            context_len: t,
            context_lens: Some(buffers.context_lens.tensor()),
            mask: j.greater_equal(len),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::buffers::DecodeRow;

    fn ints_of<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
        t.into_data().iter::<i64>().collect()
    }

    fn bools(t: Tensor<4, Bool>) -> Vec<bool> {
        t.into_data().iter::<bool>().collect()
    }

    #[test]
    fn prefill_mask_is_causal_and_hides_padding() {
        let dev = Device::flex();
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
        let shape = PrefillShape { rows: 3, len: 3 };
        let inputs = prefill_inputs(&seqs, shape, 4, 99, &dev);
        let m = bools(inputs.meta.mask);
        #[rustfmt::skip]
        let expected = [
            false, true, true,   false, false, true,   false, false, false, // seq 0: causal
            false, true, true,   false, true, true,    false, true, true,   // seq 1: one key
            true, true, true,    true, true, true,     true, true, true,    // padding row
        ];
        assert_eq!(m, expected);
        // Real tokens at their slots, padding positions at the padding slot.
        let slots = ints_of(inputs.meta.write_slots);
        assert_eq!(slots, [0, 1, 2, 4, 99, 99, 99, 99, 99]);
        assert_eq!(ints_of(inputs.last_rows), [2, 3, 0]);
    }

    #[test]
    fn decode_gathers_context_through_block_tables() {
        let dev = Device::flex();
        let mut buffers = DecodeBuffers::new(4, 3, 10, &dev);
        let rows = [
            DecodeRow {
                token: 5,
                pos: 2,
                table: &[3, 0],
            },
            DecodeRow {
                token: 6,
                pos: 0,
                table: &[1],
            },
        ];
        buffers.write(&rows, 2, 7);
        let inputs = decode_inputs(&buffers, 2, 2);
        let ctx = ints_of(inputs.meta.context_slots.unwrap());
        // Row 0: blocks 3 then 0; row 1: block 1 then the padding block 7 (masked);
        // rows 2-3 pad the bucket and read only the padding block.
        #[rustfmt::skip]
        assert_eq!(ctx, [6, 7, 0, 1,   2, 3, 14, 15,   14, 15, 14, 15,   14, 15, 14, 15]);
        assert_eq!(ints_of(inputs.meta.write_slots), [0, 2, 14, 14]);
        assert_eq!(ints_of(inputs.tokens), [5, 6, 0, 0]);
        assert_eq!(ints_of(inputs.positions), [2, 0, 0, 0]);
        let m = bools(inputs.meta.mask);
        #[rustfmt::skip]
        assert_eq!(m, [
            false, false, false, true,
            false, true, true, true,
            false, true, true, true,
            false, true, true, true,
        ]);
    }
}
