//! The sampling kernel: one token per row of `[B, V]` logits, greedy and
//! sampled rows alike (temperature, top-k, top-p, min-p, an optional
//! allowed-token bitmask), with the semantics, the noise and the f32
//! operations of the CPU sampler `crate::sampling::row_sampler` (the spec:
//! read its module docs first). Parameters come from device tensors in the
//! layout of [`crate::ops::row_params`]; nothing is read back, nothing is
//! allocated by the data, and the launch shape is fixed, so a decode graph
//! can capture it once and serve any mix of rows.
//!
//! One cube per row, `SAMPLE_WARPS` warps; a uniform branch per row (the
//! parameters are the row's). The row's keys stay in shared memory (`4 V`
//! bytes: 201 KB for GPT-2, within the 227 KB a block may opt in to on an
//! H100; CubeCL sets the opt-in), so only pass 1 reads global memory:
//!
//! 1. **Scan** (every row): each logit `l` (rows of `V`, any `V`; loads
//!    unrolled by `UNROLL` so they are in flight together), penalized first
//!    where the row has a penalty slot (its counts-table row read beside the
//!    logits: `row_params`' module docs), `s = l / T`
//!    (greedy rows: `s = l`), its key (0 if absent: bitmask bit 0 or NaN)
//!    into shared memory; the cube's max key, lowest index holding it, min
//!    key and count of present tokens. **Greedy rows stop here** with the
//!    argmax.
//! 2. **top-k** (`0 < k < #present`): `kth_largest`, a radix descent over
//!    `[key_min, key_max]` with counts ([`search`]), 3 bits a level: the
//!    first levels walk the cached keys, and once the keys left fit in 2,048
//!    candidates the next gathers them and the rest walk those alone.
//! 3. **top-p** (`0 < p < 1`): `top_p_threshold`, the same descent over
//!    `[lower, key_max]` with masses; its first pass also sums `Z` over the
//!    top-k set. min-p costs one `ln` (no pass).
//! 4. **Choice** (every sampled row, temperature-only rows go straight
//!    here): the argmax of `s_i + g_i` over keys `>= threshold`, starting
//!    from the row's top token; a group of 4 tokens gets its Philox words
//!    only if one of them could still win with the largest noise, a token
//!    its logarithms only under its word's leading-zero bound ([`noise`]).
//!    Cube argmax: max value, then the lowest index holding it.
//!
//! **Rejection** (top-p rows without top-k, outside trace mode): the
//! choice of pass 4 over the keys min-p keeps comes first; its token `c`
//! is the answer exactly when `c` is in the nucleus, i.e. when the mass of
//! the keys above `c`'s is under `p Z` (then `c` is also the argmax over
//! the smaller kept set). One pass of masses tells; a rejected draw (at
//! most `1 - p` of them) goes through passes 2-4. The sums differ from the
//! descent's only in their order, so the two agree except where that mass
//! is within rounding of `p Z`.
//!
//! With `write_trace`, unit 0 also writes the row's argmax, top-k, top-p and
//! final threshold keys (`row_params::TRACE_COLS`), which a GPU check
//! compares with `row_sampler::RowTrace` pass by pass.

mod choice;
mod levels;
mod noise;
mod params;
mod scan;
mod search;
#[cfg(test)]
mod source_tests;
mod truncate;

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn::prelude::{Device, Shape};
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::cuda::launch::empty_like;
use crate::ops::row_params::{slot_row_len, FLOAT_COLS, INT_COLS, TRACE_COLS};
use levels::{candidates_at, CANDIDATES};
use params::{read_params, read_penalty};
use scan::scan_row;
use truncate::{sample_truncated, ScanStats, OUT_TAU_K, OUT_THRESHOLD, OUT_TOKEN, OUT_TOP_P_KEY};

/// Warps per cube (one cube per row).
pub const SAMPLE_WARPS: usize = 16;

