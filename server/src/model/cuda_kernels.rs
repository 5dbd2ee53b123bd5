//! CubeCL kernels of the CUDA decode path: the KV-cache write and paged
//! decode attention, registered as a Burn backend extension for CubeCL and
//! fusion (CUDA builds only).
//!
//! Both read the fused Q/K/V projection `qkv` (`[N, 3E]`, rows of new tokens)
//! as it is, so no slice, permute or copy of Q, K or V is launched:
//!
//! - [`kv_write`]: one thread per element copies each new token's K and V row
//!   into its cache slot (`[H, S, D]` storage). It writes the cache buffer in
//!   place whoever else holds it, and hands the same buffers back: a captured
//!   CUDA graph keeps writing the memory the engine reads, and nothing ever
//!   copies the cache (Burn's `select_assign` copies a storage that is shared,
//!   as it is once a graph holds it).
//! - [`paged_decode_attention`]: one cube per (head, sequence), of four warps
//!   that split the sequence's positions when the batch is small, one warp
//!   when it is large. It walks the
//!   block table up to the context length (both read from device buffers, so
//!   a graph replays any lengths), keeps the query and the scores in shared
//!   memory, takes the max and the sum with plane reductions combined across
//!   the warps, and writes `softmax(q.k / sqrt(D)) . V` for its head. No
//!   gather of the context, no mask, no padding to a context bucket.
//!
//! The CPU twin of the attention kernel is [`super::paged_attention`]; the
//! tensor-op path in [`super::attention`] is the reference both are checked
//! against (`bench/gpu_engine_check.sh` on the GPU, unit tests on the CPU).
//! Not yet done: splitting one long context across several cubes.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{backend_extension, Backend, Dispatch, TensorMetadata};
use burn::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::CubeBackend;
use cubecl::prelude::{CubeCount, CubeDim};
use kernels::{
    decode_linear_kernel, kv_write_kernel, layer_norm_kernel, paged_decode_attention_kernel,
};

/// Warps per attention cube (they split one sequence's positions for one
/// head) when the batch has few (head, sequence) pairs; with many, one warp
/// per pair keeps the cross-warp reductions out (measured on an H100: four
/// warps 1.36 vs 1.78 ms per step at batch 1, 4.6 vs 3.9 ms at batch 64).
const ATTENTION_WARPS_FEW: u32 = 4;

/// Below this many (head, sequence) pairs a cube gets [`ATTENTION_WARPS_FEW`]
/// warps (four cubes per SM of an H100's 132).
const FEW_PAIRS: usize = 528;

