//! The decode GEMV kernel: `out[b, n] = x[b, :] . w[n, :]` for a few rows
//! `b`, with the bias, tanh-GELU and residual add in its epilogue.
//!
//! `splits` warps per output feature `n` (a cube of 8 warps covers `8 /
//! splits` features): their lanes stream the contiguous weight row `w[n, :]`
//! as 16-byte vectors (`K` is a compile-time constant, so the loop is
//! unrolled and every load of the row is in flight at once), each weight
//! vector is used for the `rows` rows of `x` of the cube's row tile (read as
//! vectors too, from L1), a plane sum per row gives each warp's part, and the
//! parts meet in shared memory. A decode step's projections are bound by
//! reading the weights once; this reads each weight byte once per row tile,
//! and splitting `K` over warps keeps enough loads in flight when `N` is
//! small (768 outputs are 768 warps, under six per SM of an H100).

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::launch::{
    empty_like, or_stand_in, projection_kernel, vector_size, Projection,
};
use crate::ops::plan::{gemv_launch, GEMV_WARPS};

/// See the module doc. `x` `[B, K]` and `w` `[N, K]` contiguous, read as
/// vectors of `V` (`vs` elements; `k_vectors` per row); `bias` `[N]`, `residual` `[B, N]` (read only when their
/// flag is set); `out` `[B, N]` contiguous. `CUBE_POS_Y` picks the row tile.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_linear_kernel<F: Float, V: Size>(
    x: &Tensor<Vector<F, V>>,
    w: &Tensor<Vector<F, V>>,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    out: &mut Tensor<F>,
    #[comptime] vs: usize,
    #[comptime] k_vectors: usize,
    #[comptime] rows: usize,
    #[comptime] splits: usize,
    #[comptime] has_bias: bool,
    #[comptime] gelu: bool,
    #[comptime] has_residual: bool,
    #[define(F)] _dtype: ElemType,
) {
    let lane = UNIT_POS_X as usize;
    let warp = UNIT_POS_Y as usize;
    let part = warp % splits;
    let n = CUBE_POS_X as usize * comptime!(GEMV_WARPS / splits) + warp / splits;
    let b0 = CUBE_POS_Y as usize * rows;
    let n_out = out.shape(1);
    let valid = n < n_out;
    let mut partial = Shared::<[f32]>::new_slice(comptime!(GEMV_WARPS * rows));
    let w_row = n * k_vectors;
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = f32::new(0.0);
    }
    #[unroll]
    for i in 0..comptime!(k_vectors.div_ceil(32 * splits)) {
        let k = part * 32 + lane + i * 32 * splits;
        if valid && k < k_vectors {
            let wv = w[w_row + k];
            #[unroll]
            for r in 0..rows {
                let xv = x[(b0 + r) * k_vectors + k];
                #[unroll]
                for j in 0..vs {
                    acc[r] += f32::cast_from(wv.extract(j)) * f32::cast_from(xv.extract(j));
                }
            }
        }
    }
    #[unroll]
    for r in 0..rows {
        let total = plane_sum(acc[r]);
        if lane == 0 {
            partial[warp * rows + r] = total;
        }
    }
    sync_cube();
    if valid && part == 0 && lane < rows {
        let r = lane;
        let mut v = f32::new(0.0);
        #[unroll]
        for p in 0..splits {
            v += partial[(warp + p) * rows + r];
        }
        let v = epilogue(v, bias, residual, b0 + r, n, has_bias, gelu, has_residual);
        out[(b0 + r) * n_out + n] = F::cast_from(v);
    }
}

/// The projections' epilogue on output `[row, n]`'s f32 sum `v`: `+ bias[n]`,
/// then tanh-GELU, then `+ residual[row, n]`, each when its flag is set.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn epilogue<F: Float>(
    v: f32,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    row: usize,
    n: usize,
    #[comptime] has_bias: bool,
    #[comptime] gelu: bool,
    #[comptime] has_residual: bool,
) -> f32 {
    let mut v = v;
    if has_bias {
        v += f32::cast_from(bias[n * bias.stride(0)]);
    }
    if gelu {
        let inner = f32::new(0.797_884_6) * (v + f32::new(0.044715) * v * v * v);
        v = f32::new(0.5) * v * (f32::new(1.0) + inner.tanh());
    }
    if has_residual {
        v += f32::cast_from(residual[row * residual.stride(0) + n * residual.stride(1)]);
    }
    v
}

projection_kernel! {
    /// On the GEMV (decode batches below the tensor-core tile).
    pub fn GemvLinear::gemv_linear()
}

/// Launches [`decode_linear_kernel`] for `p` (contiguous operands).
/// Returns `[B, N]`.
pub fn launch(p: Projection) -> CubeTensor {
    let Projection {
        x,
        w,
        bias,
        residual,
        gelu,
    } = p;
    let (bias, has_bias) = or_stand_in(bias, &w);
    let (residual, has_residual) = or_stand_in(residual, &w);
    let [b, _] = x.shape().dims::<2>();
    let [n, k] = w.shape().dims::<2>();
    let out = empty_like(&x, [b, n]);
    let dtype = x.dtype;
    let vs = vector_size(&x, &[k]);
    let (rows, splits) = gemv_launch(b, n, k / vs);
    let per_cube = (GEMV_WARPS / splits) as u32;
    decode_linear_kernel::launch(
        &x.client,
        CubeCount::Static((n as u32).div_ceil(per_cube), (b / rows) as u32, 1),
        CubeDim::new_2d(32, GEMV_WARPS as u32),
        vs,
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        bias.into_tensor_arg(),
        residual.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        vs,
        k / vs,
        rows,
        splits,
        has_bias,
        gelu,
        has_residual,
        dtype_to_storage_type(dtype),
    );
    out
}
