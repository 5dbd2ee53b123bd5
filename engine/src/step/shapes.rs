//! The shapes of steps: what a runner is built for ([`RunnerShape`]) and the
//! padded shape of each step, as pure functions (unit-tested here; the
//! warmup enumerates them).
//!
//! With `bucketed` on (CUDA) every step is padded to a bucket, so the set of
//! shapes is small and known in advance (autotune and compilation run once
//! per shape):
//!
//! - a decode batch to a power of two up to `max_batch` (the last bucket is
//!   `max_batch` itself);
//! - a prefill step, one flat sequence of its rows' tokens, to a power-of-two
//!   token count from [`MIN_PREFILL_BUCKET`]; its rows pad to `max_batch`
//!   (their own power of two past it) and never past the token bucket, so
//!   while a prefill step has at most `max_batch` rows (the server's default
//!   prefill row knob) its shape is its token bucket alone.
//!
//! On the CPU nothing is compiled or tuned and padding would be pure extra
//! work: shapes are exact.

use super::inputs::PrefillShape;
use crate::ops::plan::prefill_tile_bound;

/// Smallest token bucket of a bucketed prefill step: the tensor-core
/// projection's row tile (Ember's projection kernels take rows in 16s from
/// 16 on). Buckets double from here: at most half a step is padding (which
/// costs the dense layers only: padding tokens get no attention tiles), for
/// one shape per doubling (10 up to 8192 tokens).
pub const MIN_PREFILL_BUCKET: usize = 16;

/// Largest token bucket whose prefill steps are captured as graphs
/// (`super::runner`'s prefill graphs). An eager prefill step costs the host
/// ~1.5 ms of launches whatever its size (GPT-2 on an H200, 2026-11-29:
/// 1 x 256 eager 2.9 ms, replayed 1.4), so even 16 x 256 (4,096 tokens,
/// ~2 ms of GPU time) was host-bound eager; past 4,096 tokens a step's GPU
/// time dwarfs the launches.
pub const PREFILL_GRAPH_MAX_TOKENS: usize = 4096;

/// The most a prefill step holds: the scheduler's prefill knobs. The warmup
/// runs every shape a step within these bounds can take (CUDA), so the
/// steps the scheduler plans never compile anything; a larger step (a
/// benchmark's) is computed right but compiles its shape on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillBounds {
    /// Most rows (prompts or chunks) in one prefill step.
    pub max_rows: usize,
    /// Most tokens in one prefill step.
    pub max_tokens: usize,
}

/// The cache layout and step shapes a runner is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerShape {
    pub block_size: usize,
    /// Blocks in the pool (the padding block is one more).
    pub num_blocks: usize,
    /// Largest decode batch (and decode bucket); the row bucket of prefill.
    pub max_batch: usize,
    /// The prefill steps the warmup prepares for.
    pub prefill: PrefillBounds,
    /// Pad step shapes to buckets (CUDA).
    pub bucketed: bool,
}

/// The decode bucket of a batch of `n` rows.
pub fn decode_bucket(shape: &RunnerShape, n: usize) -> usize {
    if shape.bucketed {
        n.max(1).next_power_of_two().min(shape.max_batch)
    } else {
        n.max(1)
    }
}

/// The padded shape of a prefill step of `rows` rows and `tokens` tokens in
/// all (see the module docs).
pub fn prefill_shape(shape: &RunnerShape, rows: usize, tokens: usize) -> PrefillShape {
    let rows = rows.max(1);
    if !shape.bucketed {
        return PrefillShape {
            tokens: tokens.max(1),
            rows,
            tiles: None,
        };
    }
    let tokens = tokens.max(MIN_PREFILL_BUCKET).next_power_of_two();
    let rows = if rows <= shape.max_batch {
        shape.max_batch
    } else {
        rows.next_power_of_two()
    };
    // Every row has a token, so rows past the tokens would be padding only.
    let rows = rows.min(tokens);
    PrefillShape {
        tokens,
        rows,
        tiles: Some(prefill_tile_bound(tokens, rows)),
    }
}