/// The kernels themselves (CubeCL's prelude shadows Burn's `Tensor` and `Float`).
mod kernels {
    use cubecl::prelude::*;

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

    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn paged_decode_attention_kernel<F: Float, I: Numeric>(
        qkv: &Tensor<F>,
        k_cache: &Tensor<F>,
        v_cache: &Tensor<F>,
        tables: &Tensor<I>,
        lens: &Tensor<I>,
        out: &mut Tensor<F>,
        scale: f32,
        #[comptime] block_size: usize,
        #[comptime] head_dim: usize,
        #[comptime] max_context: usize,
        #[comptime] warps: usize,
        #[define(F, I)] _dtypes: [ElemType; 2],
    ) {
        let h = CUBE_POS_X as usize;
        let b = CUBE_POS_Y as usize;
        let lane = UNIT_POS_X as usize;
        let warp = UNIT_POS_Y as usize;
        let tid = warp * 32 + lane;
        let threads = warps * 32;
        let e = k_cache.shape(0) * head_dim;
        let mut len = u32::cast_from(lens[b * lens.stride(0)]) as usize;
        if len > max_context {
            len = max_context;
        }
        let mut q = Shared::<[f32]>::new_slice(head_dim);
        let mut p = Shared::<[f32]>::new_slice(max_context);
        // One value per warp (the max, then the sum), then per-warp V partials.
        let mut per_warp = Shared::<[f32]>::new_slice(warps);
        let mut partial = Shared::<[f32]>::new_slice(warps * head_dim);

        let q_row = b * qkv.stride(0) + h * head_dim * qkv.stride(1);
        let mut d = tid;
        while d < head_dim {
            q[d] = f32::cast_from(qkv[q_row + d * qkv.stride(1)]);
            d += threads;
        }
        sync_cube();

        // Scores of this thread's positions, and the max over the cube.
        let table_row = b * tables.stride(0);
        let k_head = h * k_cache.stride(0);
        let mut m = f32::new(-1.0e30);
        let mut t = tid;
        while t < len {
            let block = u32::cast_from(tables[table_row + (t / block_size) * tables.stride(1)]);
            let slot = block as usize * block_size + t % block_size;
            let base = k_head + slot * k_cache.stride(1);
            let mut s = f32::new(0.0);
            #[unroll]
            for i in 0..head_dim {
                s += q[i] * f32::cast_from(k_cache[base + i * k_cache.stride(2)]);
            }
            s *= scale;
            p[t] = s;
            if s > m {
                m = s;
            }
            t += threads;
        }
        let warp_max = plane_max(m);
        if lane == 0 {
            per_warp[warp] = warp_max;
        }
        sync_cube();
        let mut m = per_warp[0];
        #[unroll]
        for w in 1..warps {
            let other = per_warp[w];
            if other > m {
                m = other;
            }
        }
        sync_cube();

        let mut sum = f32::new(0.0);
        t = tid;
        while t < len {
            let e_t = (p[t] - m).exp();
            p[t] = e_t;
            sum += e_t;
            t += threads;
        }
        let warp_sum = plane_sum(sum);
        if lane == 0 {
            per_warp[warp] = warp_sum;
        }
        sync_cube();
        let mut total = f32::new(0.0);
        #[unroll]
        for w in 0..warps {
            total += per_warp[w];
        }

        // Each thread sums its own positions' weighted V rows over every dim
        // (the row's loads are independent: all in flight at once); a plane
        // sum per dim gives each warp's partial, and the cube adds those.
        let v_head = h * v_cache.stride(0);
        let mut acc = Array::<f32>::new(head_dim);
        #[unroll]
        for i in 0..head_dim {
            acc[i] = f32::new(0.0);
        }
        t = tid;
        while t < len {
            let block = u32::cast_from(tables[table_row + (t / block_size) * tables.stride(1)]);
            let slot = block as usize * block_size + t % block_size;
            let base = v_head + slot * v_cache.stride(1);
            let weight = p[t];
            #[unroll]
            for i in 0..head_dim {
                acc[i] += weight * f32::cast_from(v_cache[base + i * v_cache.stride(2)]);
            }
            t += threads;
        }
        #[unroll]
        for i in 0..head_dim {
            let warp_part = plane_sum(acc[i]);
            if lane == i % 32 {
                partial[warp * head_dim + i] = warp_part;
            }
        }
        sync_cube();
        d = tid;
        while d < head_dim {
            let mut v = f32::new(0.0);
            #[unroll]
            for w in 0..warps {
                v += partial[w * head_dim + d];
            }
            out[b * e + h * head_dim + d] = F::cast_from(v / total);
            d += threads;
        }
    }

