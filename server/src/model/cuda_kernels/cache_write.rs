//! The KV-cache write kernel: one thread per element copies each new token's
//! K and V (the middle and last thirds of its fused `qkv` row) into its cache
//! slot of the `[H, S, D]` storage, in place.

use cubecl::prelude::*;

/// `k_cache[h, slots[n], d] = qkv[n, E + h D + d]`, and the same for V from
/// the last third.
#[cube(launch)]
pub fn kv_write_kernel<F: Float, I: Numeric>(
    qkv: &Tensor<F>,
    slots: &Tensor<I>,
    k_cache: &mut Tensor<F>,
    v_cache: &mut Tensor<F>,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let head_dim = k_cache.shape(2);
    let e = k_cache.shape(0) * head_dim;
    let rows = slots.shape(0);
    let pos = ABSOLUTE_POS;
    if pos >= rows * e {
        terminate!();
    }
    let n = pos / e;
    let c = pos % e;
    let h = c / head_dim;
    let d = c % head_dim;
    let slot = u32::cast_from(slots[n * slots.stride(0)]) as usize;
    let dst = h * k_cache.stride(0) + slot * k_cache.stride(1) + d * k_cache.stride(2);
    let row = n * qkv.stride(0);
    k_cache[dst] = qkv[row + (e + c) * qkv.stride(1)];
    v_cache[dst] = qkv[row + (2 * e + c) * qkv.stride(1)];
}
