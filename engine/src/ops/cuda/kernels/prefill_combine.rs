//! Prefill attention split across cubes (`--prefill-attention-splits`):
//! what a split cube writes, and the kernel that merges the splits.
//!
//! A short prefill has few tiles (GPT-2 1 x 256: 4 tiles and a padding one,
//! 12 heads: 60 cubes of 4 warps on 132 SMs), and the tile of the last
//! queries walks every key chunk one after another: ncu measured 24 us a
//! launch at 5.6% achieved occupancy and 7.9 cycles per issued instruction
//! (H200, 2026-11-29 call 44), a few warps each running a long serial
//! stream. Split `s` of `splits` takes the tile's key chunks `s * per ..
//! (s + 1) * per` (`per = ceil(chunks / splits)`; a split past the last
//! chunk takes none) and, for each of its real queries and its head, writes
//! its unnormalized output, its max and its sum of `exp` (flash-decoding's
//! partials) to `partials` `[splits, T, H, PARTIAL_STRIDE]` f32.
//! [`prefill_combine_kernel`] then rescales the splits to their common max:
//! `out = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s`. Split 0 always
//! holds position 0, which every query sees, so `M` is finite and the
//! denominator positive; a split that saw nothing a query sees has `m =
//! -1e30`, `l = 0`, `O = 0` and weighs nothing. Padding tokens (past the
//! last row of `cu_seqlens`) get 0, as the unsplit kernel's zeroed output
//! leaves them.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

/// f32s a (split, token, head) partial takes: 64 output values, the max,
/// the sum of `exp`.
pub const PARTIAL_STRIDE: usize = 66;

/// This lane's share of a split's partial for query `token` of head `head`
/// (`o`: its 32 unnormalized values from column `c0`; `ml`: the row's max
/// and sum, which the lane at `c0 = 0` writes), into `partials`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn write_partial(
    partials: &mut Tensor<f32>,
    o: &Array<f32>,
    ml: &Array<f32>,
    split: usize,
    tokens: usize,
    token: usize,
    head: usize,
    c0: usize,
    #[comptime] heads: usize,
    #[comptime] head_dim: usize,
) {
    let at = ((split * tokens + token) * heads + head) * PARTIAL_STRIDE;
    #[unroll]
    for j in 0..32 {
        if c0 + j < head_dim {
            partials[at + c0 + j] = o[j];
        }
    }
    if c0 == 0 {
        partials[at + 64] = ml[0];
        partials[at + 65] = ml[1];
    }
}

/// `out[t, head * head_dim + d]` from the `splits` partials of token `t`
/// (`CUBE_POS_X`) and head `CUBE_POS_Y`, one unit a dimension (module doc);
/// 0 for tokens past `cu_seqlens`' last entry. `out` `[T, E]` contiguous.
#[cube(launch, create_dummy_kernel)]
pub fn prefill_combine_kernel<F: Float, I: Numeric>(
    partials: &Tensor<f32>,
    cu_seqlens: &Tensor<I>,
    out: &mut Tensor<F>,
    #[comptime] n_embd: usize,
    #[comptime] head_dim: usize,
    #[comptime] splits: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let token = CUBE_POS_X as usize;
    let head = CUBE_POS_Y as usize;
    let d = UNIT_POS_X as usize;
    let heads = comptime!(n_embd / head_dim);
    let tokens = out.shape(0);
    let last = (cu_seqlens.shape(0) - 1) * cu_seqlens.stride(0);
    let total = u32::cast_from(cu_seqlens[last]) as usize;
    if d < head_dim {
        let mut value = f32::new(0.0);
        if token < total {
            let mut m = f32::new(-1.0e30);
            #[unroll]
            for s in 0..splits {
                let at = ((s * tokens + token) * heads + head) * PARTIAL_STRIDE;
                let ms = partials[at + 64];
                m = select(ms > m, ms, m);
            }
            let mut num = f32::new(0.0);
            let mut den = f32::new(0.0);
            #[unroll]
            for s in 0..splits {
                let at = ((s * tokens + token) * heads + head) * PARTIAL_STRIDE;
                let w = (partials[at + 64] - m).exp();
                num += w * partials[at + d];
                den += w * partials[at + 65];
            }
            value = num / den;
        }
        out[token * n_embd + head * head_dim + d] = F::cast_from(value);
    }
}

/// Launches [`prefill_combine_kernel`] into `out` `[T, E]` (contiguous)
/// over `partials` written by `splits` split cubes of `heads` heads.
pub fn launch(
    partials: CubeTensor,
    cu_seqlens: CubeTensor,
    out: &CubeTensor,
    heads: usize,
    splits: usize,
) {
    let [t, e] = out.shape().dims::<2>();
    let (f, i) = (out.dtype, cu_seqlens.dtype);
    prefill_combine_kernel::launch(
        &out.client,
        CubeCount::Static(t as u32, heads as u32, 1),
        CubeDim::new_1d(64),
        partials.into_tensor_arg(),
        cu_seqlens.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        e,
        e / heads,
        splits,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
}
