//! Decode-sized projections on the CPU: `y = x W^T + b`, then the epilogue,
//! streaming each out-major weight matrix (`[n, k]`) once per call.
//!
//! A decode step multiplies a handful of rows by every weight matrix of the
//! model: at a few rows it is bound by reading the weights (about 500 MB in
//! f32 for GPT-2 124M), at 16 rows on a 2-core AVX2 machine by arithmetic. Flex's general matmul (the `gemm`
//! crate) packs its operands for large products, which for a few rows costs
//! more than the product. Here the output features are split into
//! contiguous ranges of weight rows, one rayon task each (about four per
//! thread; [`split`]), and each task runs a register-blocked kernel over its
//! rows, chosen by the row count ([`lane_project`]): up to 8 rows [`tile`],
//! which reads the weights once, front to back, with vector loads; from 9
//! rows [`panel`], where each weight element is broadcast against 16 rows of
//! `x` packed into the vector lanes, so that the kernel is bound by FMAs
//! rather than by loads. The bias, GELU and residual are applied to the
//! task's outputs while they are in cache ([`epilogue`]). The same kernels
//! serve the LM head (the tied embedding is `[vocab, E]`, out-major as
//! stored).
//!
//! bf16 weights ([`bf16_weights`]) round `x` to bf16 too, and on a CPU with
//! AVX512_BF16 run the native kernel [`dot_bf16`] (`vdpbf16ps`: 32 products
//! per instruction, no widening), elsewhere the same f32-lane kernels on
//! weights widened to f32.
//!
//! [`project`] (f32 lanes) and [`bf16_weights::project`] work on slices; [`linear`]
//! takes Flex tensors and returns `None` for anything else (another backend,
//! other dtypes), which then goes to the tensor-op path. Which rows come
//! here is decided in `crate::ops` ([`super::CpuKernels::gemv_max_rows`]).

pub mod bf16_weights;
#[cfg(target_arch = "x86_64")]
pub mod dot_bf16;
pub mod epilogue;
pub mod lane_project;
pub mod lanes;
pub mod panel;
#[cfg(test)]
mod reference;
pub mod split;
pub mod tile;

use burn::prelude::*;
use burn::tensor::DType;
use half::bf16;

pub use epilogue::RowEpilogue;
pub use lane_project::project;

use super::flex_slices::{dense, values};
use super::isa::CpuIsa;

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
        DType::BF16 => bf16_weights::project(isa, x, m, k, values::<bf16>(&ws), n, &epilogue),
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

    /// bf16 weights round `x` too: on every ISA the result is the f32
    /// product of the bf16-rounded operands.
    #[test]
    fn bf16_weights_compute_the_product_of_the_rounded_operands() {
        let dev = Device::flex();
        let (m, k, n) = (3, 96, 9);
        let x = random([m, k], &dev);
        let w = random([n, k], &dev);
        let w16 = w.clone().cast(DType::BF16);
        let rounded = w16.clone().cast(DType::F32);
        let x_rounded = x.clone().cast(DType::BF16).cast(DType::F32);
        let want = floats(reference::linear(
            x_rounded,
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
