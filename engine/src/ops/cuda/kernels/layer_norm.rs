//! The LayerNorm kernels: the row held in registers, statistics in f32.
//!
//! Each unit loads its vectors of the row at once (the row length is a
//! compile-time constant, so the loads are unrolled and all in flight), then
//! the mean and the variance come from those registers with two sums. A row
//! costs one memory round trip; the first version, which looped over the row
//! three times with scalar loads, took ~16 us a launch on an H100 whatever
//! the batch.
//!
//! Two plans, chosen by the row count ([`CUBE_ROWS_MAX`]):
//! - few rows (a decode step, a short prefill): [`layer_norm_cube_kernel`],
//!   one cube a row, as many warps as the row has 32-vector groups (at most
//!   8), one or two vectors a unit, `gamma` and `beta` loaded with the row
//!   (before the reductions, not after them), the sums through
//!   [`super::reduce::cube_reduce`]. The warp-a-row plan left a 1-row step
//!   one warp on one SM: 6.6 us a launch on GPT-2 XL's 1,600-wide rows,
//!   25% of its batch-1 decode step (ncu, H200, 2026-11-29 call 40);
//! - many rows: [`layer_norm_kernel`], one warp a row, [`GEMV_WARPS`] rows a
//!   cube, plane sums only.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::reduce::{cube_reduce, OP_SUM};
use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::{empty_like, vector_size};
use crate::ops::plan::GEMV_WARPS;

/// Up to this many rows, one cube a row ([`layer_norm_cube_kernel`]).
pub const CUBE_ROWS_MAX: usize = 256;

/// Warps of a row's cube: one a 32-vector group of the row, at most 8.
pub fn cube_warps(row_vectors: usize) -> usize {
    row_vectors.div_ceil(32).clamp(1, 8)
}

/// LayerNorm of row `CUBE_POS_X` of `x` `[R, E]` by one cube of `warps`
/// warps (module doc): unit `u` holds the vectors `u + i * 32 * warps`,
/// `i < per_unit`, and the matching vectors of `gamma` and `beta`. Shapes as
/// [`layer_norm_kernel`]'s.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_cube_kernel<F: Float, V: Size>(
    x: &Tensor<Vector<F, V>>,
    gamma: &Tensor<Vector<F, V>>,
    beta: &Tensor<Vector<F, V>>,
    out: &mut Tensor<Vector<F, V>>,
    eps: f32,
    #[comptime] vs: usize,
    #[comptime] row_vectors: usize,
    #[comptime] per_unit: usize,
    #[comptime] warps: usize,
    #[define(F)] _dtype: ElemType,
) {
    let unit = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let threads = comptime!(warps * 32);
    let base = CUBE_POS_X as usize * row_vectors;
    let mut red = Shared::<[f32]>::new_slice(warps);
    let mut vals = Array::<f32>::new(comptime!(per_unit * vs));
    let mut scales = Array::<f32>::new(comptime!(per_unit * vs));
    let mut shifts = Array::<f32>::new(comptime!(per_unit * vs));
    let mut sum = f32::new(0.0);
    #[unroll]
    for i in 0..per_unit {
        let k = unit + i * threads;
        let inside = k < row_vectors;
        let at = select(inside, k, 0usize);
        let v = x[base + at];
        let g = gamma[at];
        let b = beta[at];
        #[unroll]
        for j in 0..vs {
            let f = select(inside, f32::cast_from(v.extract(j)), f32::new(0.0));
            vals[i * vs + j] = f;
            scales[i * vs + j] = f32::cast_from(g.extract(j));
            shifts[i * vs + j] = f32::cast_from(b.extract(j));
            sum += f;
        }
    }
    let count = f32::cast_from(row_vectors * vs);
    let mean = cube_reduce(sum, &mut red, OP_SUM, warps) / count;
    let mut squares = f32::new(0.0);
    #[unroll]
    for i in 0..per_unit {
        if unit + i * threads < row_vectors {
            #[unroll]
            for j in 0..vs {
                let c = vals[i * vs + j] - mean;
                squares += c * c;
            }
        }
    }
    let inv = f32::new(1.0) / (cube_reduce(squares, &mut red, OP_SUM, warps) / count + eps).sqrt();
    #[unroll]
    for i in 0..per_unit {
        let k = unit + i * threads;
        if k < row_vectors {
            let mut normed = Vector::<F, V>::empty();
            let mut scale = Vector::<F, V>::empty();
            let mut shift = Vector::<F, V>::empty();
            #[unroll]
            for j in 0..vs {
                normed.insert(j, F::cast_from((vals[i * vs + j] - mean) * inv));
                scale.insert(j, F::cast_from(scales[i * vs + j]));
                shift.insert(j, F::cast_from(shifts[i * vs + j]));
            }
            out[base + k] = normed * scale + shift;
        }
    }
}