    /// `out[b, n] = x[b, :] . w[n, :] (+ bias[n])` for a few rows `b`: one
    /// warp per output feature `n` (lanes stride over `K`, a plane sum at the
    /// end), `rows` rows per cube (`CUBE_POS_Y` picks the tile), f32 sums.
    /// Epilogues: tanh-GELU of the result (`gelu`), then `+ residual[b, n]`.
    #[cube(launch)]
    #[allow(clippy::too_many_arguments)]
    pub fn decode_linear_kernel<F: Float>(
        x: &Tensor<F>,
        w: &Tensor<F>,
        bias: &Tensor<F>,
        residual: &Tensor<F>,
        out: &mut Tensor<F>,
        #[comptime] rows: usize,
        #[comptime] has_bias: bool,
        #[comptime] gelu: bool,
        #[comptime] has_residual: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        let lane = UNIT_POS_X as usize;
        let n = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
        let b0 = CUBE_POS_Y as usize * rows;
        let k_len = w.shape(1);
        let n_out = w.shape(0);
        if n < n_out {
            let w_row = n * w.stride(0);
            let mut acc = Array::<f32>::new(rows);
            #[unroll]
            for r in 0..rows {
                acc[r] = f32::new(0.0);
            }
            // `w` and `x` are contiguous. Four weight loads per trip, issued
            // before the sums that need them.
            let mut k = lane;
            while k + 96 < k_len {
                let w0 = f32::cast_from(w[w_row + k]);
                let w1 = f32::cast_from(w[w_row + k + 32]);
                let w2 = f32::cast_from(w[w_row + k + 64]);
                let w3 = f32::cast_from(w[w_row + k + 96]);
                #[unroll]
                for r in 0..rows {
                    let xr = (b0 + r) * x.stride(0) + k;
                    acc[r] += w0 * f32::cast_from(x[xr])
                        + w1 * f32::cast_from(x[xr + 32])
                        + w2 * f32::cast_from(x[xr + 64])
                        + w3 * f32::cast_from(x[xr + 96]);
                }
                k += 128;
            }
            while k < k_len {
                let wk = f32::cast_from(w[w_row + k]);
                #[unroll]
                for r in 0..rows {
                    acc[r] += wk * f32::cast_from(x[(b0 + r) * x.stride(0) + k]);
                }
                k += 32;
            }
            #[unroll]
            for r in 0..rows {
                let total = plane_sum(acc[r]);
                if lane == 0 {
                    let mut v = total;
                    if has_bias {
                        v += f32::cast_from(bias[n * bias.stride(0)]);
                    }
                    if gelu {
                        let inner = f32::new(0.797_884_6) * (v + f32::new(0.044715) * v * v * v);
                        v = f32::new(0.5) * v * (f32::new(1.0) + inner.tanh());
                    }
                    if has_residual {
                        v += f32::cast_from(
                            residual[(b0 + r) * residual.stride(0) + n * residual.stride(1)],
                        );
                    }
                    let at = (b0 + r) * n_out + n; // `out` is contiguous `[B, N]`
                    out[at] = F::cast_from(v);
                }
            }
        }
    }

