//! Writing host data into an existing CUDA tensor's memory (the CUDA half of
//! [`crate::ops::InputBuffer`]).
//!
//! The tensor's fusion handle is resolved to its CubeCL buffer (draining the
//! work queued before it) and the bytes are copied into that buffer on the
//! engine thread's stream, so they land after every op already queued and
//! before the next one: the same device pointer, new contents, laid out at
//! the buffer's strides (CUDA pitches the rows of a narrow 2-D tensor). Each
//! function returns whether it wrote in place; the caller replaces the
//! tensor when it did not (a tensor on another device, or another dtype).

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

/// Writes `values` (`[n, W]` row-major) into rows `rows` of `table` (`[R,
/// W]`, an int tensor on a CUDA device) in its own memory, and runs the
/// queued work up to it, so the rows are there before anything launched
/// after (a graph replay) reads them.
pub(crate) fn write_int_rows(table: &Tensor<2, Int>, rows: &[i32], values: Vec<i32>) {
    let device = table.device();
    let [_, w] = table.dims();
    let n = rows.len();
    let dtype = table.dtype();
    let rows = Tensor::<1, Int>::from_data(TensorData::new(rows.to_vec(), [n]), (&device, dtype));
    let values = Tensor::<2, Int>::from_data(TensorData::new(values, [n, w]), (&device, dtype));
    write_int_rows_from(table, rows, values);
}

/// [`write_int_rows`] from rows already on the device (`rows` `[n]`,
/// `values` `[n, W]`): a step's result kept where the next step reads it.
pub(crate) fn write_int_rows_from(
    table: &Tensor<2, Int>,
    rows: Tensor<1, Int>,
    values: Tensor<2, Int>,
) {
    let written = crate::ops::cuda::write_rows(table.clone(), rows, values);
    if let Ok(fused) = written.try_into_primitive::<cuda::Cube>() {
        let client = fused.client.clone();
        let _ = client.resolve_tensor_int::<cuda::CubeBackend>(fused);
    }
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

    /// Enqueues the copy of `data` into `target`'s buffer (same dtype, no
    /// overlapping elements): as it is where `target` is contiguous, laid
    /// out at its strides where its rows are pitched (a narrow 2-D tensor).
    pub fn copy_into(target: CubeTensor, data: &TensorData) -> bool {
        if target.dtype != data.dtype() || !target.is_nonoverlapping() {
            return false;
        }
        let bytes = match target.is_contiguous() {
            true => data.as_bytes().to_vec(),
            false => crate::ops::pitched::pitched_bytes(
                data.as_bytes(),
                target.meta.shape(),
                target.meta.strides(),
                target.dtype.size(),
            ),
        };
        target
            .client
            .write(&target.handle, burn::tensor::Bytes::from_bytes_vec(bytes));
        true
    }
}
