//! Decode attention read straight from the paged KV cache, on the CPU (Flex).
//!
//! The tensor-op path gathers each sequence's context out of the cache
//! (`[H, B*T, D]`, a copy of every live K and V row) and then runs Burn's fused
//! attention over it. On the CPU that gather is a fifth of a batch-16 step, so
//! a decode step (one query per sequence) reads K and V in place instead: for
//! each (sequence, head) pair, in parallel over the rayon pool, it walks the
//! sequence's block table, takes `q . k` (scaled by `1/sqrt(D)`), a softmax
//! over the `len` visible positions, and the weighted sum of the V rows. No
//! mask is needed: positions `>= len` are simply not visited.
//!
//! [`reference::decode_attention`] is the tensor-op path (gather through the
//! tables, mask, Burn's attention): the reference a test holds the native
//! kernel to (and the GPU check holds the CubeCL kernel to), and the fallback
//! when the inputs are not f32 Flex tensors.

use burn::prelude::*;
use burn::tensor::DType;
use rayon::prelude::*;

use super::flex_slices::{axpy, dense, dot, values};
use crate::ops::attention::PagedContext;
use crate::ops::reference;

/// Attention of one query per sequence over its paged context.
///
/// - `q`: `[B, E]` queries (`E = H * D`)
/// - `k`, `v`: the layer's storage, `[H, S, D]` each
/// - `paged`: block tables `[B, W]` and visible lengths `[B]`
/// - returns `[B, E]`: the native kernel on f32 Flex tensors with valid
///   tables, [`reference::decode_attention`] otherwise
pub fn decode_attention(
    q: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    paged: &PagedContext,
    n_head: usize,
) -> Tensor<2> {
    native(q, k, v, paged, n_head)
        .unwrap_or_else(|| reference::decode_attention(q.clone(), k, v, paged, n_head))
}

/// The native CPU kernel; `None` off Flex/f32 or with out-of-range indices.
fn native(
    q: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    paged: &PagedContext,
    n_head: usize,
) -> Option<Tensor<2>> {
    let [b, e] = q.dims();
    let [h, s, d] = k.dims();
    if h != n_head || h * d != e || q.dtype() != DType::F32 {
        return None;
    }
    let device = q.device();
    let q = dense(q)?;
    let k = dense(k)?;
    let v = dense(v)?;
    let tables = dense(&paged.tables)?;
    let lens = dense(&paged.lens)?;
    if tables.dtype() != DType::I32 || lens.dtype() != DType::I32 {
        return None;
    }
    let shape = Shape {
        heads: h,
        slots: s,
        head_dim: d,
        table_width: tables.layout().shape()[1],
        block_size: paged.block_size,
    };
    let out = attend(
        values::<f32>(&q),
        values::<f32>(&k),
        values::<f32>(&v),
        values::<i32>(&tables),
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
    /// Blocks per table row (`W`).
    table_width: usize,
    block_size: usize,
}

/// The kernel over raw slices; `None` if an index is out of range.
fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    tables: &[i32],
    lens: &[i32],
    shape: Shape,
) -> Option<Vec<f32>> {
    let Shape {
        heads: h,
        slots: s,
        head_dim: d,
        table_width: w,
        block_size: bs,
    } = shape;
    let blocks = s / bs.max(1);
    let valid_block = |b: i32| (0..blocks as i64).contains(&i64::from(b));
    if bs == 0
        || !tables.iter().all(|&b| valid_block(b))
        || lens.iter().any(|&l| l < 0 || l as usize > w * bs)
    {
        return None;
    }
    let scale = 1.0 / (d as f32).sqrt();
    let mut out = vec![0.0f32; q.len()];
    out.par_chunks_mut(d).enumerate().for_each(|(row, out)| {
        let (seq, head) = (row / h, row % h);
        let query = &q[row * d..(row + 1) * d];
        let len = lens[seq] as usize;
        let table = &tables[seq * w..(seq + 1) * w];
        let head_base = head * s * d;
        let at = |t: usize| head_base + (table[t / bs] as usize * bs + t % bs) * d;
        let mut scores: Vec<f32> = (0..len)
            .map(|t| dot(query, &k[at(t)..at(t) + d]) * scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0;
        for x in &mut scores {
            *x = (*x - max).exp();
            total += *x;
        }
        for (t, &p) in scores.iter().enumerate() {
            axpy(p / total, &v[at(t)..at(t) + d], out);
        }
    });
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;

    fn ints<const D: usize>(v: Vec<i32>, shape: [usize; D], dev: &Device) -> Tensor<D, Int> {
        Tensor::from_data(TensorData::new(v, shape), dev)
    }

    fn max_diff(a: Tensor<2>, b: Tensor<2>) -> f32 {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.into_data().iter::<f32>().collect(),
            b.into_data().iter::<f32>().collect(),
        );
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    }

    /// The native kernel against the tensor-op reference, with ragged
    /// lengths and scattered, shared and padding blocks.
    #[test]
    fn matches_the_tensor_op_reference() {
        let dev = Device::flex();
        let (b, h, d, bs, blocks, w) = (3, 4, 16, 4, 10, 3);
        let e = h * d;
        let k = Tensor::random([h, blocks * bs, d], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::random([h, blocks * bs, d], Distribution::Normal(0.0, 1.0), &dev);
        let q = Tensor::<2>::random([b, e], Distribution::Normal(0.0, 1.0), &dev);
        let paged = PagedContext {
            tables: ints(vec![7, 2, 5, 1, 9, 9, 2, 9, 9], [b, w], &dev),
            lens: ints(vec![12, 5, 1], [b], &dev),
            block_size: bs,
            max_context: w * bs,
            arrivals: None,
        };
        let got = native(&q, &k, &v, &paged, h).expect("flex path");
        let want = reference::decode_attention(q, &k, &v, &paged, h);
        let worst = max_diff(got, want);
        assert!(worst < 1e-5, "max diff {worst}");
    }

    #[test]
    fn out_of_range_blocks_take_the_reference_path_instead_of_reading_past_the_cache() {
        let dev = Device::flex();
        let (k, v) = (
            Tensor::zeros([2, 8, 8], &dev),
            Tensor::zeros([2, 8, 8], &dev),
        );
        let q = Tensor::<2>::zeros([1, 16], &dev);
        let bad = PagedContext {
            tables: ints(vec![0, 9], [1, 2], &dev),
            lens: ints(vec![8], [1], &dev),
            block_size: 4,
            max_context: 8,
            arrivals: None,
        };
        assert!(native(&q, &k, &v, &bad, 2).is_none());
        let too_long = PagedContext {
            lens: ints(vec![9], [1], &dev),
            tables: ints(vec![0, 1], [1, 2], &dev),
            ..bad
        };
        assert!(native(&q, &k, &v, &too_long, 2).is_none());
    }
}
