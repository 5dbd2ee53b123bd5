//! One step's model inputs: prefill steps built on the host, decode steps
//! derived on the device from the persistent [`DecodeBuffers`]. Either way
//! the model sees one flat sequence of `N` new tokens.
//!
//! - Prefill concatenates its rows' new tokens (a whole prompt, or a chunk of
//!   one after earlier chunks or a prefix-cache hit) into one sequence of `T`
//!   tokens, padded on CUDA to the step's token bucket, and describes the
//!   rows with small int tensors ([`crate::ops::SegmentContext`]): query offsets
//!   (`cu_seqlens`), each row's first position (`start`, its tokens already
//!   cached), its block table, and the attention tiles; rows may be padded
//!   too (empty segments). Every token is written to the cache (a real one at
//!   its sequence's slot, a padding token at the padding block's first slot,
//!   which nothing real reads), then each row's query `i` attends over
//!   positions `0 ..= start + i` of its own sequence, read in place. Logits
//!   are taken only at each row's last token (`last_rows`).
//! - Decode feeds one token per row. Attention reads each row's context from
//!   the cache through its block table and context length, straight from the
//!   buffers ([`PagedContext`]): no shape depends on the context, so one
//!   decode graph serves every length. Nothing is read back or uploaded here:
//!   the step's inputs were written into the buffers once.

use burn::prelude::*;

use super::buffers::DecodeBuffers;
use crate::kv::slot_of;
use crate::model::AttentionMeta;
use crate::ops::{
    AttentionContext, PagedContext, SegmentHost, SegmentPadding, SegmentRow, TableGeometry,
};

/// Everything [`Gpt2::forward`](crate::model::Gpt2::forward) needs for one step.
#[derive(Debug, Clone)]
pub struct StepInputs {
    /// `[N]` token ids.
    pub tokens: Tensor<1, Int>,
    /// `[N]` their positions.
    pub positions: Tensor<1, Int>,
    /// `[R]` the tokens whose logits are needed, one per row.
    pub last_rows: Tensor<1, Int>,
    pub meta: AttentionMeta,
    /// Decode steps: the previous decode step's choice (`[max_batch, 1]`),
    /// where rows fed with [`Feed::Previous`](super::buffers::Feed) find
    /// their token ([`resolve_tokens`]).
    pub previous: Option<Tensor<2, Int>>,
}

/// `tokens` with each `-(r + 1)` replaced by row `r` of `previous` (`[N,
/// 1]`): a decode row fed the previous step's choice, which only the device
/// has yet. Three small ops inside the step (a captured graph replays them).
pub fn resolve_tokens(tokens: Tensor<1, Int>, previous: Tensor<2, Int>) -> Tensor<1, Int> {
    let [n, _] = previous.dims();
    let fed = tokens.clone().lower_elem(0);
    let rows = tokens.clone().neg().sub_scalar(1).clamp_min(0);
    tokens.mask_where(fed, previous.reshape([n]).select(0, rows))
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

/// The padded shape of a prefill step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillShape {
    /// Flat tokens: the rows' tokens, then padding tokens.
    pub tokens: usize,
    /// Rows: the real ones, then empty ones.
    pub rows: usize,
    /// Length of the attention tile list (padded with tiles that compute
    /// nothing), or `None`: exactly the rows' tiles.
    pub tiles: Option<usize>,
}

fn ints(values: Vec<i32>, device: &Device) -> Tensor<1, Int> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// A prefill step's inputs on the host ([`PrefillHost::new`]): uploaded as
/// fresh tensors ([`prefill_inputs`]) or written into a captured step's
/// buffers (`super::prefill_buffers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillHost {
    /// `[T]` each.
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    pub write_slots: Vec<i32>,
    /// `[R]`.
    pub last_rows: Vec<i32>,
    pub segments: SegmentHost,
}

