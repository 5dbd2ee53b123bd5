//! `--check-kernels`, the KV-write cases: the CUDA KV-write kernel against
//! `select_assign`, and the decode attention kernel with the KV write folded
//! in against the write and the reference attention.

use burn::prelude::*;
use ember_engine::model::LayerKv;
use ember_engine::ops::cuda::{kv_write, paged_decode_attention};
use ember_engine::ops::{reference, PagedContext};
use ember_engine::KernelTuning;

use crate::check_data::{copy, floats, ints, max_diff, normal, BLOCK};

/// KV write of `b` rows (`h` heads of `d`): the kernel on the cache
/// itself against `select_assign` on a copy. Returns (max diff, whether
/// the caller's storage was written in place).
pub fn kv_write_check(b: usize, h: usize, d: usize, dev: &Device) -> (f32, bool) {
    let e = h * d;
    let slots_total = 80 * BLOCK;
    let cache = LayerKv {
        k: normal([h, slots_total, d], dev),
        v: normal([h, slots_total, d], dev),
    };
    let qkv = normal([b, 3 * e], dev);
    let slots: Vec<i32> = (0..b).map(|i| (i * 37 + 5) as i32).collect();
    let slots = ints(slots, [b], dev);
    let (ref_k, ref_v) =
        reference::kv_write(copy(&cache.k), copy(&cache.v), qkv.clone(), slots.clone());
    let (k, v) = kv_write(cache.k.clone(), cache.v.clone(), qkv, slots);
    let write_diff =
        max_diff(floats(k), floats(ref_k.clone())).max(max_diff(floats(v), floats(ref_v)));
    // The kernel wrote the caller's storage in place (no copy).
    let in_place_diff = max_diff(floats(cache.k.clone()), floats(ref_k));

    (write_diff, in_place_diff == 0.0)
}

/// Decode attention with the KV write folded in (`write_slots`), unsplit
/// and split, against `select_assign` + the reference attention, on a
/// cache where each row owns its blocks (in reverse order). Returns (max
/// output diff, max cache diff).
pub fn fused_write_check(
    tuning: &KernelTuning,
    lens: &[i32],
    h: usize,
    d: usize,
    dev: &Device,
) -> (f32, f32) {
    let (b, w, e) = (lens.len(), 16usize, h * d);
    let slots_total = (b * w + 1) * BLOCK;
    let tables: Vec<i32> = (0..b * w)
        .map(|i| ((i / w) * w + (w - 1 - i % w)) as i32)
        .collect();
    let slots: Vec<i32> = lens
        .iter()
        .enumerate()
        .map(|(row, &len)| {
            let t = (len - 1) as usize;
            tables[row * w + t / BLOCK] * BLOCK as i32 + (t % BLOCK) as i32
        })
        .collect();
    let slots = ints(slots, [b], dev);
    let qkv = normal([b, 3 * e], dev);
    let q = qkv.clone().slice([0..b, 0..e]);
    let unsplit = PagedContext {
        tables: ints(tables, [b, w], dev),
        lens: ints(lens.to_vec(), [b], dev),
        block_size: BLOCK,
        max_context: w * BLOCK,
        arrivals: None,
    };
    let split = PagedContext {
        arrivals: Some(Tensor::zeros([b * h], dev)),
        ..unsplit.clone()
    };
    let (mut out_diff, mut cache_diff) = (0.0f32, 0.0f32);
    for paged in [unsplit, split] {
        let (k, v) = (
            normal([h, slots_total, d], dev),
            normal([h, slots_total, d], dev),
        );
        let (ref_k, ref_v) = reference::kv_write(copy(&k), copy(&v), qkv.clone(), slots.clone());
        let want = reference::decode_attention(q.clone(), &ref_k, &ref_v, &paged, h);
        let got =
            paged_decode_attention(tuning, qkv.clone(), &k, &v, &paged, h, Some(slots.clone()));
        out_diff = out_diff.max(max_diff(floats(got), floats(want)));
        cache_diff = cache_diff
            .max(max_diff(floats(k), floats(ref_k)))
            .max(max_diff(floats(v), floats(ref_v)));
    }
    (out_diff, cache_diff)
}