/// LayerNorm of each row of `x` `[R, E]` (contiguous, read as vectors of `V`
/// with `vs` elements: `row_vectors = E / vs` per row, `per_lane =
/// ceil(row_vectors / 32)` per lane): the normalized value is cast to `F`,
/// then scaled and shifted in `F`. `out` is `[R, E]` contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_kernel<F: Float, V: Size>(
    x: &Tensor<Vector<F, V>>,
    gamma: &Tensor<Vector<F, V>>,
    beta: &Tensor<Vector<F, V>>,
    out: &mut Tensor<Vector<F, V>>,
    eps: f32,
    #[comptime] vs: usize,
    #[comptime] row_vectors: usize,
    #[comptime] per_lane: usize,
    #[define(F)] _dtype: ElemType,
) {
    let lane = UNIT_POS_X as usize;
    let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
    if row < x.shape(0) {
        let base = row * row_vectors;
        let mut vals = Array::<f32>::new(comptime!(per_lane * vs));
        let mut sum = f32::new(0.0);
        #[unroll]
        for i in 0..per_lane {
            let k = lane + i * 32;
            if k < row_vectors {
                let v = x[base + k];
                #[unroll]
                for j in 0..vs {
                    let f = f32::cast_from(v.extract(j));
                    vals[i * vs + j] = f;
                    sum += f;
                }
            } else {
                #[unroll]
                for j in 0..vs {
                    vals[i * vs + j] = f32::new(0.0);
                }
            }
        }
        let count = f32::cast_from(row_vectors * vs);
        let mean = plane_sum(sum) / count;
        let mut squares = f32::new(0.0);
        #[unroll]
        for i in 0..per_lane {
            let k = lane + i * 32;
            if k < row_vectors {
                #[unroll]
                for j in 0..vs {
                    let c = vals[i * vs + j] - mean;
                    squares += c * c;
                }
            }
        }
        let inv = f32::new(1.0) / (plane_sum(squares) / count + eps).sqrt();
        #[unroll]
        for i in 0..per_lane {
            let k = lane + i * 32;
            if k < row_vectors {
                let mut normed = Vector::<F, V>::empty();
                #[unroll]
                for j in 0..vs {
                    normed.insert(j, F::cast_from((vals[i * vs + j] - mean) * inv));
                }
                out[base + k] = normed * gamma[k] + beta[k];
            }
        }
    }
}

cuda_kernel! {
    /// LayerNorm over the rows of `x` `[R, E]` with `gamma`, `beta` `[E]`
    /// (one kernel).
    #[fusion(dtype = x, shape = x)]
    pub fn LayerNormRows::layer_norm_rows(
        x: Tensor<2>,
        gamma: Tensor<1>,
        beta: Tensor<1>,
        eps: f32,
    ) -> Tensor<2>
}

/// Launches [`layer_norm_cube_kernel`] (up to [`CUBE_ROWS_MAX`] rows) or
/// [`layer_norm_kernel`] over the rows of contiguous `x` `[R, E]` with
/// `gamma`, `beta` `[E]`.
pub fn launch(x: CubeTensor, gamma: CubeTensor, beta: CubeTensor, eps: f32) -> CubeTensor {
    let [r, e] = x.shape().dims::<2>();
    let out = empty_like(&x, [r, e]);
    let dtype = x.dtype;
    let vs = vector_size(&x, &[e]);
    let row_vectors = e / vs;
    if r <= CUBE_ROWS_MAX {
        let warps = cube_warps(row_vectors);
        layer_norm_cube_kernel::launch(
            &x.client,
            CubeCount::Static(r as u32, 1, 1),
            CubeDim::new_2d(32, warps as u32),
            vs,
            x.clone().into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            eps,
            vs,
            row_vectors,
            row_vectors.div_ceil(warps * 32),
            warps,
            dtype_to_storage_type(dtype),
        );
        return out;
    }
    layer_norm_kernel::launch(
        &x.client,
        CubeCount::Static((r as u32).div_ceil(GEMV_WARPS as u32), 1, 1),
        CubeDim::new_2d(32, GEMV_WARPS as u32),
        vs,
        x.clone().into_tensor_arg(),
        gamma.into_tensor_arg(),
        beta.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        eps,
        vs,
        row_vectors,
        row_vectors.div_ceil(32),
        dtype_to_storage_type(dtype),
    );
    out
}
