//! CubeCL kernels of the CUDA decode path, registered as a Burn backend
//! extension ([`PagedKvOps`]) for CubeCL and fusion (CUDA builds only). This
//! file holds the extension and its launches; each kernel has its own file:
//!
//! - [`kv_write`] (`cache_write.rs`): copies each new token's K and V row
//!   (16-byte vectors) from the fused `qkv` projection into its cache slot (`[H, S, D]`
//!   storage). It writes the cache buffer in place whoever else holds it, and
//!   hands the same buffers back: a captured CUDA graph keeps writing the
//!   memory the engine reads, and nothing ever copies the cache (Burn's
//!   `select_assign` copies a storage that is shared, as it is once a graph
//!   holds it).
//! - [`paged_decode_attention`] (`attention.rs`): cubes per (head,
//!   sequence) walk the block table up to the context length (both read
//!   from device buffers, so a graph replays any lengths) with 16-byte loads
//!   of K and V rows. No gather of the context, no mask, no padding to a
//!   context bucket. A small batch splits each context across several cubes
//!   (flash-decoding); the last cube of a pair combines the chunks in the
//!   same launch.
//! - [`decode_linear`] (`gemv.rs`): the decode GEMV with the bias, GELU and
//!   residual add in its epilogue, over out-major weights.
//! - [`layer_norm_rows`] (`layer_norm.rs`): one warp per row.
//!
//! `qkv` is read as it is, so no slice, permute or copy of Q, K or V is
//! launched. The CPU twin of the attention kernel is
//! [`super::paged_attention`]; the tensor-op path in [`super::attention`] is
//! the reference both are checked against (`ember-engine-bench
//! --check-kernels` on the GPU, unit tests on the CPU).

mod attention;
mod cache_write;
mod gemv;
mod layer_norm;
mod mma;
mod prefill_attention;

use attention::paged_decode_attention_kernel;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{backend_extension, Backend, Dispatch, TensorMetadata};
use burn::prelude::*;
use burn::tensor::DType;

use super::kv_cache::{LayerKv, PagedContext};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cache_write::kv_write_kernel;
use cubecl::prelude::{CubeCount, CubeDim};
use gemv::decode_linear_kernel;
use layer_norm::layer_norm_kernel;
use mma::decode_mma_kernel;

/// Warps per attention cube for a batch of `pairs` (head, sequence) pairs:
/// with fewer cubes than an H100 has SMs (132), or than twice that, more
/// warps split each context finer.
fn attention_warps(pairs: usize) -> u32 {
    match pairs {
        0..132 => 16,
        132..264 => 8,
        _ => 4,
    }
}

/// Warps per attention cube when a context is split across cubes.
const SPLIT_ATTENTION_WARPS: u32 = 8;

/// Cubes per (head, sequence) pair for a batch of `pairs` pairs: enough
/// that the launch has about two cubes per SM of an H100 (132), at most 16;
/// one when the pairs alone fill the GPU. `EMBER_ATTENTION_SPLITS` fixes it
/// (1 turns splitting off).
fn attention_splits(pairs: usize) -> usize {
    static FIXED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let fixed = *FIXED.get_or_init(|| env_rows("EMBER_ATTENTION_SPLITS", 0));
    if fixed > 0 {
        return fixed.min(64);
    }
    match pairs {
        0 => 1,
        p if p >= 132 => 1,
        p => 264usize.div_ceil(p).min(16),
    }
}

/// The paged-cache operations as a Burn backend extension (CubeCL, fused or not).
#[backend_extension(Cube, Fusion)]
pub trait PagedKvOps: Backend {
    /// Writes rows of `qkv` (`[N, 3E]`: its K and V thirds) at `slots`
    /// (`[N]`) of `k_cache`/`v_cache` (`[H, S, D]`) in place; returns the caches.
    #[fusion(meta = |k_cache, v_cache, _qkv, _slots| (k_cache.clone(), v_cache.clone()))]
    fn kv_write(
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        qkv: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// One query per sequence (the Q third of `qkv`, `[B, 3E]`) over its paged
    /// context: `tables` `[B, W]` blocks, `lens` `[B]` positions. Returns `[B, E]`.
    /// When `can_split`, `arrivals` holds at least `B * H` zeroed 32-bit
    /// counters and a context may be split across cubes (left at zero
    /// afterwards); otherwise it is not read.
    #[fusion(dtype = qkv, shape = { let [b, e3] = qkv.dims::<2>(); Shape::new([b, e3 / 3]) })]
    #[allow(clippy::too_many_arguments)]
    fn paged_decode_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        lens: IntTensor<Self>,
        arrivals: IntTensor<Self>,
        can_split: bool,
        block_size: usize,
        max_context: usize,
    ) -> FloatTensor<Self>;

