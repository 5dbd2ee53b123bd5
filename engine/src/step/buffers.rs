//! Persistent device buffers that hold a decode step's per-row inputs.
//!
//! One [`DecodeBuffers`] exists per decode bucket (a fixed row count). Each
//! step writes the rows' token ids, positions, cache slots, block tables,
//! context lengths and sampling parameters into the same buffers with one
//! host->device copy each ([`InputBuffer::write`], in place on CUDA) and the step's tensor ops
//! read them from there. On CUDA the copy lands in the buffer's existing device
//! memory, so a captured CUDA graph that reads these buffers sees new inputs on
//! every replay; on the CPU a fresh tensor replaces the old one (nothing is
//! captured there, and a host copy is all a write costs).
//!
//! Rows past the batch pad it to the bucket: token 0 at position 0, writing and
//! reading only the padding block, sampled greedily and discarded.
//!
//! A row's token is either one the host knows or, in the overlapped step
//! loop, a pointer to the previous decode step's choice the host has not
//! read yet ([`Feed::Previous`]), which the step itself looks up on the
//! device.

use burn::prelude::*;

use crate::kv::slot_of;
use crate::ops::InputBuffer;
use crate::sampling::{DeviceSampling, SamplingParamsRows, SamplingTable};

/// The token a decode row feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// A token the host knows (the last one it read back).
    Token(u32),
    /// The token row `r` of the previous decode step chose, still on the
    /// device (the host has not read it yet: the overlapped step loop);
    /// written as `-(r + 1)` and resolved inside the step
    /// ([`super::inputs::resolve_tokens`]).
    Previous(usize),
}

impl Feed {
    /// The value written into the tokens buffer.
    fn encoded(self) -> i32 {
        match self {
            Feed::Token(t) => t as i32,
            Feed::Previous(r) => -(r as i32) - 1,
        }
    }
}

/// One real row of a decode step.
#[derive(Debug, Clone, Copy)]
pub struct DecodeRow<'a> {
    /// The token to feed (the last one sampled).
    pub token: Feed,
    /// Its position (= tokens already in the cache).
    pub pos: usize,
    /// The sequence's block table.
    pub table: &'a [u32],
}

/// The persistent inputs of decode steps of one bucket size.
#[derive(Debug)]
pub struct DecodeBuffers {
    rows: usize,
    table_width: usize,
    device: Device,
    /// `[rows]` token fed to each row (or where to find it: [`Feed`]).
    pub tokens: InputBuffer<1, Int>,
    /// `[rows]` position of that token.
    pub positions: InputBuffer<1, Int>,
    /// `[rows]` cache slot its K/V is written to.
    pub write_slots: InputBuffer<1, Int>,
    /// `[rows, table_width]` block tables, padded with the padding block.
    pub tables: InputBuffer<2, Int>,
    /// `[rows]` tokens each row attends over (its cached tokens plus the new one).
    pub context_lens: InputBuffer<1, Int>,
    /// `[rows]` `0..rows` (constant): every row's logits are needed.
    pub last_rows: Tensor<1, Int>,
    /// `[rows * heads]` zeros: the counters the CUDA attention kernel uses to
    /// split a context across cubes (each launch leaves them at zero).
    pub arrivals: Tensor<1, Int>,
    /// Per-row sampling parameters.
    pub sampling: SamplingParamsRows,
}

impl DecodeBuffers {
    /// Buffers for `rows` rows with block tables `table_width` blocks wide,
    /// sampling over `vocab` tokens where `sampling` says (penalized rows
    /// reading `counts`, the runner's penalty counts), for a model of
    /// `heads` attention heads.
    pub fn new(
        (rows, table_width, vocab, heads): (usize, usize, usize, usize),
        device: &Device,
        sampling: DeviceSampling,
        counts: Option<Tensor<2, Int>>,
    ) -> Self {
        Self {
            rows,
            table_width,
            device: device.clone(),
            tokens: InputBuffer::zeros([rows], device),
            positions: InputBuffer::zeros([rows], device),
            write_slots: InputBuffer::zeros([rows], device),
            tables: InputBuffer::zeros([rows, table_width], device),
            context_lens: InputBuffer::zeros([rows], device),
            last_rows: Tensor::arange(0..rows as i64, device),
            arrivals: Tensor::zeros([rows * heads], device),
            sampling: SamplingParamsRows::new(rows, vocab, device, sampling).resident(counts),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Writes this step's rows (at most `rows()`; the rest become padding rows
    /// on `padding_block`).
    pub fn write(&mut self, batch: &[DecodeRow<'_>], block_size: usize, padding_block: u32) {
        debug_assert!(batch.len() <= self.rows);
        let (n, w) = (self.rows, self.table_width);
        let pad_slot = padding_block as usize * block_size;
        let mut tokens = vec![0i32; n];
        let mut positions = vec![0i32; n];
        let mut slots = vec![pad_slot as i32; n];
        let mut tables = vec![padding_block as i32; n * w];
        let mut lens = vec![1i32; n];
        for (i, row) in batch.iter().enumerate() {
            tokens[i] = row.token.encoded();
            positions[i] = row.pos as i32;
            slots[i] = slot_of(row.table, block_size, row.pos) as i32;
            for (j, &blk) in row.table.iter().take(w).enumerate() {
                tables[i * w + j] = blk as i32;
            }
            lens[i] = (row.pos + 1) as i32;
        }
        self.tokens.write(tokens);
        self.positions.write(positions);
        self.write_slots.write(slots);
        self.tables.write(tables);
        self.context_lens.write(lens);
    }

    /// Writes the rows' sampling table (padding rows are greedy).
    pub fn write_sampling(&mut self, table: &SamplingTable) {
        self.sampling.write(table);
    }
}
