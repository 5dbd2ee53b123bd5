//! Attention read straight from the paged KV cache, on the CPU (Flex):
//! decode steps and prefill steps, one kernel ([`super::tiled_attention`]).
//!
//! The tensor-op path gathers each sequence's context out of the cache (a
//! copy of every live K and V row, padded to the longest) and runs Burn's
//! fused attention over it with a mask. Here each query reads K and V in
//! place through its block table and visits only the positions it sees:
//!
//! - decode ([`PagedContext`]): one query per sequence, over its length;
//! - prefill ([`SegmentContext`]): the step's tiles, each a run of up to 64
//!   queries of one segment of the flat token sequence, query `i` of row
//!   `r` over positions `0 ..= start[r] + i`.
//!
//! [`reference::decode_attention`] and [`reference::segment_attention`] are
//! the tensor-op paths: the references the tests hold this kernel to (and the
//! GPU check holds the CubeCL kernels to), and the fallback when the inputs
//! are not f32 Flex tensors or an index is out of range.

use burn::backend::flex::FlexTensor;
use burn::prelude::*;
use burn::tensor::DType;
use half::bf16;

use super::flex_slices::{dense, int_values, values};
use super::isa::CpuIsa;
use super::tiled_attention::{attend, Geometry, KvElem, Tile};
use crate::ops::attention::{PagedContext, SegmentContext};
use crate::ops::plan::PREFILL_TILE;
use crate::ops::reference;

/// Attention of one query per sequence over its paged context, on `isa`.
///
/// - `qkv`: `[B, 3E]` (its Q third is read, `E = H * D`)
/// - `k`, `v`: the layer's storage, `[H, S, D]` each
/// - `paged`: block tables `[B, W]` and visible lengths `[B]`
/// - returns `[B, E]`: the native kernel on f32 Flex tensors with valid
///   tables, [`reference::decode_attention`] otherwise
pub fn decode_attention(
    isa: CpuIsa,
    qkv: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    paged: &PagedContext,
    n_head: usize,
) -> Tensor<2> {
    native_decode(isa, qkv, k, v, paged, n_head).unwrap_or_else(|| {
        let [b, e3] = qkv.dims();
        let q = qkv.clone().slice([0..b, 0..e3 / 3]);
        reference::decode_attention(q, k, v, paged, n_head)
    })
}

/// Prefill attention over a step's segments, on `isa`.
///
/// - `qkv`: `[T, 3E]`, the step's flat tokens
/// - `k`, `v`: the layer's storage, `[H, S, D]` each, already holding the
///   step's new rows
/// - returns `[T, E]` (padding tokens 0): the native kernel on f32 Flex
///   tensors with valid indices, [`reference::segment_attention`] otherwise
pub fn segment_attention(
    isa: CpuIsa,
    qkv: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    seg: &SegmentContext,
    n_head: usize,
) -> Tensor<2> {
    native_segments(isa, qkv, k, v, seg, n_head)
        .unwrap_or_else(|| reference::segment_attention(qkv.clone(), k, v, n_head, seg))
}

/// The dense storage of the inputs every call shares (K and V f32 or
/// bf16), and their geometry (the table width left to the caller).
struct Inputs {
    qkv: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    tables: FlexTensor,
    geometry: Geometry,
}

/// `qkv`, `k`, `v` and `tables` as dense Flex storage; `None` off Flex, for
/// a `qkv` not f32, K/V neither f32 nor bf16 (or not alike), or shapes that
/// do not agree.
fn inputs(
    qkv: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    tables: &Tensor<2, Int>,
    block_size: usize,
    n_head: usize,
) -> Option<Inputs> {
    let [rows, e3] = qkv.dims();
    let [h, slots, d] = k.dims();
    let stored = matches!(k.dtype(), DType::F32 | DType::BF16) && v.dtype() == k.dtype();
    if h != n_head
        || 3 * h * d != e3
        || qkv.dtype() != DType::F32
        || v.dims() != k.dims()
        || !stored
    {
        return None;
    }
    let tables = dense(tables)?;
    (tables.dtype() == DType::I32).then_some(())?;
    Some(Inputs {
        geometry: Geometry {
            rows,
            q_stride: e3,
            heads: h,
            slots,
            head_dim: d,
            table_width: tables.layout().shape()[1],
            block_size,
        },
        qkv: dense(qkv)?,
        k: dense(k)?,
        v: dense(v)?,
        tables,
    })
}

/// [`attend`] over `inputs` with K/V stored as `E`.
fn attend_stored<E>(isa: CpuIsa, inputs: &Inputs, tiles: &[Tile]) -> Option<Vec<f32>>
where
    E: KvElem + burn::tensor::Element + bytemuck::Pod,
{
    attend(
        isa,
        values::<f32>(&inputs.qkv),
        values::<E>(&inputs.k),
        values::<E>(&inputs.v),
        values::<i32>(&inputs.tables),
        tiles,
        inputs.geometry,
    )
}