    /// `x` `[B, K]` times the out-major weight `w` `[N, K]` transposed, plus
    /// `bias` `[N]` when `has_bias`, through tanh-GELU when `gelu`, plus
    /// `residual` `[B, N]` when `has_residual` (unread operands may be any
    /// tensor). Returns `[B, N]`.
    #[fusion(dtype = x, shape = { let [b, _] = x.dims::<2>(); let [n, _] = w.dims::<2>(); Shape::new([b, n]) })]
    fn decode_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
    ) -> FloatTensor<Self>;

    /// Causal attention of a right-padded prefill batch straight from `qkv`
    /// (`[B*Q, 3E]`, `seq_len` = Q rows per sequence, head_dim 64). Returns
    /// `[B*Q, E]`.
    #[fusion(dtype = qkv, shape = { let [n, e3] = qkv.dims::<2>(); Shape::new([n, e3 / 3]) })]
    fn prefill_attention(qkv: FloatTensor<Self>, seq_len: usize) -> FloatTensor<Self>;

    /// LayerNorm over the rows of `x` `[R, E]` with `gamma`, `beta` `[E]`.
    #[fusion(dtype = x, shape = x)]
    fn layer_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self>;
}

impl PagedKvOps for CubeBackend {
    fn kv_write(
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        qkv: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let qkv = into_contiguous(qkv);
        let slots = into_contiguous(slots);
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

    fn paged_decode_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        lens: IntTensor<Self>,
        arrivals: IntTensor<Self>,
        can_split: bool,
        block_size: usize,
        max_context: usize,
    ) -> FloatTensor<Self> {
        let qkv = into_contiguous(qkv);
        let tables = into_contiguous(tables);
        let lens = into_contiguous(lens);
        let [b, e3] = qkv.shape().dims::<2>();
        let [h, _, d] = k_cache.shape().dims::<3>();
        let out = empty_like(&qkv, [b, e3 / 3]);
        let (f, i) = (qkv.dtype, tables.dtype);
        // Splitting hands partials between cubes, which needs device-scope
        // fences (`sync_storage`) the runtime promises.
        let counters_fit = arrivals.dtype.size() == 4
            && arrivals.is_contiguous()
            && arrivals.shape().num_elements() >= b * h
            && qkv.client.features().device_memory_scope;
        let splits = match can_split && counters_fit {
            true => attention_splits(b * h),
            false => 1,
        };
        let warps = match splits {
            1 => attention_warps(b * h),
            _ => SPLIT_ATTENTION_WARPS,
        };
        let partials = empty_device_contiguous_dtype(
            qkv.client.clone(),
            qkv.device.clone(),
            Shape::new([if splits > 1 {
                b * h * splits * (d + 2)
            } else {
                1
            }]),
            DType::F32,
        );
        let cache_strides = k_cache.meta.strides();
        assert!(
            cache_strides[2] == 1 && v_cache.meta.strides() == cache_strides,
            "paged attention: the K/V caches must be row-major [H, S, D] storage"
        );
        let vs = vector_size(&qkv, &[d, e3, cache_strides[0], cache_strides[1]]);
        let (lanes_per_pos, vectors_per_lane) = attention_lanes(d / vs);
        paged_decode_attention_kernel::launch(
            &qkv.client,
            CubeCount::Static(h as u32, b as u32, splits as u32),
            CubeDim::new_2d(32, warps),
            vs,
            qkv.clone().into_tensor_arg(),
            k_cache.into_tensor_arg(),
            v_cache.into_tensor_arg(),
            tables.into_tensor_arg(),
            lens.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            partials.into_tensor_arg(),
            arrivals.into_tensor_arg(),
            1.0 / (d as f32).sqrt(),
            block_size,
            d,
            max_context,
            warps as usize,
            lanes_per_pos,
            vectors_per_lane,
            vs,
            vectors_per_lane * vs,
            splits,
            [dtype_to_storage_type(f), dtype_to_storage_type(i)],
        );
        out
    }

