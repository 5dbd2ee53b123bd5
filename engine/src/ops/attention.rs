//! What an attention op needs to know about a step: where each query's keys
//! and values are ([`AttentionContext`]).
//!
//! Both kinds of step read K and V in place from the paged cache, through
//! block tables, after the step's own K/V rows were written there (in every
//! layer, before attention): nothing is gathered and no mask tensor exists.
//!
//! - Decode ([`PagedContext`]): one query per sequence (row `b` of `qkv`)
//!   over its context length.
//! - Prefill ([`SegmentContext`]): the step's new tokens of all rows
//!   concatenated into one flat `qkv` (`[T, 3E]`); row `r` owns the
//!   segment `cu_seqlens[r] .. cu_seqlens[r + 1]`, its query `i` sits at
//!   position `start[r] + i` and sees positions `0 ..= start[r] + i` of its
//!   own sequence. A fresh prompt (`start = 0`), a chunk after earlier
//!   chunks and a prefix-cache hit are the same case.
//!
//! Shapes: `T` flat tokens (padded on CUDA), `R` rows (padded on CUDA with
//! empty segments), `W` blocks per table, `H` heads.

use burn::prelude::*;

use super::plan::{self, NO_TILE};

/// Where a step's queries find their keys and values. The step's own new
/// K/V rows are always in the cache already (written first, in every layer).
// One per step, passed by reference to every layer: the variants' sizes
// (tensor handles) cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum AttentionContext {
    /// Decode: one query per sequence over its context.
    Paged(PagedContext),
    /// Prefill: segments of a flat token sequence, each over its causal context.
    Segments(SegmentContext),
}

/// Where each sequence's context lives in the paged cache, for decode steps
/// whose attention walks the block tables itself (the CPU kernel in
/// [`super::cpu::paged_attention`], the CUDA kernel in `super::cuda`).
#[derive(Debug, Clone)]
pub struct PagedContext {
    /// `[B, W]` block ids of each sequence (padded with the padding block).
    pub tables: Tensor<2, Int>,
    /// `[B]` visible context positions per sequence (its cached tokens plus the new one).
    pub lens: Tensor<1, Int>,
    pub block_size: usize,
    /// Longest context a sequence can have (the model's `n_positions`).
    pub max_context: usize,
    /// At least `[B * H]` 32-bit counters, zero between steps, that let the
    /// CUDA kernel split one context across several cubes (it leaves them at
    /// zero). `None`: no splitting (and the CPU path never reads them).
    pub arrivals: Option<Tensor<1, Int>>,
}

/// A prefill step's segments (see the module docs): small int tensors built
/// on the host ([`SegmentContext::new`]).
#[derive(Debug, Clone)]
pub struct SegmentContext {
    /// `[R + 1]` query offsets (`cu_seqlens`): row `r`'s queries are the flat
    /// rows `cu[r] .. cu[r + 1]`. Padding rows are empty; padding tokens
    /// (from `cu[R]` on) belong to no row and attend to nothing (output 0).
    pub cu_seqlens: Tensor<1, Int>,
    /// `[R]` positions of each row already in the cache (its first query's position).
    pub starts: Tensor<1, Int>,
    /// `[R, W]` block tables, padded with the padding block.
    pub tables: Tensor<2, Int>,
    /// `[n, 2]` `(row, first query)` of each tile of up to
    /// [`plan::PREFILL_TILE`] queries of one row ([`plan::prefill_tiles`]),
    /// then padding tiles ([`NO_TILE`]) on CUDA.
    pub tiles: Tensor<2, Int>,
    pub block_size: usize,
    /// Most queries of one row (at least 1): the tensor-op reference's padded
    /// query length.
    pub max_queries: usize,
    /// Most context positions of one row, `start + queries` (at least 1): the
    /// reference's padded key length.
    pub max_context: usize,
}

/// One row of a prefill step, as [`SegmentContext::new`] takes it.
#[derive(Debug, Clone, Copy)]
pub struct SegmentRow<'a> {
    /// New tokens (queries) of the row, at least 1.
    pub queries: usize,
    /// Positions before them already in the cache.
    pub start: usize,
    /// The sequence's block table (at least `start + queries` positions).
    pub table: &'a [u32],
}

/// The block tables' geometry: blocks of `block_size` positions, tables
/// `width` blocks wide, padded with `padding_block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableGeometry {
    pub block_size: usize,
    pub width: usize,
    pub padding_block: u32,
}

/// A prefill step's padded segment layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPadding {
    /// Rows, at least the real ones (the rest are empty).
    pub rows: usize,
    /// Length of the tile list (at least the real tiles; the rest are
    /// [`NO_TILE`]), or `None`: exactly the real tiles.
    pub tiles: Option<usize>,
}

