//! Device data helpers of the `--check-kernels` checks: tensors to host
//! floats, max differences, int tensors from host vectors.

use burn::prelude::*;
use burn::tensor::DType;

/// Positions per cache block in these checks.
pub const BLOCK: usize = 16;

/// `t` as host f32s.
pub fn floats<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.cast(DType::F32).into_data().iter::<f32>().collect()
}

/// Largest |a - b| elementwise.
pub fn max_diff(a: Vec<f32>, b: Vec<f32>) -> f32 {
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// An int tensor of `shape` from `v`.
pub fn ints<const D: usize>(v: Vec<i32>, shape: [usize; D], dev: &Device) -> Tensor<D, Int> {
    Tensor::from_data(TensorData::new(v, shape), dev)
}
