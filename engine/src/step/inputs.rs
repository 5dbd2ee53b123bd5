//! One step's model inputs: prefill batches built on the host, decode batches
//! derived on the device from the persistent [`DecodeBuffers`].
//!
//! - Prefill pads each row's new tokens (a whole prompt or a chunk of one) on
//!   the right to `Q` (the longest row, or its bucket) and the batch to `B`
//!   rows (the count, or its bucket). Every row is written to the cache: a real
//!   token at its sequence's slot, a padding token at the padding block's first
//!   slot, which nothing real ever reads. A row that starts after cached
//!   positions (a prefix-cache hit, an earlier chunk) attends over its whole
//!   context, gathered by slot through its block table
//!   ([`AttentionContext::Gathered`]); when no row has one, attention runs
//!   over the fresh K/V alone ([`AttentionContext::Fresh`]). The causal+padding mask
//!   hides future and padding keys; logits are taken only at each row's last
//!   token.
//! - Decode feeds one token per row. Attention reads each row's context from
//!   the cache through its block table and context length, straight from the
//!   buffers ([`PagedContext`]): no slot list, no mask, and no shape that
//!   depends on the context, so one decode graph serves every length. Nothing
//!   is read back or uploaded here: the step's inputs were written into the
//!   buffers once.

use burn::prelude::*;

use super::buffers::DecodeBuffers;
use crate::kv::slot_of;
use crate::model::AttentionMeta;
use crate::ops::{AttentionContext, PagedContext};

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