impl SegmentContext {
    /// The segments of `rows` (in flat order), padded to `padding`, with
    /// tables of `geometry`, uploaded to `device`.
    pub fn new(
        rows: &[SegmentRow<'_>],
        padding: SegmentPadding,
        geometry: TableGeometry,
        device: &Device,
    ) -> Self {
        SegmentHost::new(rows, padding, geometry).upload(device)
    }
}

/// A [`SegmentContext`]'s contents on the host, before they are uploaded
/// (or written into a captured prefill step's buffers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHost {
    /// `[R + 1]`, `[R]`, `[R, W]` (row-major) and `[n, 2]` (row-major).
    pub cu_seqlens: Vec<i32>,
    pub starts: Vec<i32>,
    pub tables: Vec<i32>,
    pub tiles: Vec<i32>,
    pub rows: usize,
    pub width: usize,
    pub block_size: usize,
    pub max_queries: usize,
    pub max_context: usize,
}

impl SegmentHost {
    /// See [`SegmentContext::new`].
    pub fn new(rows: &[SegmentRow<'_>], padding: SegmentPadding, geometry: TableGeometry) -> Self {
        let r = padding.rows.max(rows.len()).max(1);
        let w = geometry.width;
        let mut cu = Vec::with_capacity(r + 1);
        let mut starts = vec![0i32; r];
        let mut tables = vec![geometry.padding_block as i32; r * w];
        let mut end = 0usize;
        cu.push(0);
        for (i, row) in rows.iter().enumerate() {
            end += row.queries;
            cu.push(end as i32);
            starts[i] = row.start as i32;
            for (j, &block) in row.table.iter().take(w).enumerate() {
                tables[i * w + j] = block as i32;
            }
        }
        cu.resize(r + 1, end as i32);
        let lens: Vec<usize> = rows.iter().map(|row| row.queries).collect();
        let mut tiles = plan::prefill_tiles(&lens);
        if let Some(n) = padding.tiles {
            tiles.resize(n.max(tiles.len()), NO_TILE);
        }
        Self {
            cu_seqlens: cu,
            starts,
            tables,
            tiles: tiles.concat(),
            rows: r,
            width: w,
            block_size: geometry.block_size,
            max_queries: lens.iter().copied().max().unwrap_or(1).max(1),
            max_context: rows
                .iter()
                .map(|row| row.start + row.queries)
                .max()
                .unwrap_or(1)
                .max(1),
        }
    }

    /// The tile list's length.
    pub fn n_tiles(&self) -> usize {
        self.tiles.len() / 2
    }

    /// The context these values describe, as fresh device tensors.
    pub fn upload(self, device: &Device) -> SegmentContext {
        let (r, w, n) = (self.rows, self.width, self.n_tiles());
        SegmentContext {
            cu_seqlens: ints(self.cu_seqlens, [r + 1], device),
            starts: ints(self.starts, [r], device),
            tables: ints(self.tables, [r, w], device),
            tiles: ints(self.tiles, [n, 2], device),
            block_size: self.block_size,
            max_queries: self.max_queries,
            max_context: self.max_context,
        }
    }
}

fn ints<const D: usize>(values: Vec<i32>, shape: [usize; D], device: &Device) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints_of<const D: usize>(t: Tensor<D, Int>) -> Vec<i64> {
        t.into_data().iter::<i64>().collect()
    }

    #[test]
    fn segments_hold_offsets_starts_tables_and_padded_tiles() {
        let dev = Device::flex();
        let rows = [
            SegmentRow {
                queries: 70,
                start: 0,
                table: &[3, 1, 4, 0, 5],
            },
            SegmentRow {
                queries: 2,
                start: 5,
                table: &[2],
            },
        ];
        let geometry = TableGeometry {
            block_size: 16,
            width: 3,
            padding_block: 9,
        };
        let padding = SegmentPadding {
            rows: 4,
            tiles: Some(5),
        };
        let seg = SegmentContext::new(&rows, padding, geometry, &dev);
        assert_eq!(ints_of(seg.cu_seqlens), [0, 70, 72, 72, 72]);
        assert_eq!(ints_of(seg.starts), [0, 5, 0, 0]);
        // Tables cut to the width, padding rows all padding block.
        #[rustfmt::skip]
        assert_eq!(ints_of(seg.tables), [3, 1, 4,  2, 9, 9,  9, 9, 9,  9, 9, 9]);
        let no = i64::from(i32::MAX);
        #[rustfmt::skip]
        assert_eq!(ints_of(seg.tiles), [0, 0,  0, 64,  1, 0,  0, no,  0, no]);
        assert_eq!((seg.max_queries, seg.max_context), (70, 70));
        // Unpadded: exactly the rows and their tiles.
        let exact = SegmentPadding {
            rows: 0,
            tiles: None,
        };
        let seg = SegmentContext::new(&rows, exact, geometry, &dev);
        assert_eq!(seg.tables.dims(), [2, 3]);
        assert_eq!(seg.tiles.dims(), [3, 2]);
    }
}