/// See the module doc. `logits` `[B, V]` (rows contiguous), `floats` `[B,
/// FLOAT_COLS]` f32 and `ints` `[B, INT_COLS]` (`row_params` columns, 8 each), `positions` `[B]`,
/// `allowed` `[B, ceil(V / 32)]` (read only with `has_mask`, for rows whose
/// flag is set), `counts` `[S, 2V]`, the slot table (read only with `has_counts`, for rows
/// with a penalty slot), `out` `[B, 1]`, `trace` `[B, 4]` (written only with
/// `write_trace`).
#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub fn sample_rows_kernel<F: Float, I: Int>(
    logits: &Tensor<F>,
    floats: &Tensor<f32>,
    ints: &Tensor<I>,
    positions: &Tensor<I>,
    allowed: &Tensor<I>,
    counts: &Tensor<I>,
    out: &mut Tensor<I>,
    trace: &mut Tensor<I>,
    #[comptime] vocab: usize,
    #[comptime] warps: usize,
    #[comptime] has_mask: bool,
    #[comptime] has_counts: bool,
    #[comptime] write_trace: bool,
    #[define(F, I)] _dtypes: [ElemType; 2],
) {
    let row = CUBE_POS_X as usize;
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let mut keys = Shared::<[u32]>::new_slice(vocab);
    let mut red_u = Shared::<[u32]>::new_slice(warps);
    let mut red_f = Shared::<[f32]>::new_slice(warps);
    let mut bins_u = Shared::<[u32]>::new_slice(comptime!(candidates_at(warps) + CANDIDATES));
    let mut bins_f = Shared::<[f32]>::new_slice(comptime!(warps * 32));
    let mut stats = Shared::<[u32]>::new_slice(4usize);

    let p = read_params(floats, ints, row, has_mask);
    let penalty = read_penalty(floats, ints, counts, row, has_counts);
    let pos = u32::cast_from(positions[row * positions.stride(0)]);
    let tempered = p.temperature > f32::new(0.0);
    let greedy = !tempered || p.top_k == 1;

    // Pass 1: keys, max key and its lowest index, min key, count.
    scan_row(
        logits,
        allowed,
        counts,
        &penalty,
        &mut keys,
        &mut red_u,
        &mut stats,
        row,
        p.temperature,
        !greedy,
        p.masked,
        vocab,
        warps,
    );
    let scanned = ScanStats {
        key_max: stats[0],
        argmax: stats[1],
        key_min: stats[2],
        present: stats[3],
    };
    // The token, then the trace's keys (0 where a pass did not run).
    let mut chosen = Array::<u32>::new(4usize);
    chosen[OUT_TOKEN] = scanned.argmax;
    chosen[OUT_TAU_K] = 0u32;
    chosen[OUT_TOP_P_KEY] = 0u32;
    chosen[OUT_THRESHOLD] = 0u32;
    // s_max finite: key(-inf) < key_max < key(+inf) (0 = nothing present).
    let finite = scanned.key_max > 0x007F_FFFFu32 && scanned.key_max < 0xFF80_0000u32;
    if !greedy && finite {
        sample_truncated(
            &keys,
            &mut red_u,
            &mut red_f,
            &mut bins_u,
            &mut bins_f,
            &p,
            &scanned,
            pos,
            &mut chosen,
            vocab,
            warps,
            write_trace,
        );
    }

    let out_at = row * out.stride(0);
    if tid == 0 {
        out[out_at] = I::cast_from(chosen[OUT_TOKEN]);
        if comptime![write_trace] {
            let t_at = row * trace.stride(0);
            trace[t_at] = I::cast_from(scanned.argmax);
            trace[t_at + 1] = I::cast_from(chosen[OUT_TAU_K]);
            trace[t_at + 2] = I::cast_from(chosen[OUT_TOP_P_KEY]);
            trace[t_at + 3] = I::cast_from(chosen[OUT_THRESHOLD]);
        }
    }
}

cuda_kernel! {
    /// One token per row of `logits` `[B, V]` (module doc) with the
    /// `row_params` columns `floats` `[B, 8]` (f32), `ints` `[B, 8]`, each
    /// row's sampled position `positions` `[B]` and, optionally, an allowed
    /// bitmask `[B, ceil(V / 32)]`; with `trace` (`[B, 4]`) the per-pass keys
    /// are written there. Returns the ids `[B, 1]` in `ints`' dtype.
    #[fusion(dtype = ints, shape = { let [b, _] = logits.dims::<2>(); Shape::new([b, 1]) })]
    pub fn SampleRows::sample_rows(
        logits: Tensor<2>,
        floats: Tensor<2>,
        ints: Tensor<2, Int>,
        positions: Tensor<1, Int>,
        #[optional(flag = has_allowed, stand_in = positions)] allowed: Option<Tensor<2, Int>>,
        #[optional(flag = has_counts, stand_in = positions)] counts: Option<Tensor<2, Int>>,
        #[in_place] #[optional(flag = has_trace, stand_in = ints)] trace: Option<Tensor<2, Int>>,
    ) -> Tensor<2, Int>
}

