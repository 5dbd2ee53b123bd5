//! The CPU attention kernel both decode and prefill run: tiles of causal
//! queries over their context in the paged cache, read in place.
//!
//! A [`Tile`] is a run of consecutive queries of one sequence: query `j`
//! (flat row `first_row + j` of `q`) sees the first `first_len + j`
//! positions of the sequence, through its block table. A decode step is one
//! one-query tile per sequence; a prefill step cuts each segment into tiles
//! of up to [`crate::ops::plan::PREFILL_TILE`] queries. Each (tile, head)
//! pair is one task on the rayon pool:
//!
//! 1. the tile's queries, pre-scaled by `1/sqrt(D)`, are copied together;
//! 2. for each key position, its K row is read once (from L1 for every query
//!    of the tile after the first) and dotted with every query that sees it;
//! 3. a softmax over each query's own visible scores;
//! 4. for each position, its V row is read once and added, weighted, into
//!    every query's output that sees it.
//!
//! A sequence's blocks lie anywhere in the cache, and a decode step's
//! one-query tasks do little arithmetic per row they read, so the hardware
//! prefetcher (which follows one stream within a page) left them waiting on
//! memory: in step 2, while position `t`'s K row is dotted, the same
//! position's V row and the next block's K row at the same slot are
//! prefetched. 12 layers of decode attention at batch 16, context 128 (a
//! test harness, not committed; Zen 3 dev machine, best of 30 under load
//! 4-6): 22-37 ms without, 16-24 ms with.
//!
//! Positions a query may not see are never visited, so nothing is masked.
//! The tasks' outputs are copied into the `[N, E]` result afterwards.
//!
//! The storage is f32, or bf16 with bf16 weights ([`KvElem`]: each K or V
//! row is widened into a per-thread row buffer as it is read, half the
//! bytes from memory).
//!
//! A task is compiled once per instruction set ([`tile_head_on`]: the same
//! Rust inlined into an AVX-512 and an AVX2 `#[target_feature]` entry
//! point), so its dot products and weighted sums run on the CPU's widest
//! vectors rather than the build's SSE2 baseline.

use half::bf16;
use rayon::prelude::*;

use super::flex_slices::{axpy, dot};
use super::gemv::lanes::WeightElem;
use super::isa::CpuIsa;

/// An element of the K/V storage, read as f32.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// `src` as f32s: itself (f32), or widened into `buf` (at least as
    /// long) and returned from there.
    fn as_f32<'a>(src: &'a [Self], buf: &'a mut [f32]) -> &'a [f32];
}

impl KvElem for f32 {
    #[inline(always)]
    fn as_f32<'a>(src: &'a [f32], _buf: &'a mut [f32]) -> &'a [f32] {
        src
    }
}

impl KvElem for bf16 {
    #[inline(always)]
    fn as_f32<'a>(src: &'a [bf16], buf: &'a mut [f32]) -> &'a [f32] {
        for (b, &x) in buf.iter_mut().zip(src) {
            *b = WeightElem::to_f32(x); // a shift: no NaN branch, unlike `half`'s
        }
        &buf[..src.len()]
    }
}

/// A run of consecutive queries of one sequence (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Row of the block tables.
    pub table: usize,
    /// Flat row of the first query.
    pub first_row: usize,
    /// Queries in the tile.
    pub queries: usize,
    /// Positions the first query sees (each next query sees one more).
    pub first_len: usize,
}

/// Sizes [`attend`] works with.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Flat query rows (`N`, the output's rows).
    pub rows: usize,
    /// Elements between consecutive query rows (`3E` when reading `qkv`).
    pub q_stride: usize,
    pub heads: usize,
    /// Slots of the `[H, S, D]` storage (`S`).
    pub slots: usize,
    pub head_dim: usize,
    /// Blocks per table row (`W`).
    pub table_width: usize,
    pub block_size: usize,
}