/// One row of a prefill step: the next tokens of a prompt, the positions
/// before them already in the cache, and the sequence's blocks.
#[derive(Debug, Clone, Copy)]
pub struct PrefillSeq<'a> {
    /// The tokens to compute now (the whole prompt, or a chunk of it).
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: how many tokens before it are in the cache
    /// (a prefix-cache hit, earlier chunks).
    pub start: usize,
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
/// rows must be non-empty). `pad_slot` takes the padding rows' K/V. Rows
/// with a cached context (`start > 0`) attend over exactly that context.
pub fn prefill_inputs(
    seqs: &[PrefillSeq<'_>],
    shape: PrefillShape,
    block_size: usize,
    pad_slot: usize,
    device: &Device,
) -> StepInputs {
    let context = seqs
        .iter()
        .any(|s| s.start > 0)
        .then(|| seqs.iter().map(|s| s.start + s.tokens.len()).max())
        .flatten();
    prefill_inputs_over(seqs, shape, context, block_size, pad_slot, device)
}

/// [`prefill_inputs`] with the context length chosen by the caller.
///
/// - `context: None`: every row starts at position 0 and attends over its
///   fresh K/V only (`T = Q`, nothing is gathered).
/// - `context: Some(T)`, `T >= start + len` of every row: each row's context,
///   its cached prefix and the new tokens (written to the cache first, in the
///   same layer), is gathered from the cache through its block table; keys
///   past the row's end read the padding slot and are masked. Query `i` of a
///   row sees keys `j <= start + i`.
pub fn prefill_inputs_over(
    seqs: &[PrefillSeq<'_>],
    shape: PrefillShape,
    context: Option<usize>,
    block_size: usize,
    pad_slot: usize,
    device: &Device,
) -> StepInputs {
    let PrefillShape { rows: b, len: q } = shape;
    let t = context.unwrap_or(q);
    debug_assert!(b >= seqs.len() && seqs.iter().all(|s| s.tokens.len() <= q));
    debug_assert!(context.is_some() || seqs.iter().all(|s| s.start == 0));
    debug_assert!(seqs.iter().all(|s| s.start + s.tokens.len() <= t));
    let mut tokens = vec![0i32; b * q];
    let mut positions = vec![0i32; b * q];
    let mut write_slots = vec![pad_slot as i32; b * q];
    let mut context_slots = vec![pad_slot as i32; if context.is_some() { b * t } else { 0 }];
    let mut last_rows = vec![0i32; b];
    let mut starts = vec![0i32; b];
    let mut ends = vec![0i32; b];
    for (i, s) in seqs.iter().enumerate() {
        for p in 0..q {
            // Padding tokens of a real row sit at position 0 (any valid one).
            positions[i * q + p] = if p < s.tokens.len() {
                (s.start + p) as i32
            } else {
                0
            };
        }
        for (p, &tok) in s.tokens.iter().enumerate() {
            tokens[i * q + p] = tok as i32;
            write_slots[i * q + p] = slot_of(s.table, block_size, s.start + p) as i32;
        }
        let end = s.start + s.tokens.len();
        if context.is_some() {
            for pos in 0..end {
                context_slots[i * t + pos] = slot_of(s.table, block_size, pos) as i32;
            }
        }
        last_rows[i] = (i * q + s.tokens.len().max(1) - 1) as i32;
        starts[i] = s.start as i32;
        ends[i] = end as i32;
    }

    // masked[b, 0, i, j] = j > start[b] + i (future) || j >= end[b] (padding key).
    let mask = [b, 1, q, t];
    let i = Tensor::<1, Int>::arange(0..q as i64, device).reshape([1, 1, q, 1]);
    let starts = ints::<1>(starts, [b], device).reshape([b, 1, 1, 1]);
    let i = (i + starts).expand(mask);
    let j = Tensor::<1, Int>::arange(0..t as i64, device)
        .reshape([1, 1, 1, t])
        .expand(mask);
    let end = ints::<1>(ends, [b], device)
        .reshape([b, 1, 1, 1])
        .expand(mask);
    let masked = j.clone().greater(i).bool_or(j.greater_equal(end));

    StepInputs {
        tokens: ints(tokens, [b, q], device),
        positions: ints(positions, [b, q], device),
        last_rows: ints(last_rows, [b], device),
        meta: AttentionMeta {
            write_slots: ints(write_slots, [b * q], device),
            context: match context {
                Some(len) => AttentionContext::Gathered {
                    slots: ints(context_slots, [b * t], device),
                    len,
                    mask: masked,
                },
                None => AttentionContext::Fresh { mask: masked },
            },
        },
    }
}

/// The decode step's inputs from `buffers` (already written for this step);
/// contexts of at most `max_context` positions in blocks of `block_size`.
pub fn decode_inputs(buffers: &DecodeBuffers, block_size: usize, max_context: usize) -> StepInputs {
    let b = buffers.rows();
    StepInputs {
        tokens: buffers.tokens.tensor().reshape([b, 1]),
        positions: buffers.positions.tensor().reshape([b, 1]),
        last_rows: buffers.last_rows.clone(),
        meta: AttentionMeta {
            write_slots: buffers.write_slots.tensor(),
            context: AttentionContext::Paged(PagedContext {
                tables: buffers.tables.tensor(),
                lens: buffers.context_lens.tensor(),
                block_size,
                max_context,
                arrivals: Some(buffers.arrivals.clone()),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::step::buffers::DecodeRow;

    fn ints_of<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
        t.into_data().iter::<i64>().collect()
    }

    fn bools(t: Tensor<4, Bool>) -> Vec<bool> {
        t.into_data().iter::<bool>().collect()
    }

    /// The mask of a prefill context, and its gathered slots (if any).
    fn prefill_context(
        ctx: AttentionContext,
    ) -> (Tensor<4, Bool>, Option<(Tensor<1, Int>, usize)>) {
        match ctx {
            AttentionContext::Fresh { mask } => (mask, None),
            AttentionContext::Gathered { slots, len, mask } => (mask, Some((slots, len))),
            AttentionContext::Paged(_) => panic!("a prefill step is not paged"),
        }
    }

    #[test]
    fn prefill_mask_is_causal_and_hides_padding() {
        let dev = Device::flex();
        let (a, b) = ([1u32, 2, 3], [7u32]);
        let seqs = [
            PrefillSeq {
                tokens: &a,
                start: 0,
                table: &[0],
            },
            PrefillSeq {
                tokens: &b,
                start: 0,
                table: &[1],
            },
        ];
        let shape = PrefillShape { rows: 3, len: 3 };
        let inputs = prefill_inputs(&seqs, shape, 4, 99, &dev);
        let (mask, gathered) = prefill_context(inputs.meta.context);
        assert!(gathered.is_none());
        let m = bools(mask);
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
    fn a_chunk_attends_over_its_cached_context() {
        let dev = Device::flex();
        // Row 0: positions 5..7 after 5 cached ones (blocks 3, 1 of size 4);
        // row 1: a fresh 2-token prompt in block 2.
        let (a, b) = ([8u32, 9], [4u32, 6]);
        let seqs = [
            PrefillSeq {
                tokens: &a,
                start: 5,
                table: &[3, 1],
            },
            PrefillSeq {
                tokens: &b,
                start: 0,
                table: &[2],
            },
        ];
        let shape = PrefillShape { rows: 2, len: 2 };
        let inputs = prefill_inputs(&seqs, shape, 4, 99, &dev);
        let (mask, gathered) = prefill_context(inputs.meta.context);
        let (slots, len) = gathered.expect("a gathered context");
        assert_eq!(len, 7);
        #[rustfmt::skip]
        assert_eq!(ints_of(slots), [
            12, 13, 14, 15, 4, 5, 6,
            8, 9, 99, 99, 99, 99, 99,
        ]);
        assert_eq!(ints_of(inputs.meta.write_slots), [5, 6, 8, 9]);
        assert_eq!(ints_of(inputs.positions), [5, 6, 0, 1]);
        assert_eq!(ints_of(inputs.last_rows), [1, 3]);
        let m = bools(mask);
        let f = false;
        #[rustfmt::skip]
        assert_eq!(m, [
            f, f, f, f, f, f, true,   f, f, f, f, f, f, f,          // sees 0..=5, then 0..=6
            f, true, true, true, true, true, true,   f, f, true, true, true, true, true,
        ]);
    }

    #[test]
    fn decode_reads_tables_and_lengths_from_the_buffers() {
        let dev = Device::flex();
        let mut buffers = DecodeBuffers::new(4, 3, 10, 2, &dev);
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
        let inputs = decode_inputs(&buffers, 2, 6);
        let AttentionContext::Paged(paged) = inputs.meta.context else {
            panic!("decode is paged");
        };
        // Tables padded with the padding block 7; padding rows read only it.
        #[rustfmt::skip]
        assert_eq!(ints_of(paged.tables), [3, 0, 7,   1, 7, 7,   7, 7, 7,   7, 7, 7]);
        assert_eq!(ints_of(paged.lens), [3, 1, 1, 1]);
        assert_eq!(ints_of(inputs.meta.write_slots), [0, 2, 14, 14]);
        assert_eq!(ints_of(inputs.tokens), [5, 6, 0, 0]);
        assert_eq!(ints_of(inputs.positions), [2, 0, 0, 0]);
    }
}
