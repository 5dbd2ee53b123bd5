//! Decode attention read straight from the paged KV cache, on the CPU (Flex).
//!
//! The tensor-op path gathers each sequence's context out of the cache
//! (`[H, B*T, D]`, a copy of every live K and V row) and then runs Burn's fused
//! attention over it. On the CPU that gather is a fifth of a batch-16 step, so
//! a decode step (one query per sequence) reads K and V in place instead: for
//! each (sequence, head) pair, in parallel over the rayon pool, it walks the
//! sequence's context slots, takes `q . k` (scaled by `1/sqrt(D)`), a softmax
//! over the `len` visible positions, and the weighted sum of the V rows. No
//! mask is needed: positions `>= len` are simply not visited.
//!
//! [`decode_attention`] returns `None` when its inputs are not f32 Flex tensors
//! (CUDA, where issue 11's paged kernel goes), and the caller takes the
//! tensor-op path, which stays the reference; a test holds the two together.

use burn::prelude::*;
use burn::tensor::DType;
use rayon::prelude::*;

use super::flex_slices::{axpy, dense, dot, values};
use super::kv_cache::LayerKv;

/// Attention of one query per sequence over its paged context.
///
/// - `q`: `[B, E]` queries (`E = H * D`)
/// - `cache`: the layer's K/V, `[H, S, D]` each
/// - `slots`: `[B * T]` cache slots of each sequence's context positions
/// - `lens`: `[B]` visible positions per sequence (`<= T`)
/// - returns `[B, E]`, or `None` off the CPU
pub fn decode_attention(
    q: &Tensor<2>,
    cache: &LayerKv,
    slots: &Tensor<1, Int>,
    lens: &Tensor<1, Int>,
    n_head: usize,
) -> Option<Tensor<2>> {
    let [b, e] = q.dims();
    let [h, s, d] = cache.k.dims();
    if h != n_head || h * d != e || q.dtype() != DType::F32 {
        return None;
    }
    let device = q.device();
    let q = dense(q)?;
    let k = dense(&cache.k)?;
    let v = dense(&cache.v)?;
    let slots = dense(slots)?;
    let lens = dense(lens)?;
    if slots.dtype() != DType::I32 || lens.dtype() != DType::I32 {
        return None;
    }
    let t = slots.layout().shape()[0] / b.max(1);
    let shape = Shape {
        heads: h,
        slots: s,
        head_dim: d,
        context: t,
    };
    let out = attend(
        values::<f32>(&q),
        values::<f32>(&k),
        values::<f32>(&v),
        values::<i32>(&slots),
        values::<i32>(&lens),
        shape,
    )?;
    Some(Tensor::from_data(TensorData::new(out, [b, e]), &device))
}

/// Sizes [`attend`] works with.
#[derive(Debug, Clone, Copy)]
struct Shape {
    heads: usize,
    slots: usize,
    head_dim: usize,
    /// Context positions per sequence in `slots` (`T`).
    context: usize,
}

/// The kernel over raw slices; `None` if an index is out of range.
fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    slots: &[i32],
    lens: &[i32],
    shape: Shape,
) -> Option<Vec<f32>> {
    let Shape {
        heads: h,
        slots: s,
        head_dim: d,
        context: t,
    } = shape;
    let valid = |slot: i32| (0..s as i64).contains(&i64::from(slot));
    if !slots.iter().all(|&x| valid(x)) || lens.iter().any(|&l| l < 0 || l as usize > t) {
        return None;
    }
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; q.len()];
    out.par_chunks_mut(d).enumerate().for_each(|(row, out)| {
        let (seq, head) = (row / h, row % h);
        let query = &q[row * d..(row + 1) * d];
        let len = lens[seq] as usize;
        let context = &slots[seq * t..seq * t + len];
        let head_base = head * s * d;
        let at = |slot: i32| head_base + slot as usize * d;
        let mut scores: Vec<f32> = context
            .iter()
            .map(|&slot| dot(query, &k[at(slot)..at(slot) + d]) * scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for x in &mut scores {
            *x = (*x - max).exp();
            total += *x;
        }
        for (&slot, &p) in context.iter().zip(&scores) {
            axpy(p / total, &v[at(slot)..at(slot) + d], out);
        }
    });
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    use burn::tensor::Distribution;

    /// The native kernel against Burn's fused attention over the gathered
    /// context (the tensor-op path), with ragged lengths and scattered slots.
    #[test]
    fn matches_the_tensor_op_path() {
        let dev = Device::flex();
        let (b, h, d, s, t) = (3, 4, 16, 40, 8);
        let e = h * d;
        let cache = LayerKv {
            k: Tensor::random([h, s, d], Distribution::Normal(0.0, 1.0), &dev),
            v: Tensor::random([h, s, d], Distribution::Normal(0.0, 1.0), &dev),
        };
        let q = Tensor::<2>::random([b, e], Distribution::Normal(0.0, 1.0), &dev);
        let slots: Vec<i32> = (0..b * t).map(|i| ((i * 7 + 3) % s) as i32).collect();
        let lens = [8i32, 3, 1];
        let slots_t = Tensor::<1, Int>::from_data(TensorData::new(slots.clone(), [b * t]), &dev);
        let lens_t = Tensor::<1, Int>::from_data(TensorData::new(lens.to_vec(), [b]), &dev);

        let got = decode_attention(&q, &cache, &slots_t, &lens_t, h).expect("flex path");

        let k = cache
            .k
            .clone()
            .select(1, slots_t.clone())
            .reshape([h, b, t, d]);
        let v = cache.v.clone().select(1, slots_t).reshape([h, b, t, d]);
        let qh = q.reshape([b, 1, h, d]).permute([2, 0, 1, 3]); // [H, B, 1, D]
        let j = Tensor::<1, Int>::arange(0..t as i64, &dev).reshape([1, 1, 1, t]);
        let mask = j
            .expand([1, b, 1, t])
            .greater_equal(lens_t.reshape([1, b, 1, 1]).expand([1, b, 1, t]))
            .expand([h, b, 1, t]);
        let want = attention(
            qh,
            k,
            v,
            Some(mask),
            None,
            AttentionModuleOptions::default(),
        )
        .permute([1, 2, 0, 3])
        .reshape([b, e]);
        let (got, want): (Vec<f32>, Vec<f32>) = (
            got.into_data().iter::<f32>().collect(),
            want.into_data().iter::<f32>().collect(),
        );
        let worst = got
            .iter()
            .zip(&want)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "max diff {worst}");
    }

    #[test]
    fn out_of_range_slots_fall_back_instead_of_reading_past_the_cache() {
        let dev = Device::flex();
        let cache = LayerKv {
            k: Tensor::zeros([2, 4, 8], &dev),
            v: Tensor::zeros([2, 4, 8], &dev),
        };
        let q = Tensor::<2>::zeros([1, 16], &dev);
        let slots = Tensor::<1, Int>::from_data(TensorData::new(vec![0i32, 9], [2]), &dev);
        let lens = Tensor::<1, Int>::from_data(TensorData::new(vec![2i32], [1]), &dev);
        assert!(decode_attention(&q, &cache, &slots, &lens, 2).is_none());
    }
}