/// Runs the kernel over `tiles`; `[N, E]` on `device`.
fn run(isa: CpuIsa, inputs: &Inputs, tiles: &[Tile], device: &Device) -> Option<Tensor<2>> {
    let g = inputs.geometry;
    let out = match inputs.k.dtype() {
        DType::BF16 => attend_stored::<bf16>(isa, inputs, tiles),
        _ => attend_stored::<f32>(isa, inputs, tiles),
    }?;
    let e = g.heads * g.head_dim;
    Some(Tensor::from_data(TensorData::new(out, [g.rows, e]), device))
}

/// The native decode kernel: one one-query tile per sequence.
fn native_decode(
    isa: CpuIsa,
    qkv: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    paged: &PagedContext,
    n_head: usize,
) -> Option<Tensor<2>> {
    let inputs = inputs(qkv, k, v, &paged.tables, paged.block_size, n_head)?;
    let lens = int_values(&paged.lens)?;
    if lens.len() != inputs.geometry.rows || lens.iter().any(|&l| l < 0) {
        return None;
    }
    let tiles: Vec<Tile> = lens
        .iter()
        .enumerate()
        .map(|(b, &len)| Tile {
            table: b,
            first_row: b,
            queries: usize::from(len > 0),
            first_len: len as usize,
        })
        .collect();
    run(isa, &inputs, &tiles, &qkv.device())
}

/// The native prefill kernel over the context's tiles.
fn native_segments(
    isa: CpuIsa,
    qkv: &Tensor<2>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    seg: &SegmentContext,
    n_head: usize,
) -> Option<Tensor<2>> {
    let inputs = inputs(qkv, k, v, &seg.tables, seg.block_size, n_head)?;
    let tiles = segment_tiles(
        &int_values(&seg.cu_seqlens)?,
        &int_values(&seg.starts)?,
        &int_values(&seg.tiles)?,
    )?;
    run(isa, &inputs, &tiles, &qkv.device())
}

