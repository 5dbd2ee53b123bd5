//! GPT-2's feed-forward: `c_proj(gelu_tanh(c_fc(x)))`, 4x wide.
//!
//! GPT-2 uses the tanh approximation of GELU (`gelu_new` in transformers),
//! written out with `x * x * x` rather than Burn's `gelu_approximate`, whose
//! `powf` makes it several times slower on the CPU.

use burn::prelude::*;

use super::linear::{Epilogue, Linear};

/// GPT-2 MLP.
#[derive(Module, Debug)]
pub struct Mlp {
    /// `[E, 4E]`.
    pub c_fc: Linear,
    /// `[4E, E]`.
    pub c_proj: Linear,
}

impl Mlp {
    /// `residual + mlp(x)`: `[B, Q, E]` -> `[B, Q, E]` (GELU and the
    /// residual add ride in the projections' epilogues).
    pub fn forward(&self, x: Tensor<3>, residual: Tensor<3>) -> Tensor<3> {
        let gelu = Epilogue {
            gelu: true,
            residual: None,
        };
        let add = Epilogue {
            gelu: false,
            residual: Some(residual),
        };
        self.c_proj
            .forward_with(self.c_fc.forward_with(x, gelu), add)
    }
}

/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    let cube = x.clone() * x.clone() * x.clone();
    let inner = (x.clone() + cube * 0.044715) * SQRT_2_OVER_PI;
    x * (inner.tanh() + 1.0) * 0.5
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::gelu_approximate;

    #[test]
    fn matches_burns_gelu_approximate() {
        let dev = Device::flex();
        let x = Tensor::<1>::from_data([-6.0f32, -2.5, -0.3, 0.0, 0.7, 3.0, 9.0], &dev);
        let a: Vec<f32> = gelu_tanh(x.clone()).into_data().iter::<f32>().collect();
        let b: Vec<f32> = gelu_approximate(x).into_data().iter::<f32>().collect();
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }
}
