//! Decode-sized projections on the CPU: `y = x W^T + b`, then the epilogue,
//! streaming each out-major weight matrix (`[n, k]`) once per call.
//!
//! A decode step multiplies a handful of rows by every weight matrix of the
//! model, so it is bound by reading the weights (about 500 MB in f32 for
//! GPT-2 124M) rather than by arithmetic. Flex's general matmul (the `gemm`
//! crate) packs its operands for large products, which for a few rows costs
//! more than the product. Here the output features are split into
//! contiguous ranges of weight rows, one rayon task each (about four per
//! thread), and each task runs the register-blocked kernel of [`tile`] over
//! its rows: the weights are read once, front to back, with vector loads, and
//! the bias, GELU and residual are applied to the task's outputs while they
//! are in cache ([`epilogue`]). The same kernel serves the LM head (the tied
//! embedding is `[vocab, E]`, out-major as stored).
//!
//! [`project`] works on slices of `f32` or `bf16` weights; [`linear`] takes
//! Flex tensors and returns `None` for anything else (another backend, other
//! dtypes), which then goes to the tensor-op path. Which rows come here is
//! decided in `crate::ops` ([`super::CpuKernels::gemv_max_rows`]).

pub mod epilogue;
pub mod lanes;
pub mod tile;

use burn::prelude::*;
use burn::tensor::DType;
use half::bf16;
use rayon::prelude::*;

pub use epilogue::RowEpilogue;
use lanes::WeightElem;
use tile::Block;

use super::flex_slices::{dense, values};
use super::isa::CpuIsa;

/// Below this many multiply-adds a call runs on the calling thread: a rayon
/// fork costs more than the work.
const SERIAL_MACS: usize = 1 << 16;

/// Tasks per rayon thread, so that a slow thread does not hold up the call.
const TASKS_PER_THREAD: usize = 4;

/// `x W^T + b` with the epilogue: `x` `[m, k]`, `w` `[n, k]` (out-major),
/// `bias` `[n]`, `residual` `[m, n]`; returns `[m, n]` row-major.
///
/// # Panics
/// If a slice is shorter than its shape says (the caller checked the shapes).
pub fn project<W: WeightElem>(
    isa: CpuIsa,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[W],
    n: usize,
    epilogue: &RowEpilogue<'_>,
) -> Vec<f32> {
    assert!(
        x.len() >= m * k && w.len() >= n * k,
        "gemv: operand too short"
    );
    assert!(
        epilogue.bias.is_none_or(|b| b.len() >= n),
        "gemv: bias too short"
    );
    assert!(
        epilogue.residual.is_none_or(|r| r.len() >= m * n),
        "gemv: residual too short"
    );
    let mut out = vec![0.0f32; m * n];
    let out_ptr = SharedOut(out.as_mut_ptr());
    let rows = rows_per_task(m, n, k);
    let task = |first: usize| {
        let n_rows = rows.min(n - first);
        let block = Block {
            x,
            m,
            k,
            w: &w[first * k..(first + n_rows) * k],
            n: n_rows,
            col: first,
            ldo: n,
        };
        // SAFETY: every task writes only its own columns `first ..
        // first + n_rows` of `out` (the ranges are disjoint), `out` outlives
        // the tasks, the shapes were checked above, and the ISA's features
        // were detected on this CPU.
        unsafe { run(isa, block, out_ptr.get(), epilogue) };
    };
    if m * n * k < SERIAL_MACS {
        (0..n).step_by(rows).for_each(task);
    } else {
        (0..n).into_par_iter().step_by(rows).for_each(task);
    }
    out
}

/// The output pointer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: tasks only write disjoint columns through it (see `project`).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Weight rows per task: about [`TASKS_PER_THREAD`] tasks per rayon thread,
/// whole tiles of 4 rows.
fn rows_per_task(m: usize, n: usize, k: usize) -> usize {
    if m * n * k < SERIAL_MACS {
        return n.max(1);
    }
    let tasks = rayon::current_num_threads() * TASKS_PER_THREAD;
    n.div_ceil(tasks).next_multiple_of(4).max(4)
}

/// One block on the detected ISA's entry point.
///
/// # Safety
/// As [`tile::run_portable`]; `isa` must have been detected on this CPU.
unsafe fn run<W: WeightElem>(
    isa: CpuIsa,
    block: Block<'_, W>,
    out: *mut f32,
    epilogue: &RowEpilogue<'_>,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx512 => tile::run_avx512(block, out, epilogue),
        #[cfg(target_arch = "x86_64")]
        CpuIsa::Avx2 => tile::run_avx2(block, out, epilogue),
        _ => tile::run_portable(block, out, epilogue),
    }
}

