//! Launch plans of the CUDA kernels: pure functions of a shape and the
//! [`KernelTuning`], so they are unit-tested on any machine and the kernels
//! receive plain numbers (no kernel reads a knob itself).
//!
//! The constants that are properties of the kernels (not knobs) live here
//! too: warps per cube of the GEMV and LayerNorm kernels, of the
//! tensor-core projection's default, and of a split attention cube; the
//! query tile of prefill attention.

use crate::tuning::KernelTuning;

/// Warps per cube of the decode GEMV and of the LayerNorm kernel.
pub const GEMV_WARPS: usize = 8;

/// Warps per cube of the tensor-core projection unless the plan says more
/// (each takes a 16-wide slice of `K` per step).
pub const MMA_WARPS: usize = 8;

/// Warps per attention cube when a context is split across cubes.
pub const SPLIT_ATTENTION_WARPS: usize = 8;

/// SMs of the GPU the attention plan's thresholds were measured on (H100,
/// H200: 132).
const PLAN_SMS: usize = 132;

/// Queries per tile of prefill attention: one CUDA cube (4 warps of 16
/// queries, over keys staged 64 at a time) or one CPU task per head.
pub const PREFILL_TILE: usize = 64;

/// The `(row, first query)` entry of a padding tile: its first query is past
/// every row's end, so it computes nothing.
pub const NO_TILE: [i32; 2] = [0, i32::MAX];

/// How a projection of `rows` rows runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearPlan {
    /// The general matmul (Burn's, on the transposed weight view).
    Matmul,
    /// The decode GEMV (its cube shape: [`gemv_launch`]).
    Gemv,
    /// The tensor-core kernel: `row_tiles` 16-row tiles and `warps` warps per cube.
    Mma { row_tiles: usize, warps: usize },
}

/// The plan of `[rows, k] x [n, k]^T` for a projection (`lm_head`: the tied
/// LM head, which has its own cap).
pub fn linear(tuning: &KernelTuning, rows: usize, n: usize, k: usize, lm_head: bool) -> LinearPlan {
    let cap = if lm_head {
        tuning.lm_head_rows()
    } else {
        tuning.gemv_max_rows
    };
    if rows == 0 || rows > cap {
        return LinearPlan::Matmul;
    }
    if let Some((row_tiles, warps)) = mma(tuning, rows, n, k) {
        return LinearPlan::Mma { row_tiles, warps };
    }
    LinearPlan::Gemv
}

/// The GEMV's cube shape for `rows` rows and `n` outputs over `k_vectors`
/// vector loads per row: rows per cube and warps per output feature.
pub fn gemv_launch(rows: usize, n: usize, k_vectors: usize) -> (usize, usize) {
    (gemv_rows(rows), gemv_splits(n, k_vectors))
}

/// The tensor-core kernel's launch shape for `[rows, k] x [n, k]^T`: 16-row
/// tiles per cube (4, 2 or 1: the most that divide the rows' tiles, capped by
/// `mma_row_tiles` and by the 32 KiB of f32 partials the warps keep in shared
/// memory) and warps per cube (16 up to 64 rows, 8 above, or `mma_warps`
/// where `k` allows). `None` when the GEMV is used: fewer than `mma_min_rows`
/// rows, rows or `n` not a multiple of 16 (the 50257-wide LM head), or `k`
/// not a multiple of 128 (8 warps splitting it in 16-wide steps).
fn mma(tuning: &KernelTuning, rows: usize, n: usize, k: usize) -> Option<(usize, usize)> {
    if rows < tuning.mma_min_rows.max(16)
        || !rows.is_multiple_of(16)
        || !n.is_multiple_of(16)
        || !k.is_multiple_of(16 * MMA_WARPS)
    {
        return None;
    }
    // Up to 64 rows the cube count is small and each warp's K loop is the
    // latency: 16 warps measured 1.47 ms at batch 64 against 1.57-1.60 with 8
    // on an H100 (and no better at 256).
    let wanted = match tuning.mma_warps {
        0 if rows <= 64 => 16,
        0 => MMA_WARPS,
        w => w,
    };
    let warps = match wanted {
        16 | 32 if k.is_multiple_of(16 * wanted) => wanted,
        _ => MMA_WARPS,
    };
    // 1 KiB of f32 partials per warp and row tile: at most 32 KiB.
    let max_tiles = tuning.mma_row_tiles.clamp(1, 32 / warps);
    [4, 2, 1]
        .into_iter()
        .find(|&t| t <= max_tiles && (rows / 16).is_multiple_of(t))
        .map(|t| (t, warps))
}

