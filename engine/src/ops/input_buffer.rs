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
    /// The contents last written by [`InputBuffer::write_changed`] (`None`
    /// after any other write): what lets it skip an identical upload.
    last: Option<Vec<i32>>,
}

impl<const D: usize, K: Basic> InputBuffer<D, K> {
    /// A zero-filled buffer in the device's default dtype for `K`.
    pub fn zeros(shape: [usize; D], device: &Device) -> Self {
        Self {
            tensor: Tensor::zeros(shape, device),
            shape,
            last: None,
        }
    }

    /// A zero-filled buffer of the given dtype.
    pub fn zeros_dtype(shape: [usize; D], device: &Device, dtype: DType) -> Self {
        Self {
            tensor: Tensor::zeros(shape, (device, dtype)),
            shape,
            last: None,
        }
    }

    /// The buffer as a tensor (a handle to the same device memory).
    pub fn tensor(&self) -> Tensor<D, K> {
        self.tensor.clone()
    }

    /// A fresh tensor with `data`, replacing the old one (when no in-place
    /// write was possible).
    fn replace(&mut self, data: TensorData) {
        #[cfg(feature = "cuda")]
        if super::cuda::is_cube_device(&self.tensor.device()) {
            // A captured graph keeps reading the old tensor's memory.
            tracing::warn!(
                shape = ?self.shape,
                "a CUDA input buffer was replaced, not written in place: graphs reading it replay stale values"
            );
        }
        let dtype = self.tensor.dtype();
        self.tensor = Tensor::from_data(data, (&self.tensor.device(), dtype));
    }
}

impl<const D: usize> InputBuffer<D, Int> {
    /// Replaces the contents with `values` (row-major, exactly the buffer's size).
    pub fn write(&mut self, values: Vec<i32>) {
        debug_assert_eq!(values.len(), self.shape.iter().product::<usize>());
        self.last = None;
        let data = TensorData::new(values, self.shape);
        #[cfg(feature = "cuda")]
        if super::cuda::inplace::write_int(&self.tensor, &data) {
            return;
        }
        self.replace(data);
    }

    /// [`InputBuffer::write`], skipped where `values` equal what the last
    /// call wrote (and nothing has written the buffer since): each upload
    /// costs the host a staged copy and a driver call (~10 us on an H200's
    /// host), and a prefill step's offsets, starts and tiles repeat from one
    /// step of a shape to the next. Returns whether it uploaded.
    pub fn write_changed(&mut self, values: Vec<i32>) -> bool {
        if self.last.as_ref() == Some(&values) {
            return false;
        }
        self.write(values.clone());
        self.last = Some(values);
        true
    }

    /// A zero-filled buffer whose memory exists now, written from the host
    /// (`zeros` alone may leave the fill pending: a CUDA graph captured
    /// before the first write would record the fill and clear the buffer on
    /// every replay).
    pub fn resident_zeros(shape: [usize; D], device: &Device) -> Self {
        let mut buffer = Self::zeros(shape, device);
        buffer.write(vec![0; shape.iter().product()]);
        buffer
    }
}

impl InputBuffer<2, Int> {
    /// Replaces rows `rows` with `values` (`rows.len()` rows, row-major),
    /// leaving the other rows as they are (on CUDA one small upload and one
    /// launch into the buffer's own memory).
    pub fn write_rows(&mut self, rows: &[usize], values: Vec<i32>) {
        let [n, width] = self.shape;
        debug_assert!(rows.iter().all(|&r| r < n) && values.len() == rows.len() * width);
        if rows.is_empty() {
            return;
        }
        self.last = None;
        let device = self.tensor.device();
        #[cfg(feature = "cuda")]
        if super::cuda::is_cube_device(&device) {
            let index: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
            super::cuda::inplace::write_int_rows(&self.tensor, &index, values);
            return;
        }
        let dtype = self.tensor.dtype();
        for (k, &row) in rows.iter().enumerate() {
            let data = TensorData::new(values[k * width..(k + 1) * width].to_vec(), [1, width]);
            let fresh = Tensor::<2, Int>::from_data(data, (&device, dtype));
            self.tensor = self
                .tensor
                .clone()
                .slice_assign([row..row + 1, 0..width], fresh);
        }
    }

    /// Replaces the first `n` rows with `values` (`[n, W]`, a device
    /// tensor: a step's result kept for the next step), leaving the other
    /// rows as they are; `leading` is `0..n` as a tensor (on CUDA one launch
    /// into the buffer's own memory, which reads it).
    pub fn write_leading_rows(&mut self, values: Tensor<2, Int>, leading: Tensor<1, Int>) {
        let [n, width] = values.dims();
        debug_assert!(n <= self.shape[0] && width == self.shape[1]);
        self.last = None;
        #[cfg(feature = "cuda")]
        if super::cuda::is_cube_device(&self.tensor.device()) {
            super::cuda::inplace::write_int_rows_from(&self.tensor, leading, values);
            return;
        }
        let _ = leading;
        self.tensor = self.tensor.clone().slice_assign([0..n, 0..width], values);
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
        rows.write_rows(&[1], vec![7, 8]);
        let got: Vec<i64> = rows.tensor().into_data().iter::<i64>().collect();
        assert_eq!(got, [1, 2, 7, 8, 5, 6], "one row replaced, the others kept");
        let values = Tensor::<2, Int>::from_data(TensorData::new(vec![9i32, 9], [1, 2]), &dev);
        rows.write_leading_rows(values, Tensor::arange(0..1, &dev));
        let got: Vec<i64> = rows.tensor().into_data().iter::<i64>().collect();
        assert_eq!(got, [9, 9, 7, 8, 5, 6], "the leading row replaced");
    }

    #[test]
    fn write_changed_skips_only_what_it_wrote_itself() {
        let dev = Device::flex();
        let read = |b: &InputBuffer<2, Int>| -> Vec<i64> {
            b.tensor().into_data().iter::<i64>().collect()
        };
        let mut rows = InputBuffer::<2, Int>::zeros([2, 2], &dev);
        assert!(rows.write_changed(vec![1, 2, 3, 4]));
        assert!(
            !rows.write_changed(vec![1, 2, 3, 4]),
            "the same values again: skipped"
        );
        rows.write_rows(&[0], vec![7, 8]);
        assert!(
            rows.write_changed(vec![1, 2, 3, 4]),
            "another write came between: uploaded"
        );
        assert_eq!(read(&rows), [1, 2, 3, 4]);
        rows.write(vec![0, 0, 0, 0]);
        assert!(
            rows.write_changed(vec![1, 2, 3, 4]),
            "after a plain write: uploaded"
        );
        assert!(rows.write_changed(vec![1, 2, 3, 5]));
        assert_eq!(read(&rows), [1, 2, 3, 5]);
    }
}