/// The kernel's tiles from the context's `(row, first query)` pairs: the
/// queries of each that its row has (padding tiles: none). `None` on a row
/// out of range or offsets that go backwards.
fn segment_tiles(cu: &[i32], starts: &[i32], pairs: &[i32]) -> Option<Vec<Tile>> {
    let rows = starts.len();
    if cu.len() != rows + 1 || cu.windows(2).any(|w| w[0] < 0 || w[1] < w[0]) {
        return None;
    }
    pairs
        .chunks_exact(2)
        .map(|pair| {
            let (row, q0) = (usize::try_from(pair[0]).ok()?, pair[1].max(0) as usize);
            let len = (cu.get(row + 1)? - cu[row]) as usize;
            let start = usize::try_from(starts[row]).ok()?;
            Some(Tile {
                table: row,
                first_row: cu[row] as usize + q0.min(len),
                queries: len.saturating_sub(q0).min(PREFILL_TILE),
                first_len: start + q0.min(len) + 1,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::attention::{SegmentPadding, SegmentRow, TableGeometry};
    use burn::tensor::Distribution;

    fn ints<const D: usize>(v: Vec<i32>, shape: [usize; D], dev: &Device) -> Tensor<D, Int> {
        Tensor::from_data(TensorData::new(v, shape), dev)
    }

    fn normal<const D: usize>(shape: [usize; D], dev: &Device) -> Tensor<D> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    fn max_diff(a: Tensor<2>, b: Tensor<2>) -> f32 {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.into_data().iter::<f32>().collect(),
            b.into_data().iter::<f32>().collect(),
        );
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    }

    /// The native decode kernel against the tensor-op reference, with ragged
    /// lengths and scattered, shared and padding blocks.
    #[test]
    fn decode_matches_the_tensor_op_reference() {
        let dev = Device::flex();
        let (b, h, d, bs, blocks, w) = (3, 4, 16, 4, 10, 3);
        let (k, v) = (
            normal([h, blocks * bs, d], &dev),
            normal([h, blocks * bs, d], &dev),
        );
        let qkv = normal([b, 3 * h * d], &dev);
        let paged = PagedContext {
            tables: ints(vec![7, 2, 5, 1, 9, 9, 2, 9, 9], [b, w], &dev),
            lens: ints(vec![12, 5, 1], [b], &dev),
            block_size: bs,
            max_context: w * bs,
            arrivals: None,
        };
        let q = qkv.clone().slice([0..b, 0..h * d]);
        let want = reference::decode_attention(q, &k, &v, &paged, h);
        for isa in CpuIsa::available() {
            let got = native_decode(isa, &qkv, &k, &v, &paged, h).expect("flex path");
            let worst = max_diff(got, want.clone());
            assert!(worst < 1e-5, "{isa}: max diff {worst}");
        }
    }

    #[test]
    fn out_of_range_blocks_take_the_reference_path_instead_of_reading_past_the_cache() {
        let dev = Device::flex();
        let (k, v) = (
            Tensor::zeros([2, 8, 8], &dev),
            Tensor::zeros([2, 8, 8], &dev),
        );
        let qkv = Tensor::<2>::zeros([1, 48], &dev);
        let bad = PagedContext {
            tables: ints(vec![0, 9], [1, 2], &dev),
            lens: ints(vec![8], [1], &dev),
            block_size: 4,
            max_context: 8,
            arrivals: None,
        };
        assert!(native_decode(CpuIsa::detect(), &qkv, &k, &v, &bad, 2).is_none());
        let too_long = PagedContext {
            lens: ints(vec![9], [1], &dev),
            tables: ints(vec![0, 1], [1, 2], &dev),
            ..bad
        };
        assert!(native_decode(CpuIsa::detect(), &qkv, &k, &v, &too_long, 2).is_none());
        let mut seg = segments(&[(5, 0)], 1, 2, &dev);
        seg.tables = ints(vec![0, 9], [1, 2], &dev);
        let qkv = Tensor::<2>::zeros([5, 48], &dev);
        assert!(native_segments(CpuIsa::detect(), &qkv, &k, &v, &seg, 2).is_none());
    }

    /// Rows `(queries, start)` over scattered tables of `w` blocks of 4
    /// (block `(7 * i + 3) % 40` at table entry `i`), padded to `rows` rows
    /// and, when `rows` exceeds the real ones, to 3 more tiles.
    fn segments(spec: &[(usize, usize)], rows: usize, w: usize, dev: &Device) -> SegmentContext {
        let tables: Vec<Vec<u32>> = (0..spec.len())
            .map(|r| {
                (0..w)
                    .map(|j| ((7 * (r * w + j) + 3) % 40) as u32)
                    .collect()
            })
            .collect();
        let rows_in: Vec<SegmentRow<'_>> = spec
            .iter()
            .zip(&tables)
            .map(|(&(queries, start), table)| SegmentRow {
                queries,
                start,
                table,
            })
            .collect();
        let lens: Vec<usize> = spec.iter().map(|s| s.0).collect();
        let real_tiles = crate::ops::plan::prefill_tiles(&lens).len();
        let padding = SegmentPadding {
            rows,
            tiles: (rows > spec.len()).then_some(real_tiles + 3),
        };
        let geometry = TableGeometry {
            block_size: 4,
            width: w,
            padding_block: 40,
        };
        SegmentContext::new(&rows_in, padding, geometry, dev)
    }

    /// The native prefill kernel against the tensor-op reference: fresh rows
    /// of ragged lengths (one past a tile), a chunk after cached positions, a
    /// prefix-cache hit, one-token rows; then the same padded as on CUDA
    /// (empty rows, padding tiles and padding tokens, which get zeros).
    #[test]
    fn segments_match_the_tensor_op_reference() {
        let dev = Device::flex();
        let (h, d, slots) = (3, 16, 41 * 4);
        let (k, v) = (normal([h, slots, d], &dev), normal([h, slots, d], &dev));
        let spec = [(1, 0), (17, 0), (65, 0), (30, 37), (5, 48), (1, 90)];
        let tokens: usize = spec.iter().map(|s| s.0).sum();
        for (rows, padded_tokens) in [(spec.len(), tokens), (8, tokens + 11)] {
            let seg = segments(&spec, rows, 24, &dev);
            let qkv = normal([padded_tokens, 3 * h * d], &dev);
            let want = reference::segment_attention(qkv.clone(), &k, &v, h, &seg);
            for isa in CpuIsa::available() {
                let got = native_segments(isa, &qkv, &k, &v, &seg, h).expect("flex path");
                let pad: Vec<f32> = got
                    .clone()
                    .slice([tokens..padded_tokens, 0..h * d])
                    .into_data()
                    .iter::<f32>()
                    .collect();
                assert!(pad.iter().all(|&x| x == 0.0), "padding tokens get zeros");
                let worst = max_diff(got, want.clone());
                assert!(worst < 1e-5, "{isa}, {rows} rows: max diff {worst}");
            }
        }
    }

    /// A one-query segment is a decode query: the same numbers either way.
    #[test]
    fn a_one_query_segment_is_a_decode_step() {
        let dev = Device::flex();
        let (h, d) = (2, 8);
        let (k, v) = (normal([h, 41 * 4, d], &dev), normal([h, 41 * 4, d], &dev));
        let seg = segments(&[(1, 9)], 1, 3, &dev);
        let paged = PagedContext {
            tables: seg.tables.clone(),
            lens: ints(vec![10], [1], &dev),
            block_size: 4,
            max_context: 12,
            arrivals: None,
        };
        let qkv = normal([1, 3 * h * d], &dev);
        let a = segment_attention(CpuIsa::detect(), &qkv, &k, &v, &seg, h);
        let b = decode_attention(CpuIsa::detect(), &qkv, &k, &v, &paged, h);
        assert_eq!(max_diff(a, b), 0.0);
    }
}