    fn decode_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
    ) -> FloatTensor<Self> {
        let x = into_contiguous(x);
        let w = into_contiguous(w);
        let residual = into_contiguous(residual);
        let [b, _] = x.shape().dims::<2>();
        let [n, k] = w.shape().dims::<2>();
        if let Some((m_tiles, warps)) = mma_row_tiles(b, n, k) {
            let out = empty_like(&x, [b, n]);
            let dtype = x.dtype;
            decode_mma_kernel::launch(
                &x.client,
                CubeCount::Static((n / 16) as u32, (b / (16 * m_tiles)) as u32, 1),
                CubeDim::new_2d(32, warps as u32),
                x.clone().into_tensor_arg(),
                w.into_tensor_arg(),
                bias.into_tensor_arg(),
                residual.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                k,
                m_tiles,
                warps,
                has_bias,
                gelu,
                has_residual,
                dtype_to_storage_type(dtype),
            );
            return out;
        }
        let rows = gemv_rows(b);
        let out = empty_like(&x, [b, n]);
        let dtype = x.dtype;
        let vs = vector_size(&x, &[k]);
        let splits = gemv_splits(n, k / vs);
        let per_cube = GEMV_WARPS / splits as u32;
        decode_linear_kernel::launch(
            &x.client,
            CubeCount::Static((n as u32).div_ceil(per_cube), (b / rows) as u32, 1),
            CubeDim::new_2d(32, GEMV_WARPS),
            vs,
            x.clone().into_tensor_arg(),
            w.into_tensor_arg(),
            bias.into_tensor_arg(),
            residual.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            vs,
            k / vs,
            rows,
            splits,
            has_bias,
            gelu,
            has_residual,
            dtype_to_storage_type(dtype),
        );
        out
    }

    fn prefill_attention(qkv: FloatTensor<Self>, seq_len: usize) -> FloatTensor<Self> {
        prefill_attention::launch(into_contiguous(qkv), seq_len)
    }

    fn layer_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        let x = into_contiguous(x);
        let gamma = into_contiguous(gamma);
        let beta = into_contiguous(beta);
        let [r, e] = x.shape().dims::<2>();
        let out = empty_like(&x, [r, e]);
        let dtype = x.dtype;
        let vs = vector_size(&x, &[e]);
        let row_vectors = e / vs;
        layer_norm_kernel::launch(
            &x.client,
            CubeCount::Static((r as u32).div_ceil(GEMV_WARPS), 1, 1),
            CubeDim::new_2d(32, GEMV_WARPS),
            vs,
            x.clone().into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            eps,
            vs,
            row_vectors,
            row_vectors.div_ceil(32),
            dtype_to_storage_type(dtype),
        );
        out
    }
}

/// A new contiguous tensor of `shape` on `like`'s device, in its dtype (a
/// kernel's output).
fn empty_like<const D: usize>(like: &CubeTensor, shape: [usize; D]) -> CubeTensor {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new(shape),
        like.dtype,
    )
}

/// The widest vector (at most 16 bytes) of `tensor`'s element type that the
/// client can load and that divides every one of `extents` (row lengths and
/// strides, in elements).
fn vector_size(tensor: &CubeTensor, extents: &[usize]) -> usize {
    let elem = tensor.dtype.size();
    tensor
        .client
        .io_optimized_vector_sizes(elem)
        .filter(|&v| v * elem <= 16 && extents.iter().all(|x| x % v == 0))
        .max()
        .unwrap_or(1)
}

/// How the attention kernel splits a row of `chunks` vectors: lanes per
/// position (the largest power of two up to 32 dividing `chunks`) and
/// vectors per lane.
fn attention_lanes(chunks: usize) -> (usize, usize) {
    let mut lanes = 32;
    while !chunks.is_multiple_of(lanes) {
        lanes /= 2;
    }
    (lanes, chunks / lanes)
}

/// Warps per cube of the decode GEMV and the LayerNorm kernel.
const GEMV_WARPS: u32 = gemv::GEMV_WARPS_USIZE as u32;

