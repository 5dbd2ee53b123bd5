//! The tensor-op path of every op: Burn's own ops, on any backend and dtype.
//!
//! This is what the CPU runs (except attention, which has native kernels in
//! [`super::cpu`]), what CUDA runs where Ember's kernels do not apply (large
//! projections, prefill attention turned off), and the reference every
//! hand-written kernel is checked against: the CPU kernels in unit tests, the
//! CUDA kernels by `ember-engine-bench --check-kernels`. The attention
//! references gather each sequence's context through its block table and
//! mask what a query may not see; the kernels read the cache in place.

use burn::prelude::*;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, IndexingUpdateOp};

use super::attention::{PagedContext, SegmentContext};
use super::epilogue::Epilogue;

/// `x W + b`, then the epilogue; `w` is `[d_in, d_out]`, or `[d_out, d_in]`
/// when `out_major` (read through a transposed view, no copy).
pub fn linear<const D: usize>(
    x: Tensor<D>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    out_major: bool,
    epilogue: Epilogue<D>,
) -> Tensor<D> {
    let w = if out_major {
        w.clone().transpose()
    } else {
        w.clone()
    };
    let mut y = x.matmul(w.unsqueeze());
    if let Some(b) = bias {
        y = y + b.clone().unsqueeze();
    }
    if epilogue.gelu {
        y = gelu_tanh(y);
    }
    match epilogue.residual {
        Some(r) => r + y,
        None => y,
    }
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`: GPT-2's GELU
/// (`gelu_new` in transformers), written with `x * x * x` rather than Burn's
/// `gelu_approximate`, whose `powf` makes it several times slower on the CPU.
pub fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    let cube = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + cube * 0.044715) * SQRT_2_OVER_PI;
    x * (inner.tanh() + 1.0) * 0.5
}

/// `(x - mean) / sqrt(var + eps) * gamma + beta` over the last dimension
/// (biased variance, as PyTorch), with the statistics in f32: GPT-2's
/// residual stream has dimensions in the thousands, whose squares overflow
/// f16. The normalized values (order 1) are cast back, so `gamma`/`beta` are
/// used in the model's dtype as stored.
pub fn layer_norm<const D: usize>(
    x: Tensor<D>,
    gamma: &Tensor<1>,
    beta: &Tensor<1>,
    eps: f64,
) -> Tensor<D> {
    let dtype = x.dtype();
    let x = x.cast(DType::F32);
    let mean = x.clone().mean_dim(D - 1);
    let centered = x - mean;
    let var = (centered.clone() * centered.clone()).mean_dim(D - 1);
    let normed = (centered / (var + eps).sqrt()).cast(dtype);
    normed * gamma.clone().unsqueeze::<D>() + beta.clone().unsqueeze::<D>()
}

/// Writes the K and V thirds of `qkv` (`[N, 3E]`) at `slots` (`[N]`) of the
/// `[H, S, D]` storage with `select_assign`: in place when the storage is
/// uniquely owned (the engine moves each layer's tensors through the forward
/// pass for that), a copy otherwise.
pub fn kv_write(
    k_cache: Tensor<3>,
    v_cache: Tensor<3>,
    qkv: Tensor<2>,
    slots: Tensor<1, Int>,
) -> (Tensor<3>, Tensor<3>) {
    let [h, _, d] = k_cache.dims();
    let [n, _] = qkv.dims();
    let e = h * d;
    let heads = |x: Tensor<2>| x.reshape([n, h, d]).swap_dims(0, 1); // [H, N, D]
                                                                     // Rows in the storage's dtype (bf16 on the CPU with bf16 weights).
    let k = heads(qkv.clone().slice([0..n, e..2 * e])).cast(k_cache.dtype());
    let v = heads(qkv.slice([0..n, 2 * e..3 * e])).cast(v_cache.dtype());
    (
        k_cache.select_assign(1, slots.clone(), k, IndexingUpdateOp::Assign),
        v_cache.select_assign(1, slots, v, IndexingUpdateOp::Assign),
    )
}

/// Burn's fused attention (Flex: a native kernel; CUDA: the flash kernel,
/// which a boolean mask and the default scale keep it on) of `q`
/// `[H, B, Q, D]` over `k`, `v` `[H, B, T, D]`, the `[B, 1, Q, T]` mask
/// shared by every head; returns `[B*Q, E]`.
fn masked_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, mask: Tensor<4, Bool>) -> Tensor<2> {
    let [h, b, q_len, d] = q.dims();
    let t = k.dims()[2];
    let mask = mask.reshape([1, b, q_len, t]).expand([h, b, q_len, t]);
    let options = AttentionModuleOptions {
        scale: None, // 1/sqrt(D), GPT-2's
        softcap: None,
        is_causal: false, // the mask carries causality and padding
    };
    attention(q, k, v, Some(mask), None, options) // [H, B, Q, D]
        .permute([1, 2, 0, 3])
        .reshape([b * q_len, h * d])
}

/// The `[H, S, D]` cache's rows at `slots`, in `dtype` (the queries'; the
/// storage may be bf16), shaped `shape` (`[H, rows, positions, D]`).
fn cache_rows(
    cache: &Tensor<3>,
    slots: &Tensor<1, Int>,
    dtype: DType,
    shape: [usize; 4],
) -> Tensor<4> {
    cache
        .clone()
        .select(1, slots.clone())
        .cast(dtype)
        .reshape(shape)
}

/// `[R, len]` slots of positions `0..len` of each row through its block
/// table (`[R, W]`, blocks of `block_size`); `len <= W * block_size`.
fn context_slots(tables: &Tensor<2, Int>, block_size: usize, len: usize) -> Tensor<2, Int> {
    let [r, w] = tables.dims();
    let blocks = len.div_ceil(block_size).min(w);
    let offsets = Tensor::<1, Int>::arange(0..block_size as i64, &tables.device());
    let slots = tables
        .clone()
        .slice([0..r, 0..blocks])
        .reshape([r, blocks, 1])
        * block_size as i64
        + offsets.reshape([1, 1, block_size]);
    slots
        .reshape([r, blocks * block_size])
        .slice([0..r, 0..len])
}

/// Prefill attention by tensor ops (see [`SegmentContext`]): each row's
/// queries are gathered from the flat `qkv` (`[T, 3E]`) into `[R, Qm]`
/// (`Qm` = its `max_queries`; rows shorter than that repeat their last
/// query), each row's context `0..Tm` (`max_context`) is gathered from the
/// `[H, S, D]` storage through its block table, a mask hides every key past
/// a query's position, and Burn's attention runs over the padded batch; the
/// results go back to their flat rows. Padding tokens (past `cu[R]`) get
/// zeros. Returns `[T, E]`.
pub fn segment_attention(
    qkv: Tensor<2>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    n_head: usize,
    seg: &SegmentContext,
) -> Tensor<2> {
    let [t, e3] = qkv.dims();
    let (e, r) = (e3 / 3, seg.starts.dims()[0]);
    let (h, d) = (n_head, e3 / 3 / n_head);
    let (qm, tm) = (seg.max_queries.max(1), seg.max_context.max(1));
    let device = qkv.device();
    let first = seg.cu_seqlens.clone().narrow(0, 0, r);
    let ends = seg.cu_seqlens.clone().narrow(0, 1, r);
    // Query `i` of row `r` is its query `min(i, len - 1)` (padding repeats
    // the last one; an empty row reads its first slot, any valid row).
    let last = (ends.clone() - first.clone()).sub_scalar(1).clamp_min(0);
    let i = Tensor::<1, Int>::arange(0..qm as i64, &device)
        .reshape([1, qm])
        .expand([r, qm])
        .min_pair(last.reshape([r, 1]).expand([r, qm]));
    let flat = (first.clone().reshape([r, 1]).expand([r, qm]) + i.clone()).clamp_max(t as i64 - 1);
    let q = qkv.slice([0..t, 0..e]).select(0, flat.reshape([r * qm]));
    let q = q.reshape([r, qm, h, d]).permute([2, 0, 1, 3]); // [H, R, Qm, D]

    let slots = context_slots(&seg.tables, seg.block_size, tm).reshape([r * tm]);
    let k = cache_rows(k_cache, &slots, q.dtype(), [h, r, tm, d]);
    let v = cache_rows(v_cache, &slots, q.dtype(), [h, r, tm, d]);
    // Key `j` is hidden from query `i` of row `r` when `j > start[r] + i`.
    let limit = seg.starts.clone().reshape([r, 1]).expand([r, qm]) + i;
    let j = Tensor::<1, Int>::arange(0..tm as i64, &device)
        .reshape([1, 1, tm])
        .expand([r, qm, tm]);
    let mask = j.greater(limit.reshape([r, qm, 1]).expand([r, qm, tm]));
    let out = masked_attention(q, k, v, mask.reshape([r, 1, qm, tm])); // [R*Qm, E]

    // Token `n` is in the row after every row that ends at or before it.
    let n = Tensor::<1, Int>::arange(0..t as i64, &device);
    let row = ends
        .reshape([1, r])
        .expand([t, r])
        .lower_equal(n.clone().reshape([t, 1]).expand([t, r]))
        .int()
        .sum_dim(1)
        .reshape([t]);
    let padding = row.clone().greater_equal_elem(r as i64);
    let row = row.clamp_max(r as i64 - 1);
    let i = (n - first.select(0, row.clone())).clamp(0, qm as i64 - 1);
    out.select(0, row * qm as i64 + i)
        .mask_fill(padding.reshape([t, 1]).expand([t, e]), 0.0)
}

/// Decode attention by tensor ops: gathers every sequence's context through
/// its block table (`[H, B*T, D]`, `T = W * block_size`), masks positions
/// past its length, and runs Burn's fused attention. `q` is `[B, E]`;
/// returns `[B, E]`.
pub fn decode_attention(
    q: Tensor<2>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    paged: &PagedContext,
    n_head: usize,
) -> Tensor<2> {
    let [b, e] = q.dims();
    let (h, d) = (n_head, e / n_head);
    let [_, w] = paged.tables.dims();
    let bs = paged.block_size;
    let t = w * bs;
    let device = q.device();
    let slots = context_slots(&paged.tables, bs, t).reshape([b * t]);
    let k = cache_rows(k_cache, &slots, q.dtype(), [h, b, t, d]);
    let v = cache_rows(v_cache, &slots, q.dtype(), [h, b, t, d]);
    let j = Tensor::<1, Int>::arange(0..t as i64, &device).reshape([1, 1, 1, t]);
    let lens = paged
        .lens
        .clone()
        .reshape([1, b, 1, 1])
        .expand([1, b, 1, t]);
    let mask = j
        .expand([1, b, 1, t])
        .greater_equal(lens)
        .reshape([b, 1, 1, t]);
    let qh = q.reshape([b, 1, h, d]).permute([2, 0, 1, 3]); // [H, B, 1, D]
    masked_attention(qh, k, v, mask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::gelu_approximate;
    use burn::tensor::TensorData;

    fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().iter::<f32>().collect()
    }

    #[test]
    fn both_weight_layouts_compute_the_same_product() {
        let dev = Device::flex();
        let w = Tensor::<2>::from_data([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev); // [in 2, out 3]
        let b = Tensor::<1>::from_data([0.5f32, -1.0, 2.0], &dev);
        let x = Tensor::<3>::from_data([[[1.0f32, 1.0]], [[2.0, -1.0]]], &dev); // [2, 1, 2]
        let in_major = linear(x.clone(), &w, Some(&b), false, Epilogue::none());
        let out_major = linear(x, &w.transpose(), Some(&b), true, Epilogue::none());
        let a = floats(in_major);
        assert_eq!(a, [5.5, 6.0, 11.0, -1.5, -2.0, 2.0]);
        assert_eq!(a, floats(out_major));
    }

    #[test]
    fn gelu_tanh_matches_burns_gelu_approximate() {
        let dev = Device::flex();
        let x = Tensor::<1>::from_data([-6.0f32, -2.5, -0.3, 0.0, 0.7, 3.0, 9.0], &dev);
        let a = floats(gelu_tanh(x.clone()));
        let b = floats(gelu_approximate(x));
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn layer_norm_normalizes_the_last_dimension() {
        let dev = Device::flex();
        let gamma = Tensor::ones([4], &dev);
        let beta = Tensor::from_data([0.0, 0.0, 0.0, 1.0], &dev);
        let x = Tensor::<2>::from_data(
            TensorData::new(
                vec![1.0f32, 2.0, 3.0, 4.0, 3000.0, -3000.0, 0.0, 0.0],
                [2, 4],
            ),
            &dev,
        );
        let y = floats(layer_norm(x, &gamma, &beta, 1e-5));
        // Row 0: mean 2.5, biased var 1.25.
        let s = 1.25f32.sqrt();
        let expected = [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s + 1.0];
        for (a, b) in y[..4].iter().zip(expected) {
            assert!((a - b).abs() < 1e-5, "{y:?}");
        }
        assert!(y.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn kv_write_puts_each_rows_k_and_v_at_its_slot() {
        let dev = Device::flex();
        let (h, d, slots) = (2, 2, 4);
        // One row: q = 0..4, k = 10..14, v = 20..24.
        let qkv = Tensor::<2>::from_data(
            TensorData::new(
                (0..4)
                    .chain(10..14)
                    .chain(20..24)
                    .map(|x| x as f32)
                    .collect::<Vec<_>>(),
                [1, 12],
            ),
            &dev,
        );
        let at = Tensor::<1, Int>::from_data(TensorData::new(vec![2i32], [1]), &dev);
        let zeros = || Tensor::<3>::zeros([h, slots, d], &dev);
        let (k, v) = kv_write(zeros(), zeros(), qkv, at);
        let k = floats(k);
        // Head 0 slot 2 = [10, 11]; head 1 slot 2 = [12, 13].
        assert_eq!(&k[4..6], &[10.0, 11.0]);
        assert_eq!(&k[12..14], &[12.0, 13.0]);
        assert_eq!(floats(v)[12..14], [22.0, 23.0]);
    }
}
