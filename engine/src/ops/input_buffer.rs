//! [`InputBuffer`]: a device tensor of fixed shape whose contents are
//! rewritten from the host, in place where the device allows it.
//!
//! On CUDA the bytes are copied into the tensor's existing device memory on
//! the engine thread's stream ([`super::cuda::inplace`]), after every op
//! already queued and before the next one: the same device pointer, new
//! contents, so a captured CUDA graph that reads the buffer sees new inputs
//! on every replay. Anywhere else (the CPU) a fresh tensor replaces the old
//! one: nothing is captured there, and a host copy is all a write costs.

use burn::prelude::*;
use burn::tensor::kind::Basic;
use burn::tensor::DType;

/// A device tensor of fixed shape whose contents are rewritten from the host.
#[derive(Debug)]
pub struct InputBuffer<const D: usize, K: Basic> {
    tensor: Tensor<D, K>,
    shape: [usize; D],
}

impl<const D: usize, K: Basic> InputBuffer<D, K> {
    /// A zero-filled buffer in the device's default dtype for `K`.
    pub fn zeros(shape: [usize; D], device: &Device) -> Self {
        Self {
            tensor: Tensor::zeros(shape, device),
            shape,
        }
    }

    /// A zero-filled buffer of the given dtype.
    pub fn zeros_dtype(shape: [usize; D], device: &Device, dtype: DType) -> Self {
        Self {
            tensor: Tensor::zeros(shape, (device, dtype)),
            shape,
        }
    }

    /// The buffer as a tensor (a handle to the same device memory).
    pub fn tensor(&self) -> Tensor<D, K> {
        self.tensor.clone()
    }

    /// A fresh tensor with `data`, replacing the old one (when no in-place
    /// write was possible).
    fn replace(&mut self, data: TensorData) {
        let dtype = self.tensor.dtype();
        self.tensor = Tensor::from_data(data, (&self.tensor.device(), dtype));
    }
}

impl<const D: usize> InputBuffer<D, Int> {
    /// Replaces the contents with `values` (row-major, exactly the buffer's size).
    pub fn write(&mut self, values: Vec<i32>) {
        debug_assert_eq!(values.len(), self.shape.iter().product::<usize>());
        let data = TensorData::new(values, self.shape);
        #[cfg(feature = "cuda")]
        if super::cuda::inplace::write_int(&self.tensor, &data) {
            return;
        }
        self.replace(data);
    }
}

impl InputBuffer<2, Int> {
    /// Replaces row `row` with `values` (exactly one row), leaving the
    /// other rows as they are.
    pub fn write_row(&mut self, row: usize, values: Vec<i32>) {
        let [rows, width] = self.shape;
        debug_assert!(row < rows && values.len() == width);
        let data = TensorData::new(values, [1, width]);
        #[cfg(feature = "cuda")]
        if super::cuda::inplace::write_int_at(&self.tensor, row * width, &data) {
            return;
        }
        let device = self.tensor.device();
        let dtype = self.tensor.dtype();
        let fresh = Tensor::<2, Int>::from_data(data, (&device, dtype));
        self.tensor = self
            .tensor
            .clone()
            .slice_assign([row..row + 1, 0..width], fresh);
    }
}

impl<const D: usize> InputBuffer<D, Float> {
    /// Replaces the contents with `values` (row-major, exactly the buffer's
    /// size; the buffer must be f32).
    pub fn write(&mut self, values: Vec<f32>) {
        debug_assert_eq!(values.len(), self.shape.iter().product::<usize>());
        let data = TensorData::new(values, self.shape);
        #[cfg(feature = "cuda")]
        if super::cuda::inplace::write_float(&self.tensor, &data) {
            return;
        }
        self.replace(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_contents() {
        let dev = Device::flex();
        let mut ints = InputBuffer::<2, Int>::zeros([2, 2], &dev);
        ints.write(vec![1, 2, 3, 4]);
        let got: Vec<i64> = ints.tensor().into_data().iter::<i64>().collect();
        assert_eq!(got, [1, 2, 3, 4]);
        let mut floats = InputBuffer::<1, Float>::zeros_dtype([3], &dev, DType::F32);
        floats.write(vec![0.5, 1.5, 2.5]);
        let got: Vec<f32> = floats.tensor().into_data().iter::<f32>().collect();
        assert_eq!(got, [0.5, 1.5, 2.5]);
        let mut rows = InputBuffer::<2, Int>::zeros([3, 2], &dev);
        rows.write(vec![1, 2, 3, 4, 5, 6]);
        rows.write_row(1, vec![7, 8]);
        let got: Vec<i64> = rows.tensor().into_data().iter::<i64>().collect();
        assert_eq!(got, [1, 2, 7, 8, 5, 6], "one row replaced, the others kept");
    }
}
