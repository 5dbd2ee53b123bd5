//! Writing host data into an existing CUDA tensor's memory (the CUDA half of
//! [`crate::ops::InputBuffer`]).
//!
//! The tensor's fusion handle is resolved to its CubeCL buffer (draining the
//! work queued before it) and the bytes are copied into that buffer on the
//! engine thread's stream, so they land after every op already queued and
//! before the next one: the same device pointer, new contents. Each function
//! returns whether it wrote in place; the caller replaces the tensor when it
//! did not (a tensor on another device).

use burn::prelude::*;

/// Copies `data` into the memory of `tensor` (an int tensor) if it lives on CUDA.
pub(crate) fn write_int<const D: usize>(tensor: &Tensor<D, Int>, data: &TensorData) -> bool {
    // A clone keeps the buffer registered: the resolve below is then a read.
    let Ok(fused) = tensor.clone().try_into_primitive::<cuda::Cube>() else {
        return false;
    };
    let client = fused.client.clone();
    cuda::copy_into(client.resolve_tensor_int::<cuda::CubeBackend>(fused), data)
}

/// Copies `data` (int elements) into the memory of `tensor` from element
/// `offset` on, if it lives on CUDA and `data` fits there.
pub(crate) fn write_int_at<const D: usize>(
    tensor: &Tensor<D, Int>,
    offset: usize,
    data: &TensorData,
) -> bool {
    let Ok(fused) = tensor.clone().try_into_primitive::<cuda::Cube>() else {
        return false;
    };
    let client = fused.client.clone();
    cuda::copy_into_at(
        client.resolve_tensor_int::<cuda::CubeBackend>(fused),
        offset,
        data,
    )
}

/// Copies `data` into the memory of `tensor` (a float tensor) if it lives on CUDA.
pub(crate) fn write_float<const D: usize>(tensor: &Tensor<D>, data: &TensorData) -> bool {
    let Ok(fused) = tensor.clone().try_into_primitive::<cuda::Cube>() else {
        return false;
    };
    let client = fused.client.clone();
    cuda::copy_into(
        client.resolve_tensor_float::<cuda::CubeBackend>(fused),
        data,
    )
}

mod cuda {
    pub use burn::backend::Cube;
    use burn::prelude::*;
    use burn_cubecl::tensor::CubeTensor;
    pub use burn_cubecl::CubeBackend;

    /// Enqueues the copy of `data` into `target`'s buffer (same dtype, dense).
    pub fn copy_into(target: CubeTensor, data: &TensorData) -> bool {
        if target.dtype != data.dtype() || !target.is_contiguous() {
            return false;
        }
        let bytes = burn::tensor::Bytes::from_bytes_vec(data.as_bytes().to_vec());
        target.client.write(&target.handle, bytes);
        true
    }

    /// Enqueues the copy of `data` into `target`'s buffer from element
    /// `offset` on (same dtype, dense, inside the tensor).
    pub fn copy_into_at(target: CubeTensor, offset: usize, data: &TensorData) -> bool {
        let elements = burn::backend::TensorMetadata::shape(&target).num_elements();
        if target.dtype != data.dtype()
            || !target.is_contiguous()
            || offset + data.num_elements() > elements
        {
            return false;
        }
        let start = (offset * target.dtype.size()) as u64;
        let bytes = burn::tensor::Bytes::from_bytes_vec(data.as_bytes().to_vec());
        target
            .client
            .write(&target.handle.clone().offset_start(start), bytes);
        true
    }
}
