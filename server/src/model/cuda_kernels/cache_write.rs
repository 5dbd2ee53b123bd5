//! The KV-cache write kernel: each thread copies one vector (16 bytes in
//! f16) of a new token's K and V (the middle and last thirds of its fused
//! `qkv` row) into its cache slot of the `[H, S, D]` storage, in place.

use cubecl::prelude::*;

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
