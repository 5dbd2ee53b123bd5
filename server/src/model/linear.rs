//! A linear layer whose weight layout depends on the device.
//!
//! GPT-2 stores its projections `[in, out]` (Conv1D), which is what the CPU
//! path uses (Flex's gemm reads it as is). On CUDA the weight is stored
//! out-major, `[out, in]` (PyTorch's `nn.Linear` layout), so that decode
//! steps, whose few rows make a matmul a matrix-vector product, can go through
//! `cuda_kernels::decode_linear`: the GEMV (warps stream contiguous weight
//! rows) below 16 rows, the tensor-core kernel from 16 to
//! `EMBER_GEMV_MAX_ROWS`; larger batches (prefill) use the general matmul on
//! the transposed view, which CubeCL's matmul reads without a copy.

use burn::module::Param;
use burn::prelude::*;

/// `y = x W + b` over the last dimension.
#[derive(Module, Debug)]
pub struct Linear {
    /// `[d_in, d_out]`, or `[d_out, d_in]` when `out_major`.
    pub weight: Param<Tensor<2>>,
    /// `[d_out]`.
    pub bias: Option<Param<Tensor<1>>>,
    pub out_major: bool,
}

/// What a projection does to its result: tanh-GELU, then a residual add.
/// On CUDA at decode-sized batches this happens inside the GEMV kernel.
#[derive(Debug, Clone)]
pub struct Epilogue<const D: usize> {
    pub gelu: bool,
    /// Same shape as the output.
    pub residual: Option<Tensor<D>>,
}

impl<const D: usize> Epilogue<D> {
    /// Nothing after the bias.
    pub fn none() -> Self {
        Self {
            gelu: false,
            residual: None,
        }
    }
}

impl Linear {
    /// `[..., d_in]` -> `[..., d_out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward_with(x, Epilogue::none())
    }

    /// [`Linear::forward`], then `epilogue`.
    pub fn forward_with<const D: usize>(&self, x: Tensor<D>, epilogue: Epilogue<D>) -> Tensor<D> {
        let w = self.weight.val();
        #[cfg(feature = "cuda")]
        if self.out_major {
            use super::cuda_kernels::{decode_linear, gemv_max_rows, on_cube, GemvEpilogue};
            let dims = x.dims();
            let rows: usize = dims[..D - 1].iter().product();
            if rows <= gemv_max_rows() && on_cube(&x) {
                let d_out = w.dims()[0];
                let bias = self.bias.as_ref().map(|b| b.val());
                let fused = GemvEpilogue {
                    gelu: epilogue.gelu,
                    residual: epilogue.residual.map(|r| r.reshape([rows, d_out])),
                };
                let y = decode_linear(x.reshape([rows, dims[D - 1]]), &w, bias.as_ref(), fused);
                let mut out = dims;
                out[D - 1] = d_out;
                return y.reshape(out);
            }
        }
        let w = if self.out_major { w.transpose() } else { w };
        let mut y = x.matmul(w.unsqueeze());
        if let Some(b) = &self.bias {
            y = y + b.val().unsqueeze();
        }
        if epilogue.gelu {
            y = super::mlp::gelu_tanh(y);
        }
        match epilogue.residual {
            Some(r) => r + y,
            None => y,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_compute_the_same_product() {
        let dev = Device::flex();
        let w = Tensor::<2>::from_data([[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]], &dev); // [in 2, out 3]
        let b = Tensor::<1>::from_data([0.5f32, -1.0, 2.0], &dev);
        let x = Tensor::<3>::from_data([[[1.0f32, 1.0]], [[2.0, -1.0]]], &dev); // [2, 1, 2]
        let in_major = Linear {
            weight: Param::from_tensor(w.clone()),
            bias: Some(Param::from_tensor(b.clone())),
            out_major: false,
        };
        let out_major = Linear {
            weight: Param::from_tensor(w.transpose()),
            bias: Some(Param::from_tensor(b)),
            out_major: true,
        };
        let a: Vec<f32> = in_major
            .forward(x.clone())
            .into_data()
            .iter::<f32>()
            .collect();
        let c: Vec<f32> = out_major.forward(x).into_data().iter::<f32>().collect();
        assert_eq!(a, [5.5, 6.0, 11.0, -1.5, -2.0, 2.0]);
        assert_eq!(a, c);
    }
}
