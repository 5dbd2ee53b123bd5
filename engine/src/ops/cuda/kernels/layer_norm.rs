//! The LayerNorm kernel: one warp per row, the row held in registers.
//!
//! Each lane loads its `per_lane` vectors of the row at once (the row length
//! is a compile-time constant, so the loads are unrolled and all in flight),
//! then the mean and the variance come from those registers with two plane
//! sums, in f32. A row costs one memory round trip; the first version, which
//! looped over the row three times with scalar loads, took ~16 us a launch
//! on an H100 whatever the batch.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::{empty_like, vector_size};
use crate::ops::plan::GEMV_WARPS;

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

/// Launches [`layer_norm_kernel`] over the rows of contiguous `x` `[R, E]`
/// with `gamma`, `beta` `[E]`.
pub fn launch(x: CubeTensor, gamma: CubeTensor, beta: CubeTensor, eps: f32) -> CubeTensor {
    let [r, e] = x.shape().dims::<2>();
    let out = empty_like(&x, [r, e]);
    let dtype = x.dtype;
    let vs = vector_size(&x, &[e]);
    let row_vectors = e / vs;
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