/// [`project`] on Flex tensors: `x` `[m, k]` (f32), `w` `[n, k]` (f32 or
/// bf16), `bias` `[n]`, `residual` `[m, n]` (f32). `None` when any of them
/// is not a Flex tensor of those dtypes and shapes.
pub fn linear(
    isa: CpuIsa,
    x: &Tensor<2>,
    w: &Tensor<2>,
    bias: Option<&Tensor<1>>,
    gelu: bool,
    residual: Option<&Tensor<2>>,
) -> Option<Tensor<2>> {
    let [m, k] = x.dims();
    let [n, k_w] = w.dims();
    let f32_ok = |t: DType| t == DType::F32;
    if k != k_w
        || !f32_ok(x.dtype())
        || bias.is_some_and(|b| b.dims() != [n] || !f32_ok(b.dtype()))
        || residual.is_some_and(|r| r.dims() != [m, n] || !f32_ok(r.dtype()))
    {
        return None;
    }
    let device = x.device();
    let xs = dense(x)?;
    let ws = dense(w)?;
    let bs = bias.map(dense).map_or(Some(None), |b| b.map(Some))?;
    let rs = residual.map(dense).map_or(Some(None), |r| r.map(Some))?;
    let epilogue = RowEpilogue {
        bias: bs.as_ref().map(values::<f32>),
        gelu,
        residual: rs.as_ref().map(values::<f32>),
    };
    let x = values::<f32>(&xs);
    let y = match w.dtype() {
        DType::F32 => project(isa, x, m, k, values::<f32>(&ws), n, &epilogue),
        DType::BF16 => project(isa, x, m, k, values::<bf16>(&ws), n, &epilogue),
        _ => return None,
    };
    Some(Tensor::from_data(TensorData::new(y, [m, n]), &device))
}

#[cfg(test)]
mod tests {
    use burn::tensor::Distribution;

    use super::*;
    use crate::ops::reference;

    fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().iter::<f32>().collect()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn random<const D: usize>(shape: [usize; D], dev: &Device) -> Tensor<D> {
        Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
    }

    /// Every ISA this CPU has, every epilogue, row counts across the `MR`
    /// tiles, output counts across the 4-row tiles and `k` with and without
    /// a vector tail, against the tensor-op reference.
    #[test]
    fn matches_the_tensor_op_reference_on_every_isa() {
        let dev = Device::flex();
        for (m, k, n) in [
            (1, 64, 4),
            (3, 37, 7),
            (4, 72, 9),
            (5, 128, 130),
            (16, 200, 33),
            (2, 8, 1),
        ] {
            let x = random([m, k], &dev);
            let w = random([n, k], &dev);
            let b = random([n], &dev);
            let r = random([m, n], &dev);
            for (gelu, bias, residual) in [(false, None, None), (true, Some(&b), Some(&r))] {
                let epilogue = crate::ops::epilogue::Epilogue {
                    gelu,
                    residual: residual.cloned(),
                };
                let want = floats(reference::linear(x.clone(), &w, bias, true, epilogue));
                for isa in CpuIsa::available() {
                    let got = linear(isa, &x, &w, bias, gelu, residual).expect("flex f32");
                    let worst = max_diff(&floats(got), &want);
                    assert!(worst < 1e-4, "{isa} m {m} k {k} n {n}: max diff {worst}");
                }
            }
        }
    }

    /// bf16 weights are widened exactly: the result is the f32 product with
    /// the bf16-rounded weights.
    #[test]
    fn bf16_weights_compute_the_product_of_their_rounded_values() {
        let dev = Device::flex();
        let (m, k, n) = (3, 96, 9);
        let x = random([m, k], &dev);
        let w = random([n, k], &dev);
        let w16 = w.clone().cast(DType::BF16);
        let rounded = w16.clone().cast(DType::F32);
        let want = floats(reference::linear(
            x.clone(),
            &rounded,
            None,
            true,
            crate::ops::epilogue::Epilogue::none(),
        ));
        for isa in CpuIsa::available() {
            let got = linear(isa, &x, &w16, None, false, None).expect("bf16 weights");
            let worst = max_diff(&floats(got), &want);
            assert!(worst < 1e-4, "{isa}: max diff {worst}");
        }
    }

    #[test]
    fn large_calls_split_into_whole_tiles_and_small_ones_stay_on_one_thread() {
        assert_eq!(rows_per_task(1, 8, 8), 8);
        let rows = rows_per_task(1, 50_257, 768);
        assert_eq!(rows % 4, 0);
        assert!(rows * rayon::current_num_threads() * TASKS_PER_THREAD >= 50_257);
    }

    #[test]
    fn mismatched_shapes_or_dtypes_are_left_to_the_tensor_op_path() {
        let dev = Device::flex();
        let x = random([2, 8], &dev);
        let isa = CpuIsa::detect();
        assert!(linear(isa, &x, &random([4, 9], &dev), None, false, None).is_none());
        let wrong_bias = random([5], &dev);
        let w = random([4, 8], &dev);
        assert!(linear(isa, &x, &w, Some(&wrong_bias), false, None).is_none());
        let ints = Tensor::<2, Int>::zeros([4, 8], &dev)
            .float()
            .cast(DType::F64);
        assert!(linear(isa, &x, &ints, None, false, None).is_none());
    }
}