/// Per-thread buffers of [`tile_head`], reused across its tasks.
#[derive(Default)]
struct Scratch {
    queries: Vec<f32>,
    scores: Vec<f32>,
    /// One K or V row widened to f32 (bf16 storage).
    row: Vec<f32>,
}

/// Attention of every tile's queries (`q`: the first `E` columns of each
/// row, rows `q_stride` apart) over the `[H, S, D]` storage `k`, `v`
/// through `tables` (`[_, W]` blocks), on `isa`. Returns `[N, E]` (rows no
/// tile covers are 0), or `None` if an index is out of range.
pub fn attend<E: KvElem>(
    isa: CpuIsa,
    q: &[f32],
    k: &[E],
    v: &[E],
    tables: &[i32],
    tiles: &[Tile],
    g: Geometry,
) -> Option<Vec<f32>> {
    let (h, d, bs, w) = (g.heads, g.head_dim, g.block_size, g.table_width);
    let e = h * d;
    let blocks = g.slots / bs.max(1);
    let valid_block = |b: i32| (0..blocks as i64).contains(&i64::from(b));
    let table_rows = tables.len() / w.max(1);
    let tile_fits = |t: &Tile| {
        t.table < table_rows
            && t.first_row + t.queries <= g.rows
            && t.first_len + t.queries <= w * bs + 1
            && (t.queries == 0 || (t.first_row + t.queries - 1) * g.q_stride + e <= q.len())
    };
    if bs == 0
        || w == 0
        || k.len() < h * g.slots * d
        || v.len() < k.len()
        || !tables.iter().all(|&b| valid_block(b))
        || !tiles.iter().all(tile_fits)
    {
        return None;
    }
    let tasks: Vec<(usize, usize)> = tiles
        .iter()
        .enumerate()
        .filter(|(_, t)| t.queries > 0)
        .flat_map(|(i, _)| (0..h).map(move |head| (i, head)))
        .collect();
    let parts: Vec<Vec<f32>> = tasks
        .par_iter()
        .map_init(Scratch::default, |scratch, &(i, head)| {
            let tile = &tiles[i];
            let table = &tables[tile.table * w..(tile.table + 1) * w];
            let task = Task {
                q,
                k,
                v,
                table,
                tile,
                head,
                g,
            };
            // SAFETY: `isa` was detected on this CPU.
            unsafe { tile_head_on(isa, task, scratch) }
        })
        .collect();
    let mut out = vec![0.0f32; g.rows * e];
    for (&(i, head), part) in tasks.iter().zip(&parts) {
        let tile = &tiles[i];
        for (j, values) in part.chunks_exact(d).enumerate() {
            let at = (tile.first_row + j) * e + head * d;
            out[at..at + d].copy_from_slice(values);
        }
    }
    Some(out)
}

/// One (tile, head) task's operands.
#[derive(Clone, Copy)]
struct Task<'a, E> {
    q: &'a [f32],
    k: &'a [E],
    v: &'a [E],
    /// The tile's row of the block tables.
    table: &'a [i32],
    tile: &'a Tile,
    head: usize,
    g: Geometry,
}

/// [`tile_head`] compiled for `isa`.
///
/// # Safety
/// `isa` must be available on this CPU.
unsafe fn tile_head_on<E: KvElem>(isa: CpuIsa, t: Task<'_, E>, scratch: &mut Scratch) -> Vec<f32> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512 | CpuIsa::Avx512Bf16 => tile_head_avx512(t, scratch),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx2 => tile_head_avx2(t, scratch),
        _ => tile_head(t, scratch),
    }
}

/// [`tile_head`] for AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tile_head_avx512<E: KvElem>(t: Task<'_, E>, scratch: &mut Scratch) -> Vec<f32> {
    tile_head(t, scratch)
}

/// [`tile_head`] for AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_head_avx2<E: KvElem>(t: Task<'_, E>, scratch: &mut Scratch) -> Vec<f32> {
    tile_head(t, scratch)
}