/// Whether the kernel's shared memory fits `device` for a vocabulary of
/// `vocab`: `false` off CUDA or when the keys do not fit (the caller samples
/// on the host). The device's limit is read once per process (one server
/// serves one kind of GPU), so asking costs nothing after the first time.
pub fn fits_device(device: &Device, vocab: usize) -> bool {
    static MAX_SHARED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let max = match MAX_SHARED.get() {
        Some(max) => *max,
        None => {
            use burn::prelude::Tensor as BurnTensor;
            let probe = BurnTensor::<1>::zeros([1], (device, DType::F32));
            // Not a CUDA tensor: nothing to launch on (and nothing cached).
            let Ok(fused) = probe.try_into_primitive::<burn::backend::Cube>() else {
                return false;
            };
            let client = fused.client.clone();
            let tensor = client.resolve_tensor_float::<burn_cubecl::CubeBackend>(fused);
            let max = tensor.client.properties().hardware.max_shared_memory_size;
            *MAX_SHARED.get_or_init(|| max)
        }
    };
    shared_bytes(vocab) <= max
}

/// Shared memory one cube of [`sample_rows_kernel`] takes for `vocab`.
pub fn shared_bytes(vocab: usize) -> usize {
    4 * (vocab + 2 * SAMPLE_WARPS + 64 * SAMPLE_WARPS + CANDIDATES + 4)
}

/// Whether a cube's shared memory fits `like`'s device for `vocab` (check
/// once at startup; [`launch`] asserts it).
pub fn fits(like: &CubeTensor, vocab: usize) -> bool {
    shared_bytes(vocab) <= like.client.properties().hardware.max_shared_memory_size
}

/// Launches [`sample_rows_kernel`] over `logits` `[B, V]` (f16 or f32, rows
/// contiguous) with the `row_params` columns `floats` `[B, 8]` (f32) and
/// `ints` `[B, 8]`, `positions` `[B]` and, optionally, `allowed` `[B,
/// ceil(V / 32)]` (all three in `ints`' integer dtype). With `trace` (`[B,
/// 4]`, that dtype) the per-pass results are written there, in place.
/// Returns the ids `[B, 1]` in `ints`' dtype.
pub fn launch(
    logits: CubeTensor,
    floats: CubeTensor,
    ints: CubeTensor,
    positions: CubeTensor,
    allowed: Option<CubeTensor>,
    counts: Option<CubeTensor>,
    trace: Option<CubeTensor>,
) -> CubeTensor {
    let [b, v] = logits.shape().dims::<2>();
    assert!(
        logits.meta.strides()[1] == 1 && floats.meta.strides()[1] == 1,
        "sample_rows: rows must be contiguous"
    );
    assert!(
        floats.dtype == DType::F32 && floats.shape().dims::<2>() == [b, FLOAT_COLS],
        "sample_rows: floats must be f32 [B, {FLOAT_COLS}]"
    );
    assert!(
        ints.shape().dims::<2>() == [b, INT_COLS] && ints.meta.strides()[1] == 1,
        "sample_rows: ints must be [B, {INT_COLS}]"
    );
    assert!(
        positions.dtype == ints.dtype,
        "sample_rows: positions in ints' dtype"
    );
    assert!(
        fits(&logits, v),
        "sample_rows: {v} keys exceed the shared memory"
    );
    let out = empty_like(&ints, [b, 1]);
    let has_mask = allowed.is_some();
    let allowed = allowed.unwrap_or_else(|| positions.clone());
    assert!(
        allowed.dtype == ints.dtype,
        "sample_rows: allowed in ints' dtype"
    );
    let has_counts = counts.is_some();
    let counts = counts.unwrap_or_else(|| positions.clone());
    assert!(
        counts.dtype == ints.dtype
            && (!has_counts || counts.shape().dims::<2>()[1] == slot_row_len(v)),
        "sample_rows: the slot table [S, 2V] in ints' dtype"
    );
    let write_trace = trace.is_some();
    let trace = trace.unwrap_or_else(|| empty_like(&ints, [1, TRACE_COLS]));
    let (f, i) = (logits.dtype, ints.dtype);
    sample_rows_kernel::launch(
        &logits.client,
        CubeCount::Static(b as u32, 1, 1),
        CubeDim::new_2d(32, SAMPLE_WARPS as u32),
        logits.clone().into_tensor_arg(),
        floats.into_tensor_arg(),
        ints.into_tensor_arg(),
        positions.into_tensor_arg(),
        allowed.into_tensor_arg(),
        counts.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        trace.into_tensor_arg(),
        v,
        SAMPLE_WARPS,
        has_mask,
        has_counts,
        write_trace,
        [dtype_to_storage_type(f), dtype_to_storage_type(i)],
    );
    out
}
