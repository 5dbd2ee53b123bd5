//! Persistent device buffers of one prefill shape, which its captured steps
//! read (`super::graphs`): the decode buffers' idea (`super::buffers`) for
//! a prefill step of a fixed token bucket and row count.
//!
//! Each step's host-built inputs ([`PrefillHost`]: the flat tokens, their
//! positions and cache slots, each row's last token, and the segments'
//! offsets, starts, block tables and attention tiles) are written into the
//! same buffers, in place on CUDA, so the graph captured over them sees the
//! new step on every replay. A bucketed shape fixes every buffer's size
//! (the tile list is padded to the shape's bound), which is what makes a
//! prefill step capturable at all.

use burn::prelude::*;

use super::inputs::{PrefillHost, PrefillShape, StepInputs};
use crate::model::AttentionMeta;
use crate::ops::{AttentionContext, InputBuffer, SegmentContext, TableGeometry};
use crate::sampling::{DeviceSampling, SamplingParamsRows};

/// The persistent inputs of prefill steps of one shape.
#[derive(Debug)]
pub struct PrefillBuffers {
    /// `[T]` each.
    tokens: InputBuffer<1, Int>,
    positions: InputBuffer<1, Int>,
    write_slots: InputBuffer<1, Int>,
    /// `[R]`.
    last_rows: InputBuffer<1, Int>,
    /// `[R + 1]`, `[R]`, `[R, W]`, `[n, 2]`.
    cu_seqlens: InputBuffer<1, Int>,
    starts: InputBuffer<1, Int>,
    tables: InputBuffer<2, Int>,
    tiles: InputBuffer<2, Int>,
    block_size: usize,
    /// The last step's longest segment and context (the tensor-op
    /// reference's padding; no kernel reads them).
    max_queries: usize,
    max_context: usize,
    /// Per-row sampling parameters (with their masks: a graph captured over
    /// them reads every row's).
    pub sampling: SamplingParamsRows,
}

impl PrefillBuffers {
    /// Buffers of `shape` (bucketed: its tile bound known) with tables of
    /// `geometry`, sampling over `vocab` tokens where `sampling` says,
    /// holding a step of padding only (written now, so the memory exists
    /// before any capture).
    pub fn new(
        (shape, geometry): (PrefillShape, TableGeometry),
        vocab: usize,
        device: &Device,
        sampling: DeviceSampling,
    ) -> Self {
        let host = PrefillHost::new(&[], shape, geometry);
        let seg = &host.segments;
        let (t, r, w, n) = (shape.tokens, seg.rows, seg.width, seg.n_tiles());
        let mut buffers = Self {
            tokens: InputBuffer::zeros([t], device),
            positions: InputBuffer::zeros([t], device),
            write_slots: InputBuffer::zeros([t], device),
            last_rows: InputBuffer::zeros([r], device),
            cu_seqlens: InputBuffer::zeros([r + 1], device),
            starts: InputBuffer::zeros([r], device),
            tables: InputBuffer::zeros([r, w], device),
            tiles: InputBuffer::zeros([n, 2], device),
            block_size: geometry.block_size,
            max_queries: 1,
            max_context: 1,
            sampling: SamplingParamsRows::new(r, vocab, device, sampling).resident(None),
        };
        buffers.write(host);
        buffers
    }

    /// Writes a step's inputs (built for this buffers' shape and geometry),
    /// each buffer only where it changed since the last step of this shape
    /// (a fresh prompt's positions, offsets, starts and tiles repeat).
    pub fn write(&mut self, host: PrefillHost) {
        let seg = host.segments;
        self.tokens.write_changed(host.tokens);
        self.positions.write_changed(host.positions);
        self.write_slots.write_changed(host.write_slots);
        self.last_rows.write_changed(host.last_rows);
        self.cu_seqlens.write_changed(seg.cu_seqlens);
        self.starts.write_changed(seg.starts);
        self.tables.write_changed(seg.tables);
        self.tiles.write_changed(seg.tiles);
        self.max_queries = seg.max_queries;
        self.max_context = seg.max_context;
    }

    /// Names of the buffers whose contents are not `host`'s (read back
    /// from the device: the bench's probe, `super::runner`).
    pub fn differing(&self, host: &PrefillHost) -> Vec<&'static str> {
        let seg = &host.segments;
        let wanted: [(&'static str, Vec<i64>, &[i32]); 8] = [
            ("tokens", read(&self.tokens), &host.tokens),
            ("positions", read(&self.positions), &host.positions),
            ("write_slots", read(&self.write_slots), &host.write_slots),
            ("last_rows", read(&self.last_rows), &host.last_rows),
            ("cu_seqlens", read(&self.cu_seqlens), &seg.cu_seqlens),
            ("starts", read(&self.starts), &seg.starts),
            ("tables", read(&self.tables), &seg.tables),
            ("tiles", read(&self.tiles), &seg.tiles),
        ];
        wanted
            .into_iter()
            .filter(|(_, got, want)| !got.iter().copied().eq(want.iter().map(|&v| i64::from(v))))
            .map(|(name, _, _)| name)
            .collect()
    }

    /// The step's inputs: views of the buffers.
    pub fn inputs(&self) -> StepInputs {
        StepInputs {
            tokens: self.tokens.tensor(),
            positions: self.positions.tensor(),
            last_rows: self.last_rows.tensor(),
            meta: AttentionMeta {
                write_slots: self.write_slots.tensor(),
                context: AttentionContext::Segments(SegmentContext {
                    cu_seqlens: self.cu_seqlens.tensor(),
                    starts: self.starts.tensor(),
                    tables: self.tables.tensor(),
                    tiles: self.tiles.tensor(),
                    block_size: self.block_size,
                    max_queries: self.max_queries,
                    max_context: self.max_context,
                }),
            },
            previous: None,
        }
    }
}

/// A buffer's contents, read back.
fn read<const D: usize>(buffer: &InputBuffer<D, Int>) -> Vec<i64> {
    buffer.tensor().into_data().iter::<i64>().collect()
}