/// Warps per output feature of the decode GEMV: with fewer outputs than
/// 2048 the `K` loop is split over up to 4 warps, as long as every lane
/// still gets a vector to load; otherwise one warp.
fn gemv_splits(n_out: usize, k_vectors: usize) -> usize {
    if n_out >= 2048 {
        return 1;
    }
    let mut splits = 4;
    while splits > 1 && k_vectors < 32 * splits {
        splits /= 2;
    }
    splits
}

/// Rows per cube of the decode GEMV: the largest power of two up to 16 that
/// divides `batch` (so no cube runs past the batch).
fn gemv_rows(batch: usize) -> usize {
    let mut rows = 16;
    while !batch.is_multiple_of(rows) {
        rows /= 2;
    }
    rows
}

/// How decode attention over `pairs` (head, sequence) pairs is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionPlan {
    /// Cubes sharing one pair's context (1: not split).
    pub splits: usize,
    /// Warps per cube.
    pub warps: usize,
}

/// The decode attention plan: split each context across enough cubes for
/// about two per SM (at most 16) while the pairs alone do not fill the GPU,
/// or `fixed_splits` (the `--attention-splits` knob) when not 0; without
/// splitting, more warps per cube the fewer cubes there are. `can_split` is
/// false where the runtime cannot hand partials between cubes (no
/// device-scope fences) or no counters were given.
pub fn attention(fixed_splits: usize, pairs: usize, can_split: bool) -> AttentionPlan {
    let splits = match (can_split, fixed_splits) {
        (false, _) => 1,
        (true, 0) => match pairs {
            0 => 1,
            p if p >= PLAN_SMS => 1,
            p => (2 * PLAN_SMS).div_ceil(p).min(16),
        },
        (true, fixed) => fixed.min(64),
    };
    let warps = match (splits, pairs) {
        (s, _) if s > 1 => SPLIT_ATTENTION_WARPS,
        (_, p) if p < PLAN_SMS => 16,
        (_, p) if p < 2 * PLAN_SMS => 8,
        _ => 4,
    };
    AttentionPlan { splits, warps }
}

/// How the attention kernel splits a row of `chunks` vectors: lanes per
/// position (the largest power of two up to 32 dividing `chunks`) and
/// vectors per lane.
pub fn attention_lanes(chunks: usize) -> (usize, usize) {
    let mut lanes = 32;
    while !chunks.is_multiple_of(lanes) {
        lanes /= 2;
    }
    (lanes, chunks / lanes)
}

/// The tiles of prefill attention over rows of `lens` queries: `(row, first
/// query)` of each run of up to [`PREFILL_TILE`] consecutive queries of one
/// row, in row order. No tile straddles two rows, so a tile's queries share
/// one block table and one causal diagonal.
pub fn prefill_tiles(lens: &[usize]) -> Vec<[i32; 2]> {
    lens.iter()
        .enumerate()
        .flat_map(|(row, &len)| {
            (0..len)
                .step_by(PREFILL_TILE)
                .map(move |q0| [row as i32, q0 as i32])
        })
        .collect()
}

