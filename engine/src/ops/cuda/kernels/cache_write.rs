//! The KV-cache write kernel: each thread copies one vector (16 bytes in
//! f16) of a new token's K and V (the middle and last thirds of its fused
//! `qkv` row) into its cache slot of the `[H, S, D]` storage, in place.
//! [`write_head_rows`] is the same copy for one token and head, done by the
//! decode attention kernel itself.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::vector_size;

/// `k_cache[h, slots[n], d..d + vs] = qkv[n, E + h D + d..]`, and the same
/// for V from the last third. `qkv` `[N, 3E]` and the caches (rows of `D`
/// contiguous) are read as vectors of `vs` elements.
#[cube(launch)]
pub fn kv_write_kernel<F: Float, I: Numeric, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    slots: &Tensor<I>,
    k_cache: &mut Tensor<Vector<F, N>>,
    v_cache: &mut Tensor<Vector<F, N>>,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let e = k_cache.shape(0) * head_dim;
    let row_vectors = e / vs;
    let rows = slots.shape(0);
    let pos = ABSOLUTE_POS;
    if pos >= rows * row_vectors {
        terminate!();
    }
    let n = pos / row_vectors;
    let c = (pos % row_vectors) * vs;
    let h = c / head_dim;
    let d = c % head_dim;
    let slot = u32::cast_from(slots[n * slots.stride(0)]) as usize;
    let dst = (h * k_cache.stride(0) + slot * k_cache.stride(1) + d) / vs;
    let row = n * qkv.stride(0);
    k_cache[dst] = qkv[(row + e + c) / vs];
    v_cache[dst] = qkv[(row + 2 * e + c) / vs];
}

/// The K and V rows of head `h` of `qkv` row `b` (`[B, 3E]`, vectors of
/// `vs`) into cache slot `slot`: unit `unit` copies vector `unit` of each
/// (units past `head_dim / vs` do nothing). The caller syncs the cube
/// before reading the slot back.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn write_head_rows<F: Float, N: Size>(
    qkv: &Tensor<Vector<F, N>>,
    k_cache: &mut Tensor<Vector<F, N>>,
    v_cache: &mut Tensor<Vector<F, N>>,
    b: usize,
    h: usize,
    slot: usize,
    unit: usize,
    #[comptime] head_dim: usize,
    #[comptime] vs: usize,
) {
    if unit < comptime!(head_dim / vs) {
        let e = k_cache.shape(0) * head_dim;
        let src = (b * qkv.stride(0) + e + h * head_dim) / vs + unit;
        let dst = (h * k_cache.stride(0) + slot * k_cache.stride(1)) / vs + unit;
        k_cache[dst] = qkv[src];
        v_cache[dst] = qkv[src + e / vs];
    }
}

cuda_kernel! {
    /// Writes the K/V thirds of `qkv` (`[N, 3E]`) at `slots` (`[N]`) of the
    /// layer's `[H, S, D]` storage, in place; returns the same storage.
    #[fusion(meta = |k_cache, v_cache, _qkv, _slots| (k_cache.clone(), v_cache.clone()))]
    pub fn KvWrite::kv_write(
        #[in_place] k_cache: Tensor<3>,
        #[in_place] v_cache: Tensor<3>,
        qkv: Tensor<2>,
        slots: Tensor<1, Int>,
    ) -> (Tensor<3>, Tensor<3>)
}

/// Launches [`kv_write_kernel`]: the K/V thirds of contiguous `qkv`
/// `[N, 3E]` at `slots` `[N]` of the `[H, S, D]` storage, written in place;
/// returns the same storage.
pub fn launch(
    k_cache: CubeTensor,
    v_cache: CubeTensor,
    qkv: CubeTensor,
    slots: CubeTensor,
) -> (CubeTensor, CubeTensor) {
    let [h, _, d] = k_cache.shape().dims::<3>();
    let [_, e3] = qkv.shape().dims::<2>();
    let cache_strides = k_cache.meta.strides();
    assert!(
        cache_strides[2] == 1 && v_cache.meta.strides() == cache_strides,
        "kv write: the K/V caches must be row-major [H, S, D] storage"
    );
    let vs = vector_size(&qkv, &[d, e3, cache_strides[0], cache_strides[1]]);
    let n = slots.shape().dims::<1>()[0] * h * d / vs;
    let threads = 256u32;
    let (f, i) = (qkv.dtype, slots.dtype);
    kv_write_kernel::launch(
        &qkv.client,
        CubeCount::Static((n as u32).div_ceil(threads), 1, 1),
        CubeDim::new_1d(threads),
        vs,
        qkv.clone().into_tensor_arg(),
        slots.into_tensor_arg(),
        k_cache.clone().into_tensor_arg(),
        v_cache.clone().into_tensor_arg(),
        d,
        vs,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    (k_cache, v_cache)
}