/// The launch shape of the tensor-core kernel for `[rows, k] x [n, k]^T`:
/// 16-row tiles per cube (4, 2 or 1: the most that divide the rows' tiles,
/// capped by `EMBER_MMA_ROW_TILES` and by the shared memory the warps'
/// partials take) and warps per cube (the `K` slices: 16 up to 64 rows, 8
/// above, or `EMBER_MMA_WARPS` (8, 16 or 32) where `k` allows). `None` when the GEMV is used:
/// fewer than `EMBER_MMA_MIN_ROWS` rows (default 16), rows or `n` not a
/// multiple of 16 (the 50257-wide LM head), or `k` not a multiple of 128
/// (8 warps splitting it in 16-wide steps).
fn mma_row_tiles(rows: usize, n: usize, k: usize) -> Option<(usize, usize)> {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let min = *MIN.get_or_init(|| env_rows("EMBER_MMA_MIN_ROWS", 16));
    if rows < min.max(16)
        || !rows.is_multiple_of(16)
        || !n.is_multiple_of(16)
        || !k.is_multiple_of(16 * mma::MMA_WARPS)
    {
        return None;
    }
    static WARPS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let fixed = *WARPS.get_or_init(|| env_rows("EMBER_MMA_WARPS", 0));
    // Up to 64 rows the cube count is small and each warp's K loop is the
    // latency: 16 warps measured 1.47 ms at batch 64 against 1.57-1.60 with 8
    // (and no better at 256).
    let wanted = match fixed {
        0 if rows <= 64 => 16,
        0 => mma::MMA_WARPS,
        w => w,
    };
    let warps = match wanted {
        16 | 32 if k.is_multiple_of(16 * wanted) => wanted,
        _ => mma::MMA_WARPS,
    };
    static MAX_TILES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let max_tiles = *MAX_TILES.get_or_init(|| env_rows("EMBER_MMA_ROW_TILES", 4));
    // 1 KiB of f32 partials per warp and row tile: at most 32 KiB.
    let max_tiles = max_tiles.clamp(1, 32 / warps);
    [4, 2, 1]
        .into_iter()
        .find(|&t| t <= max_tiles && (rows / 16).is_multiple_of(t))
        .map(|t| (t, warps))
}

/// Warps per output feature of the decode GEMV: with fewer outputs than
/// 2048 the `K` loop is split over up to 4 warps, as long as every lane
/// still gets a vector to load; otherwise one warp.
fn gemv_splits(n_out: usize, k_vectors: usize) -> usize {
    if n_out >= 2048 {
        return 1;
    }
    let mut splits = 4;
    while splits > 1 && k_vectors < 32 * splits {
        splits /= 2;
    }
    splits
}

/// Rows per cube of the decode GEMV: the largest power of two up to 16 that
/// divides `batch` (so no cube runs past the batch).
fn gemv_rows(batch: usize) -> usize {
    let mut rows = 16;
    while !batch.is_multiple_of(rows) {
        rows /= 2;
    }
    rows
}

/// Writes the K/V thirds of `qkv` (`[N, 3E]`) at `slots` (`[N]`) of the
/// layer's `[H, S, D]` storage, in place; returns the same storage.
pub fn kv_write(
    k_cache: Tensor<3>,
    v_cache: Tensor<3>,
    qkv: Tensor<2>,
    slots: Tensor<1, Int>,
) -> (Tensor<3>, Tensor<3>) {
    let (k, v) = Dispatch::kv_write(
        k_cache.into_dispatch(),
        v_cache.into_dispatch(),
        qkv.into_dispatch(),
        slots.into_dispatch(),
    );
    (Tensor::from_dispatch(k), Tensor::from_dispatch(v))
}

/// Decode attention over the paged cache (see the module doc): `qkv`
/// `[B, 3E]` against the layer's `cache`, through `paged`'s block tables
/// and lengths; returns `[B, E]`.
pub fn paged_decode_attention(qkv: Tensor<2>, cache: &LayerKv, paged: &PagedContext) -> Tensor<2> {
    let (arrivals, can_split) = match &paged.arrivals {
        Some(counters) => (counters.clone(), true),
        None => (paged.lens.clone(), false),
    };
    Tensor::from_dispatch(Dispatch::paged_decode_attention(
        qkv.into_dispatch(),
        cache.k.clone().into_dispatch(),
        cache.v.clone().into_dispatch(),
        paged.tables.clone().into_dispatch(),
        paged.lens.clone().into_dispatch(),
        arrivals.into_dispatch(),
        can_split,
        paged.block_size,
        paged.max_context,
    ))
}