/// Most tiles [`prefill_tiles`] makes of `tokens` queries in `rows` rows:
/// a row of `n` queries takes `ceil(n / 64) < n / 64 + 1` tiles, and every
/// tile holds a query. A bucketed step pads its tile list to this length
/// ([`NO_TILE`]), so the list's shape depends on the step's shape alone.
pub fn prefill_tile_bound(tokens: usize, rows: usize) -> usize {
    (tokens.div_ceil(PREFILL_TILE) + rows).min(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: usize = 768;

    #[test]
    fn projections_pick_gemv_mma_or_matmul_by_rows() {
        let t = KernelTuning::default();
        let k = K;
        assert_eq!(linear(&t, 1, 2304, k, false), LinearPlan::Gemv);
        assert_eq!(gemv_launch(1, 2304, 96), (1, 1));
        assert_eq!(linear(&t, 8, 768, k, false), LinearPlan::Gemv);
        assert_eq!(gemv_launch(8, 768, 96), (8, 2));
        assert_eq!(gemv_launch(12, 768, 384), (4, 4));
        assert_eq!(
            linear(&t, 64, 2304, k, false),
            LinearPlan::Mma {
                row_tiles: 2, // 16 warps' partials cap the tiles at 2
                warps: 16
            }
        );
        assert_eq!(
            linear(&t, 256, 768, 3072, false),
            LinearPlan::Mma {
                row_tiles: 4,
                warps: 8
            }
        );
        assert_eq!(linear(&t, 512, 768, k, false), LinearPlan::Matmul);
        // The LM head: its own cap, and never the tensor-core kernel (50257).
        assert_eq!(linear(&t, 8, 50257, k, true), LinearPlan::Gemv);
        assert_eq!(linear(&t, 16, 50257, k, true), LinearPlan::Matmul);
    }

    #[test]
    fn the_knobs_move_the_boundaries() {
        let k = K;
        let off = KernelTuning {
            gemv_max_rows: 0,
            ..Default::default()
        };
        assert_eq!(linear(&off, 1, 768, k, false), LinearPlan::Matmul);
        let late_mma = KernelTuning {
            mma_min_rows: 64,
            ..Default::default()
        };
        assert_eq!(linear(&late_mma, 32, 768, k, false), LinearPlan::Gemv);
        let wide = KernelTuning {
            mma_warps: 32,
            mma_row_tiles: 1,
            ..Default::default()
        };
        // 768 is not a multiple of 16 * 32: back to 8 warps.
        assert_eq!(
            linear(&wide, 64, 768, k, false),
            LinearPlan::Mma {
                row_tiles: 1,
                warps: 8
            }
        );
        assert_eq!(
            linear(&wide, 64, 768, 3072, false),
            LinearPlan::Mma {
                row_tiles: 1,
                warps: 32
            }
        );
    }

    #[test]
    fn attention_splits_small_batches_and_honours_the_switches() {
        let t = KernelTuning::default().attention_splits;
        // GPT-2 (12 heads), batch 1: 12 pairs -> 22 cubes each, capped at 16.
        assert_eq!(
            attention(t, 12, true),
            AttentionPlan {
                splits: 16,
                warps: 8
            }
        );
        assert_eq!(attention(t, 96, true).splits, 3);
        assert_eq!(
            attention(t, 12 * 64, true),
            AttentionPlan {
                splits: 1,
                warps: 4
            }
        );
        assert_eq!(
            attention(t, 12, false),
            AttentionPlan {
                splits: 1,
                warps: 16
            }
        );
        assert_eq!(attention(1, 12, true).splits, 1);
        assert_eq!(attention(4, 12 * 64, true).splits, 4);
    }

    #[test]
    fn prefill_tiles_cover_each_row_without_straddling() {
        // Rows of 1, 0 (a padding row), 64, 65 and 130 queries.
        let tiles = prefill_tiles(&[1, 0, 64, 65, 130]);
        assert_eq!(
            tiles,
            [[0, 0], [2, 0], [3, 0], [3, 64], [4, 0], [4, 64], [4, 128]]
        );
        assert!(tiles.len() <= prefill_tile_bound(260, 5));
        // The bound holds for every split of a token count into rows.
        for tokens in [1, 16, 63, 64, 65, 200, 1000] {
            for rows in 1..=tokens.min(70) {
                let mut lens = vec![tokens / rows; rows];
                lens[0] += tokens % rows;
                let n = prefill_tiles(&lens).len();
                assert!(n <= prefill_tile_bound(tokens, rows), "{tokens} in {rows}");
                // One long row and many one-token rows: the worst case.
                let mut skewed = vec![1; rows];
                skewed[0] = tokens + 1 - rows;
                let n = prefill_tiles(&skewed).len();
                assert!(n <= prefill_tile_bound(tokens, rows), "{tokens} skewed");
            }
        }
        assert_eq!(prefill_tile_bound(16, 16), 16);
        assert_eq!(prefill_tile_bound(8192, 64), 192);
    }

    #[test]
    fn lanes_divide_the_row() {
        assert_eq!(attention_lanes(8), (8, 1));
        assert_eq!(attention_lanes(64), (32, 2));
        assert_eq!(attention_lanes(12), (4, 3));
    }
}