    /// LayerNorm of each row of `x` `[R, E]`: one warp per row, mean and
    /// variance in f32 with plane sums (two passes over the row), then the
    /// normalized value cast to `F`, scaled and shifted in `F`.
    #[cube(launch)]
    pub fn layer_norm_kernel<F: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        out: &mut Tensor<F>,
        eps: f32,
        #[define(F)] _dtype: ElemType,
    ) {
        let lane = UNIT_POS_X as usize;
        let row = (CUBE_POS_X * CUBE_DIM_Y + UNIT_POS_Y) as usize;
        let e = x.shape(1);
        if row < x.shape(0) {
            let base = row * x.stride(0);
            let step = x.stride(1);
            let mut sum = f32::new(0.0);
            let mut i = lane;
            while i < e {
                sum += f32::cast_from(x[base + i * step]);
                i += 32;
            }
            let mean = plane_sum(sum) / f32::cast_from(e);
            let mut squares = f32::new(0.0);
            i = lane;
            while i < e {
                let c = f32::cast_from(x[base + i * step]) - mean;
                squares += c * c;
                i += 32;
            }
            let inv = f32::new(1.0) / (plane_sum(squares) / f32::cast_from(e) + eps).sqrt();
            i = lane;
            while i < e {
                let normed = F::cast_from((f32::cast_from(x[base + i * step]) - mean) * inv);
                out[row * e + i] = normed * gamma[i] + beta[i];
                i += 32;
            }
        }
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
    #[fusion(dtype = qkv, shape = { let [b, e3] = qkv.dims::<2>(); Shape::new([b, e3 / 3]) })]
    fn paged_decode_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        lens: IntTensor<Self>,
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
        let n = slots.shape().dims::<1>()[0] * h * d;
        let threads = 256u32;
        let (f, i) = (qkv.dtype, slots.dtype);
        kv_write_kernel::launch(
            &qkv.client,
            CubeCount::Static((n as u32).div_ceil(threads), 1, 1),
            CubeDim::new_1d(threads),
            qkv.clone().into_tensor_arg(),
            slots.into_tensor_arg(),
            k_cache.clone().into_tensor_arg(),
            v_cache.clone().into_tensor_arg(),
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
        block_size: usize,
        max_context: usize,
    ) -> FloatTensor<Self> {
        let qkv = into_contiguous(qkv);
        let tables = into_contiguous(tables);
        let lens = into_contiguous(lens);
        let [b, e3] = qkv.shape().dims::<2>();
        let [h, _, d] = k_cache.shape().dims::<3>();
        let out = empty_device_contiguous_dtype(
            qkv.client.clone(),
            qkv.device.clone(),
            Shape::new([b, e3 / 3]),
            qkv.dtype,
        );
        let (f, i) = (qkv.dtype, tables.dtype);
        let warps = if b * h < FEW_PAIRS {
            ATTENTION_WARPS_FEW
        } else {
            1
        };
        paged_decode_attention_kernel::launch(
            &qkv.client,
            CubeCount::Static(h as u32, b as u32, 1),
            CubeDim::new_2d(32, warps),
            qkv.clone().into_tensor_arg(),
            k_cache.into_tensor_arg(),
            v_cache.into_tensor_arg(),
            tables.into_tensor_arg(),
            lens.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            1.0 / (d as f32).sqrt(),
            block_size,
            d,
            max_context,
            warps as usize,
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
        let [n, _] = w.shape().dims::<2>();
        let rows = gemv_rows(b);
        let out = empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::new([b, n]),
            x.dtype,
        );
        let dtype = x.dtype;
        decode_linear_kernel::launch(
            &x.client,
            CubeCount::Static((n as u32).div_ceil(GEMV_WARPS), (b / rows) as u32, 1),
            CubeDim::new_2d(32, GEMV_WARPS),
            x.clone().into_tensor_arg(),
            w.into_tensor_arg(),
            bias.into_tensor_arg(),
            residual.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            rows,
            has_bias,
            gelu,
            has_residual,
            dtype_to_storage_type(dtype),
        );
        out
    }

    fn layer_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        let x = into_contiguous(x);
        let [r, e] = x.shape().dims::<2>();
        let out = empty_device_contiguous_dtype(
            x.client.clone(),
            x.device.clone(),
            Shape::new([r, e]),
            x.dtype,
        );
        let dtype = x.dtype;
        layer_norm_kernel::launch(
            &x.client,
            CubeCount::Static((r as u32).div_ceil(GEMV_WARPS), 1, 1),
            CubeDim::new_2d(32, GEMV_WARPS),
            x.clone().into_tensor_arg(),
            gamma.into_tensor_arg(),
            beta.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            eps,
            dtype_to_storage_type(dtype),
        );
        out
    }
}

/// Warps per cube of the decode GEMV (one output feature each).
const GEMV_WARPS: u32 = 8;

/// Rows per cube of the decode GEMV: the largest power of two up to 16 that
/// divides `batch` (so no cube runs past the batch).
fn gemv_rows(batch: usize) -> usize {
    let mut rows = 16;
    while batch % rows != 0 {
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

/// Decode attention over the paged cache (see the module doc). `qkv` `[B, 3E]`,
/// `tables` `[B, W]`, `lens` `[B]`; returns `[B, E]`.
pub fn paged_decode_attention(
    qkv: Tensor<2>,
    k_cache: &Tensor<3>,
    v_cache: &Tensor<3>,
    tables: Tensor<2, Int>,
    lens: Tensor<1, Int>,
    block_size: usize,
    max_context: usize,
) -> Tensor<2> {
    Tensor::from_dispatch(Dispatch::paged_decode_attention(
        qkv.into_dispatch(),
        k_cache.clone().into_dispatch(),
        v_cache.clone().into_dispatch(),
        tables.into_dispatch(),
        lens.into_dispatch(),
        block_size,
        max_context,
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
/// general matmul: `EMBER_GEMV_MAX_ROWS` (default 0, off: on an H100 it was
/// no faster than CubeCL's matmul at 1 row and slower at 8 and 64; see
/// docs/performance.md),
/// read once.
pub fn gemv_max_rows() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        std::env::var("EMBER_GEMV_MAX_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    })
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