/// What the decode GEMV does to its result before writing it.
#[derive(Debug, Clone, Default)]
pub struct GemvEpilogue {
    /// Apply tanh-GELU (after the bias).
    pub gelu: bool,
    /// `[B, N]` added last (a residual connection).
    pub residual: Option<Tensor<2>>,
}

/// `x` `[B, K]` times `w` `[N, K]` (out-major) transposed, plus `bias`, then
/// the epilogue: the decode GEMV kernel. Returns `[B, N]`.
pub fn decode_linear(
    x: Tensor<2>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    epilogue: GemvEpilogue,
) -> Tensor<2> {
    let (bias, has_bias) = match bias {
        Some(b) => (b.clone().into_dispatch(), true),
        None => (w.clone().into_dispatch(), false),
    };
    let (residual, has_residual) = match epilogue.residual {
        Some(r) => (r.into_dispatch(), true),
        None => (w.clone().into_dispatch(), false),
    };
    Tensor::from_dispatch(Dispatch::decode_linear(
        x.into_dispatch(),
        w.clone().into_dispatch(),
        bias,
        residual,
        has_bias,
        epilogue.gelu,
        has_residual,
    ))
}

/// Causal attention of a right-padded prefill batch, `qkv` `[B*Q, 3E]` with
/// `seq_len` = Q; returns `[B*Q, E]`. Only for shapes [`prefill_attention_fits`].
pub fn prefill_attention(qkv: Tensor<2>, seq_len: usize) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::prefill_attention(qkv.into_dispatch(), seq_len))
}

/// Whether the prefill attention kernel takes this batch: on CUDA, head_dim
/// 64, whole 16-row tiles per sequence, and not turned off with
/// `EMBER_PREFILL_ATTENTION=0`.
pub fn prefill_attention_fits(qkv: &Tensor<2>, seq_len: usize, head_dim: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on =
        *ON.get_or_init(|| std::env::var("EMBER_PREFILL_ATTENTION").map_or(true, |v| v != "0"));
    on && head_dim == 64 && seq_len.is_multiple_of(16) && on_cube(qkv)
}

/// LayerNorm over the last dimension of `x` `[R, E]` (one kernel).
pub fn layer_norm_rows(x: Tensor<2>, gamma: Tensor<1>, beta: Tensor<1>, eps: f32) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::layer_norm_rows(
        x.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        eps,
    ))
}

/// Most rows a linear layer sends through [`decode_linear`] instead of the
/// general matmul: `EMBER_GEMV_MAX_ROWS` (default 64: on an H100 the GEMV
/// beat CubeCL's matmul at batch 1 and 8 and tied it at 64, and lost 2x at
/// 256; see docs/performance.md), read once.
pub fn gemv_max_rows() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| env_rows("EMBER_GEMV_MAX_ROWS", 256))
}

/// The same for the LM head (`[vocab, E]`, 77 MB in f16), where the GEMV's
/// per-row-tile cost is largest: `EMBER_LM_HEAD_GEMV_MAX_ROWS`, default 8,
/// and never more than [`gemv_max_rows`].
pub fn lm_head_gemv_max_rows() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| env_rows("EMBER_LM_HEAD_GEMV_MAX_ROWS", 8).min(gemv_max_rows()))
}

/// A row count from the environment variable `name`, or `default`.
fn env_rows(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether `device` is a CubeCL (CUDA) device.
pub fn is_cube_device(device: &Device) -> bool {
    matches!(device.as_dispatch(), burn::backend::DispatchDevice::Cube(_))
}

/// Whether `tensor` lives on a CubeCL (CUDA) device, where these kernels run.
pub fn on_cube<const D: usize>(tensor: &Tensor<D>) -> bool {
    tensor
        .clone()
        .try_into_primitive::<burn::backend::Cube>()
        .is_ok()
}
