//! Helpers every kernel launch shares: output allocation and vector widths.

use burn::prelude::*;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// A new contiguous tensor of `shape` on `like`'s device, in its dtype (a
/// kernel's output).
pub fn empty_like<const D: usize>(like: &CubeTensor, shape: [usize; D]) -> CubeTensor {
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
pub fn vector_size(tensor: &CubeTensor, extents: &[usize]) -> usize {
    let elem = tensor.dtype.size();
    tensor
        .client
        .io_optimized_vector_sizes(elem)
        .filter(|&v| v * elem <= 16 && extents.iter().all(|x| x % v == 0))
        .max()
        .unwrap_or(1)
}