/// One (tile, head) task: `[queries, D]` outputs (see the module docs).
/// Positions are visited block by block of the table (no division per
/// position).
#[inline(always)]
fn tile_head<E: KvElem>(t: Task<'_, E>, scratch: &mut Scratch) -> Vec<f32> {
    let Task {
        q,
        k,
        v,
        table,
        tile,
        head,
        g,
    } = t;
    let (n, d, bs) = (tile.queries, g.head_dim, g.block_size);
    let first = tile.first_len;
    // Positions the tile's last query sees; score row `j` is `span` long.
    let span = first + n - 1;
    let scale = 1.0 / (d as f32).sqrt();
    let queries = &mut scratch.queries;
    queries.clear();
    for j in 0..n {
        let at = (tile.first_row + j) * g.q_stride + head * d;
        queries.extend(q[at..at + d].iter().map(|x| x * scale));
    }
    let scores = &mut scratch.scores;
    scores.clear();
    scores.resize(n * span, 0.0);
    let buf = &mut scratch.row;
    buf.resize(d, 0.0);
    let head_base = head * g.slots * d;
    // Query `j` sees position `t` when `t < first + j`.
    let first_seeing = |t: usize| (t + 1).saturating_sub(first);
    let blocks = span.div_ceil(bs);
    for (b, &block) in table.iter().enumerate().take(blocks) {
        let base = head_base + block as usize * bs * d;
        let next = next_block_base(table, b, blocks, head_base, bs * d);
        for t in b * bs..span.min((b + 1) * bs) {
            let at = base + (t - b * bs) * d;
            prefetch_row(k, next.saturating_add((t - b * bs) * d), d);
            prefetch_row(v, at, d);
            let key = E::as_f32(&k[at..at + d], buf);
            for j in first_seeing(t)..n {
                scores[j * span + t] = dot(&queries[j * d..(j + 1) * d], key);
            }
        }
    }
    for j in 0..n {
        let row = &mut scores[j * span..j * span + first + j];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for x in row.iter_mut() {
            *x = (*x - max).exp();
            total += *x;
        }
        let inv = 1.0 / total;
        row.iter_mut().for_each(|x| *x *= inv);
    }
    let mut out = vec![0.0f32; n * d];
    for (b, &block) in table.iter().enumerate().take(blocks) {
        let base = head_base + block as usize * bs * d;
        for t in b * bs..span.min((b + 1) * bs) {
            let at = base + (t - b * bs) * d;
            let value = E::as_f32(&v[at..at + d], buf);
            for j in first_seeing(t)..n {
                axpy(scores[j * span + t], value, &mut out[j * d..(j + 1) * d]);
            }
        }
    }
    out
}

/// Where the block after block `b` of `table` starts in a head's storage
/// (`head_base` + its slots), or `usize::MAX` after the last one.
#[inline(always)]
fn next_block_base(table: &[i32], b: usize, blocks: usize, head_base: usize, len: usize) -> usize {
    match table.get(b + 1) {
        Some(&next) if b + 1 < blocks => {
            head_base.saturating_add((next as usize).saturating_mul(len))
        }
        _ => usize::MAX,
    }
}

