//! The decode projection on tensor cores: `out = x . w^T` for 16 to a few
//! hundred rows, with the bias, tanh-GELU and residual add in its epilogue.
//!
//! At 16+ rows the GEMV runs out of instruction throughput (every `x`
//! element is converted and multiplied on the CUDA cores once per output),
//! while CubeCL's general matmul is tuned for large tiles. This kernel is the
//! skinny middle: a cube owns 16 output features (`n0..n0 + 16`) and a tile
//! of `16 * m_tiles` rows (at most 64), and its `warps` warps (16 up to 64
//! rows, 8 above) split `K` into that many slices. Each warp walks its slice in 16-wide steps (unrolled: the row
//! length is a compile-time constant) with `wmma` 16x16x16 fragments: the
//! weight straight from its out-major `[N, K]` storage as a column-major B
//! fragment, loaded once per step and used for every row tile, and `x` as
//! row-major A fragments (`[M, K]`, from L1/L2), with f32 accumulators. The
//! warps' accumulators then meet in shared memory, where the cube adds the
//! `K` slices and applies the epilogue. (A first version split the 8 warps
//! between row tiles and fewer `K` slices: its long serial `K` loops left
//! it latency-bound.)

use cubecl::prelude::*;

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;

use super::gemv::epilogue;
use crate::ops::cuda::launch::{empty_like, or_stand_in, projection_kernel, Projection};

/// See the module doc. `x` `[M, K]`, `w` `[N, K]`, `out` `[M, N]`, all
/// contiguous; `N % 16 == 0`, `M % (16 m_tiles) == 0` with `m_tiles` 1, 2
/// or 4, `K % 128 == 0`. `CUBE_POS_X` picks the 16 features, `CUBE_POS_Y`
/// the row tile.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn decode_mma_kernel<F: Float>(
    x: &Tensor<F>,
    w: &Tensor<F>,
    bias: &Tensor<F>,
    residual: &Tensor<F>,
    out: &mut Tensor<F>,
    #[comptime] k_len: usize,
    #[comptime] m_tiles: usize,
    #[comptime] warps: usize,
    #[comptime] has_bias: bool,
    #[comptime] gelu: bool,
    #[comptime] has_residual: bool,
    #[define(F)] _dtype: ElemType,
) {
    let warp = UNIT_POS_Y as usize;
    let n0 = CUBE_POS_X as usize * 16;
    let m0 = CUBE_POS_Y as usize * comptime!(16 * m_tiles);
    let n_out = out.shape(1);
    let slice_len = comptime!(k_len / warps);
    let stride = comptime!(k_len as u32);
    let span = comptime!(15 * k_len + 16);

    let acc0 = zeroed_accumulator();
    let acc1 = zeroed_accumulator();
    let acc2 = zeroed_accumulator();
    let acc3 = zeroed_accumulator();
    let mut a = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
    let mut b = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
    let tile_stride = comptime!(16 * k_len);
    #[unroll]
    for step in 0..comptime!(slice_len / 16) {
        let k = warp * slice_len + step * 16;
        let b_at = n0 * k_len + k;
        cmma::load(&mut b, w.slice(b_at, b_at + span), stride);
        let a_at = m0 * k_len + k;
        cmma::load(&mut a, x.slice(a_at, a_at + span), stride);
        cmma::execute(&a, &b, &acc0, &acc0);
        if comptime![m_tiles > 1] {
            let at = a_at + tile_stride;
            cmma::load(&mut a, x.slice(at, at + span), stride);
            cmma::execute(&a, &b, &acc1, &acc1);
        }
        if comptime![m_tiles > 2] {
            let at = a_at + 2 * tile_stride;
            cmma::load(&mut a, x.slice(at, at + span), stride);
            cmma::execute(&a, &b, &acc2, &acc2);
            let at = a_at + 3 * tile_stride;
            cmma::load(&mut a, x.slice(at, at + span), stride);
            cmma::execute(&a, &b, &acc3, &acc3);
        }
    }

    // Each warp's 16x16 partial per row tile, row-major, at
    // `(warp * m_tiles + tile) * 256`.
    let mut parts = Shared::<[f32]>::new_slice(comptime!(warps * m_tiles * 256));
    let at = warp * comptime!(m_tiles * 256);
    store_tile(&mut parts, at, &acc0);
    if comptime![m_tiles > 1] {
        store_tile(&mut parts, at + 256, &acc1);
    }
    if comptime![m_tiles > 2] {
        store_tile(&mut parts, at + 512, &acc2);
        store_tile(&mut parts, at + 768, &acc3);
    }
    sync_cube();

    // Sum the K slices of each output, then the epilogue.
    let mut idx = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    while idx < comptime!(m_tiles * 256) {
        let mut v = f32::new(0.0);
        #[unroll]
        for s in 0..warps {
            v += parts[s * comptime!(m_tiles * 256) + idx];
        }
        let row = m0 + idx / 16;
        let n = n0 + idx % 16;
        let v = epilogue(v, bias, residual, row, n, has_bias, gelu, has_residual);
        out[row * n_out + n] = F::cast_from(v);
        idx += comptime!(warps * 32);
    }
}

/// An uninitialized 16x16x16 `F` fragment (A or B) laid out as `layout`.
#[cube]
pub(super) fn fragment<F: Float>(
    #[comptime] ident: cmma::MatrixIdent,
    #[comptime] layout: cmma::MatrixLayout,
) -> cmma::Matrix<F> {
    unsafe { cmma::Matrix::<F>::uninitialized(ident, 16usize, 16usize, 16usize, layout) }
}

/// Stores accumulator `acc` row-major (row stride 16) at `parts[at..at + 256]`.
#[cube]
fn store_tile(parts: &mut Shared<[f32]>, at: usize, acc: &cmma::Matrix<f32>) {
    cmma::store(
        parts.slice_mut(at, at + 256),
        acc,
        16u32,
        cmma::MatrixLayout::RowMajor,
    );
}

/// A 16x16 f32 accumulator fragment filled with zeros.
#[cube]
pub(super) fn zeroed_accumulator() -> cmma::Matrix<f32> {
    cmma::Matrix::<f32>::from_value(
        cmma::MatrixIdent::Accumulator,
        16usize,
        16usize,
        16usize,
        cmma::MatrixLayout::Undefined,
        f32::new(0.0),
    )
}

projection_kernel! {
    /// On the tensor-core kernel: `row_tiles` 16-row tiles (1, 2 or 4) and
    /// `warps` warps per cube.
    pub fn MmaLinear::mma_linear(row_tiles: usize, warps: usize)
}

/// Launches [`decode_mma_kernel`] for `p` (contiguous operands) with
/// `row_tiles` 16-row tiles and `warps` warps per cube (the plan:
/// `crate::ops::plan::linear`). Returns `[B, N]`.
pub fn launch(p: Projection, row_tiles: usize, warps: usize) -> CubeTensor {
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
    decode_mma_kernel::launch(
        &x.client,
        CubeCount::Static((n / 16) as u32, (b / (16 * row_tiles)) as u32, 1),
        CubeDim::new_2d(32, warps as u32),
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        bias.into_tensor_arg(),
        residual.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        k,
        row_tiles,
        warps,
        has_bias,
        gelu,
        has_residual,
        dtype_to_storage_type(dtype),
    );
    out
}