/// Every prefill shape a step of at most `max_rows` rows and `max_tokens`
/// tokens can take: each token bucket up to that of `max_tokens`, with each
/// row count up to `max_rows` (and the bucket).
pub fn prefill_shapes(
    shape: &RunnerShape,
    max_rows: usize,
    max_tokens: usize,
) -> Vec<PrefillShape> {
    let mut shapes = Vec::new();
    let largest = prefill_shape(shape, 1, max_tokens).tokens;
    let mut tokens = prefill_shape(shape, 1, 1).tokens;
    loop {
        for rows in powers_of_two_up_to(max_rows.max(1).min(tokens)) {
            shapes.push(prefill_shape(shape, rows, tokens));
        }
        if tokens >= largest {
            break;
        }
        tokens = prefill_shape(shape, 1, tokens + 1).tokens;
    }
    shapes.sort_by_key(|s| (s.tokens, s.rows));
    shapes.dedup();
    shapes
}

/// 1, 2, 4, ... below `max`, then `max` (empty for 0).
pub fn powers_of_two_up_to(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = std::iter::successors(Some(1usize), |n| n.checked_mul(2))
        .take_while(|&n| n < max)
        .collect();
    if max > 0 {
        v.push(max);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cuda(max_batch: usize) -> RunnerShape {
        RunnerShape {
            block_size: 16,
            num_blocks: 100,
            max_batch,
            prefill: PrefillBounds {
                max_rows: max_batch,
                max_tokens: 8192,
            },
            bucketed: true,
        }
    }

    #[test]
    fn prefill_pads_tokens_to_powers_of_two_and_rows_to_the_decode_batch() {
        let s = cuda(64);
        let shape = |rows, tokens| {
            let p = prefill_shape(&s, rows, tokens);
            (p.tokens, p.rows, p.tiles)
        };
        assert_eq!(shape(1, 1), (16, 16, Some(16)));
        assert_eq!(shape(3, 100), (128, 64, Some(66)));
        assert_eq!(shape(64, 4096), (4096, 64, Some(128)));
        assert_eq!(shape(16, 4096), (4096, 64, Some(128)));
        // More rows than the decode batch: their own power of two.
        assert_eq!(shape(100, 4096), (4096, 128, Some(192)));
        let cpu = RunnerShape {
            bucketed: false,
            ..s
        };
        let exact = prefill_shape(&cpu, 3, 100);
        assert_eq!((exact.tokens, exact.rows, exact.tiles), (100, 3, None));
    }

    /// The server's warmup under `--max-batch-size 64` and the default
    /// `--prefill-max-tokens 8192` (the prefill row knob defaults to the
    /// decode one): one shape per token bucket, 16 to 8192.
    #[test]
    fn a_prefill_shape_per_token_bucket() {
        let shapes = prefill_shapes(&cuda(64), 64, 8192);
        let tokens: Vec<usize> = shapes.iter().map(|s| s.tokens).collect();
        assert_eq!(tokens, [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]);
        // A prefill row knob past the decode batch adds a row bucket (128)
        // to each token bucket that can hold that many rows (128 to 8192).
        assert_eq!(prefill_shapes(&cuda(64), 128, 8192).len(), 10 + 7);
        assert_eq!(prefill_shapes(&cuda(8), 4, 256).len(), 5);
    }

    #[test]
    fn decode_buckets_are_powers_of_two_up_to_the_batch() {
        let s = cuda(48);
        let buckets: Vec<usize> = [1, 3, 17, 33, 48].map(|n| decode_bucket(&s, n)).to_vec();
        assert_eq!(buckets, [1, 4, 32, 48, 48]);
        assert_eq!(powers_of_two_up_to(6), [1, 2, 4, 6]);
        assert_eq!(powers_of_two_up_to(8), [1, 2, 4, 8]);
    }
}