/// Asks for the cache lines of `d` elements of `data` from `at` (a hint:
/// nothing is read, and an index past the end, `usize::MAX` included, asks
/// for nothing).
#[inline(always)]
fn prefetch_row<E>(data: &[E], at: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if at.saturating_add(d) <= data.len() {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in (0..d).step_by(64 / std::mem::size_of::<E>().max(1)) {
            // SAFETY: a prefetch never faults, and the address is inside
            // `data` (checked above).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(data.as_ptr().add(at + line).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, at, d);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two heads of dimension 2, one block of 4 slots, the table `[0]`.
    fn geometry(rows: usize) -> Geometry {
        Geometry {
            rows,
            q_stride: 4,
            heads: 2,
            slots: 4,
            head_dim: 2,
            table_width: 1,
            block_size: 4,
        }
    }

    #[test]
    fn each_query_averages_the_values_it_sees_with_softmax_weights() {
        // Zero queries: uniform weights over the visible positions.
        let q = vec![0.0f32; 3 * 4];
        // Head 0's V rows are 1, 2, 3, 4 (both dims); head 1's are 10x.
        let v: Vec<f32> = (0..2)
            .flat_map(|h| (1..=4).flat_map(move |t| [t as f32 * 10f32.powi(h); 2]))
            .collect();
        let k = vec![0.0f32; v.len()];
        let tile = Tile {
            table: 0,
            first_row: 0,
            queries: 3,
            first_len: 2,
        };
        let out =
            attend(CpuIsa::detect(), &q, &k, &v, &[0], &[tile], geometry(3)).expect("in range");
        // Query j sees positions 0..2 + j: means 1.5, 2, 2.5 (head 1: x10).
        #[rustfmt::skip]
        assert_eq!(out, [1.5, 1.5, 15.0, 15.0,  2.0, 2.0, 20.0, 20.0,  2.5, 2.5, 25.0, 25.0]);
    }

    #[test]
    fn out_of_range_tiles_and_blocks_are_refused() {
        let (q, kv) = (vec![0.0f32; 8], vec![0.0f32; 16]);
        let tile = Tile {
            table: 0,
            first_row: 0,
            queries: 2,
            first_len: 4, // the second query would see 5 positions of a 4-slot table
        };
        assert!(attend(CpuIsa::detect(), &q, &kv, &kv, &[0], &[tile], geometry(2)).is_none());
        let fits = Tile {
            first_len: 3,
            ..tile
        };
        assert!(attend(CpuIsa::detect(), &q, &kv, &kv, &[0], &[fits], geometry(2)).is_some());
        assert!(attend(CpuIsa::detect(), &q, &kv, &kv, &[1], &[fits], geometry(2)).is_none());
        let past_rows = Tile {
            first_row: 1,
            ..fits
        };
        assert!(attend(
            CpuIsa::detect(),
            &q,
            &kv,
            &kv,
            &[0],
            &[past_rows],
            geometry(2)
        )
        .is_none());
    }

    #[test]
    fn bf16_storage_reads_as_its_values_widened() {
        // Two blocks of 8 slots, 2 heads of 16 dims; tables [1, 0]; a
        // 3-query tile and a one-query tile (decode).
        let (h, d, bs, slots) = (2usize, 16usize, 8usize, 16usize);
        let g = Geometry {
            rows: 4,
            q_stride: 3 * h * d,
            heads: h,
            slots,
            head_dim: d,
            table_width: 2,
            block_size: bs,
        };
        let wave =
            |n: usize, f: f32| -> Vec<f32> { (0..n).map(|i| ((i as f32) * f).sin()).collect() };
        let q = wave(4 * 3 * h * d, 0.37);
        let k16: Vec<bf16> = wave(h * slots * d, 0.11)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let v16: Vec<bf16> = wave(h * slots * d, 0.23)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let widen = |x: &[bf16]| -> Vec<f32> { x.iter().map(|v| v.to_f32()).collect() };
        let tiles = [
            Tile {
                table: 0,
                first_row: 0,
                queries: 3,
                first_len: 9,
            },
            Tile {
                table: 1,
                first_row: 3,
                queries: 1,
                first_len: 16,
            },
        ];
        let tables = [1, 0, 0, 1];
        for isa in [CpuIsa::detect(), CpuIsa::Portable] {
            let got = attend(isa, &q, &k16, &v16, &tables, &tiles, g).expect("in range");
            let want =
                attend(isa, &q, &widen(&k16), &widen(&v16), &tables, &tiles, g).expect("in range");
            assert_eq!(got, want, "{isa:?}");
        }
    }
}
