//! Device data helpers of the checks: tensors to host floats and max
//! differences (every check), int tensors from host vectors and random
//! tensors (the `--check-kernels` checks).

use burn::prelude::*;
use burn::tensor::{DType, Distribution};

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

/// A tensor of `shape` drawn from the standard normal distribution.
pub fn normal<const D: usize>(shape: [usize; D], dev: &Device) -> Tensor<D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), dev)
}

/// A copy of `t` in new device memory (an in-place kernel on `t` leaves it
/// as it was).
pub fn copy<const D: usize>(t: &Tensor<D>) -> Tensor<D> {
    t.clone().mul_scalar(1.0)
}
