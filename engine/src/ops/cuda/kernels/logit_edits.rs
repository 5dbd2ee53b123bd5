//! A step's logit edits (`logit_bias`, and the penalties of rows without a
//! device penalty slot) applied on the way from the forward's logits to the
//! f32 logits the sampling kernel reads: one launch, one cube a row.
//!
//! Each cube copies its row to the f32 output, waits for the copy
//! (`sync_cube`), then walks the whole edit list and applies the entries
//! that fall in its row. The list holds one step's edited `(row, token)`
//! pairs (a `logit_bias` map per row, or the tokens of the rows whose
//! penalties stayed on the host): each cube reading all `N` of them costs
//! `N` reads a row beside the row's own `V`, cheaper than sorting the list
//! by row on the host while `N` stays below the vocabulary. Entries name distinct
//! positions (`crate::sampling::transforms` pads with distinct no-ops), so
//! no two threads write one value.
//!
//! Why Ember's own: the same edits as Burn tensor ops (a gather, five
//! element-wise ops, a scatter) were fused by Burn differently from step to
//! step, depending on the rows' options, and each new fusion compiled a
//! kernel on the scheduler thread while serving (issue 46). This kernel's
//! sizes are run-time values: it compiles once per dtype.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::extension::cuda_kernel;

/// Warps of each row's cube.
const EDIT_WARPS: u32 = 8;

/// `out[b, :] = logits[b, :]` as f32, then for every entry `e` whose flat
/// index `idx[e] = b * V + t` is in row `b`: `x = out[b, t] + add[e]`,
/// `out[b, t] = (x > 0 ? x / rep[e] : x * rep[e]) - sub[e]` (vLLM's order:
/// bias, repetition penalty, frequency and presence). One cube a row.
#[cube(launch, create_dummy_kernel)]
pub fn logit_edits_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    idx: &Tensor<I>,
    add: &Tensor<f32>,
    rep: &Tensor<f32>,
    sub: &Tensor<f32>,
    out: &mut Tensor<f32>,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS_X as usize;
    let threads = CUBE_DIM as usize;
    let tid = UNIT_POS as usize;
    let vocab = logits.shape(1);
    let src = row * logits.stride(0);
    let dst = row * out.stride(0);
    let mut i = tid;
    while i < vocab {
        out[dst + i] = f32::cast_from(logits[src + i]);
        i += threads;
    }
    sync_cube();
    let first = row * vocab;
    let mut e = tid;
    while e < idx.shape(0) {
        let at = u32::cast_from(idx[e]) as usize;
        if at >= first && at < first + vocab {
            let o = dst + (at - first);
            let x = out[o] + add[e];
            let r = rep[e];
            out[o] = select(x > 0.0, x / r, x * r) - sub[e];
        }
        e += threads;
    }
}

cuda_kernel! {
    /// `logits` `[B, V]` with the edits `idx`, `add`, `rep`, `sub` (`[N]`
    /// each, see [`logit_edits_kernel`]) applied, written into `out` `[B,
    /// V]` (f32, allocated by the caller), in place; returns `out`.
    #[fusion(dtype = out, shape = out)]
    #[launch(launch(out, logits, idx, add, rep, sub))]
    pub fn LogitEdits::logit_edits(
        #[in_place] out: Tensor<2>,
        logits: Tensor<2>,
        idx: Tensor<1, Int>,
        add: Tensor<1>,
        rep: Tensor<1>,
        sub: Tensor<1>,
    ) -> Tensor<2>
}

/// Launches [`logit_edits_kernel`], one cube a row of `logits`.
pub fn launch(
    out: CubeTensor,
    logits: CubeTensor,
    idx: CubeTensor,
    add: CubeTensor,
    rep: CubeTensor,
    sub: CubeTensor,
) -> CubeTensor {
    let [b, v] = logits.shape().dims::<2>();
    let [n] = idx.shape().dims::<1>();
    let f32s = [&add, &rep, &sub, &out]
        .iter()
        .all(|t| t.dtype == DType::F32);
    assert!(
        f32s && out.shape().dims::<2>() == [b, v]
            && out.meta.strides()[1] == 1
            && logits.meta.strides()[1] == 1
            && [&add, &rep, &sub].iter().all(|t| t.shape().dims::<1>() == [n]),
        "logit_edits: logits and f32 out [B, V] with contiguous rows, idx and f32 add, rep, sub [N]"
    );
    if b == 0 {
        return out;
    }
    let (f, i) = (logits.dtype, idx.dtype);
    let client = logits.client.clone();
    logit_edits_kernel::launch(
        &client,
        CubeCount::Static(b as u32, 1, 1),
        CubeDim::new_2d(32, EDIT_WARPS),
        logits.into_tensor_arg(),
        idx.into_tensor_arg(),
        add.into_tensor_arg(),
        rep.into_tensor_arg(),
        sub.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    out
}