impl PrefillHost {
    /// A prefill step over `seqs` (each non-empty, together at most
    /// `shape`'s tokens and rows), with block tables of `geometry`.
    pub fn new(seqs: &[PrefillSeq<'_>], shape: PrefillShape, geometry: TableGeometry) -> Self {
        let t = shape.tokens;
        let r = shape.rows.max(seqs.len()).max(1);
        debug_assert!(seqs.iter().map(|s| s.tokens.len()).sum::<usize>() <= t);
        let pad_slot = geometry.padding_block as usize * geometry.block_size;
        let mut tokens = vec![0i32; t];
        // Padding tokens sit at position 0 (any valid one) of the padding slot.
        let mut positions = vec![0i32; t];
        let mut write_slots = vec![pad_slot as i32; t];
        let mut last_rows = vec![0i32; r];
        let mut n = 0;
        for (i, s) in seqs.iter().enumerate() {
            for (p, &tok) in s.tokens.iter().enumerate() {
                tokens[n + p] = tok as i32;
                positions[n + p] = (s.start + p) as i32;
                write_slots[n + p] = slot_of(s.table, geometry.block_size, s.start + p) as i32;
            }
            n += s.tokens.len();
            last_rows[i] = n.saturating_sub(1) as i32;
        }
        let rows: Vec<SegmentRow<'_>> = seqs
            .iter()
            .map(|s| SegmentRow {
                queries: s.tokens.len(),
                start: s.start,
                table: s.table,
            })
            .collect();
        let padding = SegmentPadding {
            rows: r,
            tiles: shape.tiles,
        };
        Self {
            tokens,
            positions,
            write_slots,
            last_rows,
            segments: SegmentHost::new(&rows, padding, geometry),
        }
    }
}

/// Builds a prefill step over `seqs` (each non-empty, together at most
/// `shape`'s tokens and rows), with block tables of `geometry`, as fresh
/// device tensors.
pub fn prefill_inputs(
    seqs: &[PrefillSeq<'_>],
    shape: PrefillShape,
    geometry: TableGeometry,
    device: &Device,
) -> StepInputs {
    PrefillHost::new(seqs, shape, geometry).upload(device)
}

impl PrefillHost {
    /// The step's inputs as fresh device tensors.
    pub fn upload(self, device: &Device) -> StepInputs {
        StepInputs {
            tokens: ints(self.tokens, device),
            positions: ints(self.positions, device),
            last_rows: ints(self.last_rows, device),
            meta: AttentionMeta {
                write_slots: ints(self.write_slots, device),
                context: AttentionContext::Segments(self.segments.upload(device)),
            },
            previous: None,
        }
    }
}

/// The decode step's inputs from `buffers` (already written for this step);
/// contexts of at most `max_context` positions in blocks of `block_size`;
/// `previous`: the previous decode step's choice.
pub fn decode_inputs(
    buffers: &DecodeBuffers,
    block_size: usize,
    max_context: usize,
    previous: Tensor<2, Int>,
) -> StepInputs {
    StepInputs {
        tokens: buffers.tokens.tensor(),
        positions: buffers.positions.tensor(),
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
        previous: Some(previous),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::SegmentContext;
    use crate::sampling::DeviceSampling;
    use crate::step::buffers::{DecodeRow, Feed};

    fn ints_of<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
        t.into_data().iter::<i64>().collect()
    }

    fn segments(ctx: AttentionContext) -> SegmentContext {
        match ctx {
            AttentionContext::Segments(seg) => seg,
            AttentionContext::Paged(_) => panic!("a prefill step has segments"),
        }
    }

    const GEOMETRY: TableGeometry = TableGeometry {
        block_size: 4,
        width: 2,
        padding_block: 24,
    };

    #[test]
    fn prefill_flattens_the_rows_and_pads_tokens_rows_and_tiles() {
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
        let shape = PrefillShape {
            tokens: 6,
            rows: 3,
            tiles: Some(4),
        };
        let inputs = prefill_inputs(&seqs, shape, GEOMETRY, &dev);
        assert_eq!(ints_of(inputs.tokens), [1, 2, 3, 7, 0, 0]);
        assert_eq!(ints_of(inputs.positions), [0, 1, 2, 0, 0, 0]);
        // Real tokens at their slots, padding tokens at the padding slot (96).
        assert_eq!(ints_of(inputs.meta.write_slots), [0, 1, 2, 4, 96, 96]);
        assert_eq!(ints_of(inputs.last_rows), [2, 3, 0]);
        let seg = segments(inputs.meta.context);
        assert_eq!(ints_of(seg.cu_seqlens), [0, 3, 4, 4]);
        assert_eq!(ints_of(seg.starts), [0, 0, 0]);
        assert_eq!(ints_of(seg.tables), [0, 24, 1, 24, 24, 24]);
        let no = i64::from(i32::MAX);
        assert_eq!(ints_of(seg.tiles), [0, 0, 1, 0, 0, no, 0, no]);
    }

    #[test]
    fn a_chunk_starts_after_its_cached_positions() {
        let dev = Device::flex();
        // Row 0: positions 5..7 after 5 cached ones (blocks 3, 1 of size 4);
        // row 1: a fresh 2-token prompt in block 2. Exact (CPU) shape.
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
        let shape = PrefillShape {
            tokens: 4,
            rows: 2,
            tiles: None,
        };
        let inputs = prefill_inputs(&seqs, shape, GEOMETRY, &dev);
        assert_eq!(ints_of(inputs.meta.write_slots), [5, 6, 8, 9]);
        assert_eq!(ints_of(inputs.positions), [5, 6, 0, 1]);
        assert_eq!(ints_of(inputs.last_rows), [1, 3]);
        let seg = segments(inputs.meta.context);
        assert_eq!(ints_of(seg.cu_seqlens), [0, 2, 4]);
        assert_eq!(ints_of(seg.starts), [5, 0]);
        assert_eq!(ints_of(seg.tables), [3, 1, 2, 24]);
        assert_eq!(ints_of(seg.tiles), [0, 0, 1, 0]);
        assert_eq!((seg.max_queries, seg.max_context), (2, 7));
    }

    #[test]
    fn decode_reads_tables_and_lengths_from_the_buffers() {
        let dev = Device::flex();
        let mut buffers = DecodeBuffers::new((4, 3, 10, 2), &dev, DeviceSampling::default(), None);
        let rows = [
            DecodeRow {
                token: Feed::Token(5),
                pos: 2,
                table: &[3, 0],
            },
            DecodeRow {
                token: Feed::Previous(2),
                pos: 0,
                table: &[1],
            },
        ];
        buffers.write(&rows, 2, 7);
        let previous =
            Tensor::<2, Int>::from_data(TensorData::new(vec![1i32, 2, 8, 3], [4, 1]), &dev);
        let inputs = decode_inputs(&buffers, 2, 6, previous.clone());
        let AttentionContext::Paged(paged) = inputs.meta.context else {
            panic!("decode is paged");
        };
        // Tables padded with the padding block 7; padding rows read only it.
        #[rustfmt::skip]
        assert_eq!(ints_of(paged.tables), [3, 0, 7,   1, 7, 7,   7, 7, 7,   7, 7, 7]);
        assert_eq!(ints_of(paged.lens), [3, 1, 1, 1]);
        assert_eq!(ints_of(inputs.meta.write_slots), [0, 2, 14, 14]);
        // Row 1 is fed row 2 of the previous step's choice.
        assert_eq!(ints_of(inputs.tokens.clone()), [5, -3, 0, 0]);
        assert_eq!(
            ints_of(resolve_tokens(inputs.tokens, previous)),
            [5, 8, 0, 0]
        );
        assert_eq!(ints_of(inputs.positions), [2, 0, 0, 0]);
    }
}
