//! The KV write on the CPU: each new token's K and V rows, the middle and
//! last thirds of its row of the fused `qkv` `[N, 3E]`, copied into its slot
//! of a layer's `[H, S, D]` storage, in place.
//!
//! The engine's cache owns each layer's storage alone, so the Flex buffer
//! is written where it is: a copy of `D` floats per token and head, nothing
//! allocated. Burn's `select_assign` (still the fallback for storage that is
//! shared, not dense f32, or not on Flex: `crate::ops::reference::kv_write`)
//! materialized a head-major view of `qkv` and indexed through an int
//! tensor first; at batch 16 it was ~3% of a decode step on the 2-core Zen 3
//! (`BATCH=16 bash bench/profile_cpu.sh`: 1.9 of 62 ms). bf16 storage (the
//! cache with bf16 weights) gets each value rounded to nearest even as it is
//! copied.

use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::DType;
use half::bf16;

use super::flex_slices::{dense, int_values, values};
use crate::ops::reference;

/// Writes the K and V thirds of `qkv` (`[N, 3E]`) at `slots` (`[N]`) of `k`
/// and `v` (`[H, S, D]`), in place where both are uniquely owned dense f32
/// or bf16 Flex tensors, else through [`reference::kv_write`]; returns the
/// storage.
/// A slot past `S` is skipped (none is: a padding row's slot is in the
/// storage).
pub fn kv_write(
    k: Tensor<3>,
    v: Tensor<3>,
    qkv: Tensor<2>,
    slots: Tensor<1, Int>,
) -> (Tensor<3>, Tensor<3>) {
    let e = k.dims()[0] * k.dims()[2];
    let rows = match (dense(&qkv), int_values(&slots)) {
        (Some(q), Some(s)) if q.dtype() == DType::F32 && qkv.dims()[1] == 3 * e => (q, s),
        _ => return reference::kv_write(k, v, qkv, slots),
    };
    let (q, slots_host) = rows;
    let src = values::<f32>(&q);
    let (k, written) = write_third(k, src, e, 1, &slots_host);
    if !written {
        return reference::kv_write(k, v, qkv, slots);
    }
    match write_third(v, src, e, 2, &slots_host) {
        (v, true) => (k, v),
        // K is written already; writing it again is harmless.
        (v, false) => reference::kv_write(k, v, qkv, slots),
    }
}

/// Copies third `third` (1: K, 2: V) of each `qkv` row (`src`, rows of
/// `3e`) into `cache` at its slot and returns it with `true`; returns it
/// untouched with `false` where it cannot be written in place.
fn write_third(
    cache: Tensor<3>,
    src: &[f32],
    e: usize,
    third: usize,
    slots: &[i32],
) -> (Tensor<3>, bool) {
    let [h, s, d] = cache.dims();
    let Ok(mut flex) = cache.clone().try_into_primitive::<Flex>() else {
        return (cache, false);
    };
    drop(cache); // the storage's only other owner: `flex` is now unique
    let layout = flex.layout();
    let writable = layout.is_contiguous() && layout.start_offset() == 0 && flex.is_unique();
    let rows = Rows {
        src,
        e,
        third,
        slots,
        heads: h,
        slots_len: s,
        head_dim: d,
    };
    let written = writable
        && match flex.dtype() {
            DType::F32 => flex.try_storage_mut::<f32>().map(|st| rows.copy(st, |x| x)),
            DType::BF16 => flex
                .try_storage_mut::<bf16>()
                .map(|st| rows.copy(st, bf16::from_f32)),
            _ => None,
        }
        .is_some();
    (Tensor::from_primitive::<Flex>(flex), written)
}

/// One third of a step's `qkv` rows and where they go (see [`write_third`]).
struct Rows<'a> {
    src: &'a [f32],
    e: usize,
    third: usize,
    slots: &'a [i32],
    heads: usize,
    slots_len: usize,
    head_dim: usize,
}

impl Rows<'_> {
    /// Copies each token's rows into `storage` (`[H, S, D]`) at its slot,
    /// each value through `to`; slots past `S` are skipped.
    fn copy<T: Copy>(&self, storage: &mut [T], to: impl Fn(f32) -> T) {
        let (e, d, s) = (self.e, self.head_dim, self.slots_len);
        for (token, &slot) in self.src.chunks_exact(3 * e).zip(self.slots) {
            let slot = slot as usize;
            if slot >= s {
                continue;
            }
            let row = &token[self.third * e..(self.third + 1) * e];
            for (head, from) in row.chunks_exact(d).enumerate().take(self.heads) {
                let at = (head * s + slot) * d;
                for (dst, &x) in storage[at..at + d].iter_mut().zip(from) {
                    *dst = to(x);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn all(t: Tensor<3>) -> Vec<f32> {
        t.into_data().iter::<f32>().collect()
    }

    fn case(shared: bool) {
        let dev = Device::flex();
        let (h, s, d, n) = (3usize, 10usize, 4usize, 4usize);
        let k = Tensor::<3>::random([h, s, d], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<3>::random([h, s, d], Distribution::Normal(0.0, 1.0), &dev);
        let qkv = Tensor::<2>::random([n, 3 * h * d], Distribution::Normal(0.0, 1.0), &dev);
        let slots = Tensor::<1, Int>::from_data(TensorData::new(vec![7i32, 0, 9, 3], [n]), &dev);
        let (want_k, want_v) =
            reference::kv_write(k.clone(), v.clone(), qkv.clone(), slots.clone());
        let (want_k, want_v) = (all(want_k), all(want_v));
        // A handle kept elsewhere makes the storage shared: the fallback.
        let keep = shared.then(|| (k.clone(), v.clone()));
        let (got_k, got_v) = kv_write(k, v, qkv, slots);
        assert_eq!(all(got_k), want_k);
        assert_eq!(all(got_v), want_v);
        if let Some((k0, _)) = keep {
            assert_ne!(
                all(k0),
                want_k,
                "a shared storage is not written under its other holder"
            );
        }
    }

    #[test]
    fn writes_each_tokens_rows_in_place_as_the_reference_does() {
        case(false);
    }

    #[test]
    fn shared_storage_takes_the_reference_path() {
        case(true);
    }

    #[test]
    fn bf16_storage_is_written_in_place_rounded_as_the_reference_casts() {
        let dev = Device::flex();
        let (h, s, d, n) = (2usize, 6usize, 4usize, 3usize);
        let zeros = || Tensor::<3>::zeros([h, s, d], (&dev, DType::BF16));
        let qkv = Tensor::<2>::random([n, 3 * h * d], Distribution::Normal(0.0, 1.0), &dev);
        let slots = Tensor::<1, Int>::from_data(TensorData::new(vec![5i32, 1, 2], [n]), &dev);
        let (want_k, want_v) = reference::kv_write(zeros(), zeros(), qkv.clone(), slots.clone());
        let (got_k, got_v) = kv_write(zeros(), zeros(), qkv, slots);
        assert_eq!(got_k.dtype(), DType::BF16);
        let f32s = |t: Tensor<3>| all(t.cast(DType::F32));
        assert_eq!(f32s(got_k), f32s(want_k));
        assert_eq!(f32s(got_v), f32s(want_v));
    }
}
