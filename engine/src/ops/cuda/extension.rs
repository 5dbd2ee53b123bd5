//! Ember's kernels as a Burn backend extension ([`CudaOps`]), for CubeCL and
//! for fusion: the extension is how a `Tensor` on Burn's CUDA device (behind
//! fusion) reaches a CubeCL launch. Each method makes its inputs contiguous
//! and calls its kernel's `launch` (one file per kernel, [`super::kernels`]).
//!
//! Every knob arrives as a plain argument: the projections' launch shapes are
//! planned by the caller from the `KernelTuning` (`crate::ops::plan`); decode
//! attention gets the `--attention-splits` knob as it is (0 = plan the split
//! in the launch, from the batch and the device's SMs). The `#[fusion(..)]`
//! attributes tell fusion each output's dtype and shape.
//!
//! An operand that may be absent crosses this boundary as a tensor (an
//! unread stand-in when absent) and a flag, because an extension method
//! takes only tensors and plain values: `super::Operand` builds the pair on
//! the tensor side, [`present`] turns it back into an `Option` here.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{backend_extension, Backend};
use burn::prelude::*;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;

use super::cublaslt::gemm;
use super::kernels::{attention, cache_write, gemv, layer_norm, mma, prefill_attention};

/// Ember's CUDA kernels as a Burn backend extension (CubeCL, fused or not).
#[backend_extension(Cube, Fusion)]
pub trait CudaOps: Backend {
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
    /// counters and a context may be split across cubes (`fixed_splits` of
    /// them, or planned when 0; left at zero afterwards); otherwise it is not
    /// read. When `write_new`, each sequence's new K/V rows (the K and V
    /// thirds of `qkv`) are first written in place at `slots` `[B]` (else
    /// `slots` is not read).
    #[fusion(dtype = qkv, shape = { let [b, e3] = qkv.dims::<2>(); Shape::new([b, e3 / 3]) })]
    #[allow(clippy::too_many_arguments)]
    fn paged_decode_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        write_new: bool,
        arrivals: IntTensor<Self>,
        can_split: bool,
        fixed_splits: usize,
        block_size: usize,
        max_context: usize,
    ) -> FloatTensor<Self>;

    /// `x` `[B, K]` times the out-major weight `w` `[N, K]` transposed, plus
    /// `bias` `[N]` when `has_bias`, through tanh-GELU when `gelu`, plus
    /// `residual` `[B, N]` when `has_residual` (unread operands may be any
    /// tensor), on the GEMV (decode batches below the tensor-core tile).
    /// Returns `[B, N]`.
    #[fusion(dtype = x, shape = { let [b, _] = x.dims::<2>(); let [n, _] = w.dims::<2>(); Shape::new([b, n]) })]
    fn gemv_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
    ) -> FloatTensor<Self>;

    /// The same product on the tensor-core kernel, `row_tiles` 16-row tiles
    /// (1, 2 or 4) and `warps` warps per cube. Returns `[B, N]`.
    #[fusion(dtype = x, shape = { let [b, _] = x.dims::<2>(); let [n, _] = w.dims::<2>(); Shape::new([b, n]) })]
    #[allow(clippy::too_many_arguments)]
    fn mma_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
        row_tiles: usize,
        warps: usize,
    ) -> FloatTensor<Self>;

    /// The same product on cuBLASLt (its epilogues: bias, bias + tanh-GELU;
    /// the residual as `C` with `beta = 1`), enqueued on CubeCL's stream.
    /// Unread operands may be any tensor. Returns `[B, N]`.
    #[fusion(dtype = x, shape = { let [b, _] = x.dims::<2>(); let [n, _] = w.dims::<2>(); Shape::new([b, n]) })]
    #[allow(clippy::too_many_arguments)]
    fn lt_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
    ) -> FloatTensor<Self>;

    /// Causal prefill attention over segments of the flat `qkv` (`[T, 3E]`,
    /// head_dim 64): row `r`'s queries are `cu_seqlens[r]..cu_seqlens[r + 1]`
    /// at positions from `starts[r]`, its keys and values read from the
    /// caches (`[H, S, D]`) through `tables` (`[R, W]`, blocks of
    /// `block_size`); one cube per `tiles` entry (`[n, 2]`: row, first
    /// query) and head. Returns `[T, E]`, padding tokens 0.
    #[fusion(dtype = qkv, shape = { let [n, e3] = qkv.dims::<2>(); Shape::new([n, e3 / 3]) })]
    #[allow(clippy::too_many_arguments)]
    fn prefill_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        cu_seqlens: IntTensor<Self>,
        starts: IntTensor<Self>,
        tiles: IntTensor<Self>,
        block_size: usize,
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

/// An optional operand as it arrives here (see the module docs): the tensor,
/// contiguous, when `flag` says it is present.
fn present(tensor: CubeTensor, flag: bool) -> Option<CubeTensor> {
    flag.then(|| into_contiguous(tensor))
}

impl CudaOps for CubeBackend {
    fn kv_write(
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        qkv: FloatTensor<Self>,
        slots: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        cache_write::launch(
            k_cache,
            v_cache,
            into_contiguous(qkv),
            into_contiguous(slots),
        )
    }

    fn paged_decode_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        lens: IntTensor<Self>,
        slots: IntTensor<Self>,
        write_new: bool,
        arrivals: IntTensor<Self>,
        can_split: bool,
        fixed_splits: usize,
        block_size: usize,
        max_context: usize,
    ) -> FloatTensor<Self> {
        attention::launch(
            into_contiguous(qkv),
            k_cache,
            v_cache,
            into_contiguous(tables),
            into_contiguous(lens),
            present(slots, write_new),
            arrivals,
            can_split,
            fixed_splits,
            block_size,
            max_context,
        )
    }

    fn gemv_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
    ) -> FloatTensor<Self> {
        gemv::launch(
            into_contiguous(x),
            into_contiguous(w),
            bias,
            into_contiguous(residual),
            has_bias,
            gelu,
            has_residual,
        )
    }

    fn mma_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
        row_tiles: usize,
        warps: usize,
    ) -> FloatTensor<Self> {
        mma::launch(
            into_contiguous(x),
            into_contiguous(w),
            bias,
            into_contiguous(residual),
            has_bias,
            gelu,
            has_residual,
            row_tiles,
            warps,
        )
    }

    fn lt_linear(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        residual: FloatTensor<Self>,
        has_bias: bool,
        gelu: bool,
        has_residual: bool,
    ) -> FloatTensor<Self> {
        gemm::launch(
            into_contiguous(x),
            into_contiguous(w),
            present(bias, has_bias),
            present(residual, has_residual),
            gelu,
        )
    }

    fn prefill_attention(
        qkv: FloatTensor<Self>,
        k_cache: FloatTensor<Self>,
        v_cache: FloatTensor<Self>,
        tables: IntTensor<Self>,
        cu_seqlens: IntTensor<Self>,
        starts: IntTensor<Self>,
        tiles: IntTensor<Self>,
        block_size: usize,
    ) -> FloatTensor<Self> {
        prefill_attention::launch(
            into_contiguous(qkv),
            k_cache,
            v_cache,
            prefill_attention::Segments {
                tables: into_contiguous(tables),
                cu_seqlens: into_contiguous(cu_seqlens),
                starts: into_contiguous(starts),
                tiles: into_contiguous(tiles),
            },
            block_size,
        )
    }

    fn layer_norm_rows(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> FloatTensor<Self> {
        layer_norm::launch(
            into_contiguous(x),
            into_contiguous(gamma),
            into_contiguous(beta),
            eps,
        )
    }
}
