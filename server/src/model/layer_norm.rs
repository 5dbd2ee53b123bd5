//! LayerNorm computed in f32 whatever the backend's float type.
//!
//! GPT-2's residual stream has a few dimensions with magnitudes in the
//! thousands; in f16 the squared deviations overflow (65504 max) and the
//! variance becomes inf. So the statistics are computed in f32; the
//! normalized values (order 1) are cast back and scaled and shifted in the
//! model's dtype, so the f16 parameters are used as stored (no casts of
//! `gamma`/`beta` in every step). On an f32 backend the casts are no-ops.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;

/// `y = (x - mean) / sqrt(var + eps) * gamma + beta` over the last dimension
/// (biased variance, as PyTorch).
#[derive(Module, Debug)]
pub struct LayerNorm {
    /// Scale `[d_model]` (HF: `weight`).
    pub gamma: Param<Tensor<1>>,
    /// Shift `[d_model]` (HF: `bias`).
    pub beta: Param<Tensor<1>>,
    pub epsilon: f64,
}

impl LayerNorm {
    /// `[..., d_model]` -> `[..., d_model]`, same dtype as the input. On CUDA
    /// one kernel per call (`cuda_kernels::layer_norm_rows`).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        #[cfg(feature = "cuda")]
        if super::cuda_kernels::on_cube(&x) {
            let dims = x.dims();
            let e = dims[D - 1];
            let rows = dims.iter().product::<usize>() / e.max(1);
            let y = super::cuda_kernels::layer_norm_rows(
                x.reshape([rows, e]),
                self.gamma.val(),
                self.beta.val(),
                self.epsilon as f32,
            );
            return y.reshape(dims);
        }
        self.forward_reference(x)
    }

    /// The tensor-op LayerNorm (any backend): the CPU path and the reference
    /// the CUDA kernel is checked against.
    pub fn forward_reference<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let dtype = x.dtype();
        let x = x.cast(DType::F32);
        let mean = x.clone().mean_dim(D - 1);
        let centered = x - mean;
        let var = (centered.clone() * centered.clone()).mean_dim(D - 1);
        let normed = (centered / (var + self.epsilon).sqrt()).cast(dtype);
        normed * self.gamma.val().unsqueeze::<D>() + self.beta.val().unsqueeze::<D>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn normalizes_the_last_dimension() {
        let dev = Device::flex();
        let ln = LayerNorm {
            gamma: Param::from_tensor(Tensor::ones([4], &dev)),
            beta: Param::from_tensor(Tensor::from_data([0.0, 0.0, 0.0, 1.0], &dev)),
            epsilon: 1e-5,
        };
        let x = Tensor::<2>::from_data(
            TensorData::new(
                vec![1.0f32, 2.0, 3.0, 4.0, 3000.0, -3000.0, 0.0, 0.0],
                [2, 4],
            ),
            &dev,
        );
        let y: Vec<f32> = ln.forward(x).into_data().iter::<f32>().collect();
        // Row 0: mean 2.5, biased var 1.25.
        let s = 1.25f32.sqrt();
        let expected = [-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s + 1.0];
        for (a, b) in y[..4].iter().zip(expected) {
            assert!((a - b).abs() < 1e-5, "{y:?}");
        }
        assert!(y.iter().all(|v| v.is_finite()));
    }
}
