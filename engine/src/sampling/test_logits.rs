//! Test support for the sampling tests: logits tensors from literal rows.

use burn::prelude::*;

/// A Flex `[rows, V]` logits tensor.
pub(crate) fn logits(rows: &[&[f32]]) -> Tensor<2> {
    let v = rows[0].len();
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), v]), &Device::flex())
}
