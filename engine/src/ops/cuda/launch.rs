//! Helpers the kernel launches share: output allocation (contiguous, zeroed
//! or not), vector widths, the stand-in for an absent operand, and the
//! projections' shared declaration (`projection_kernel!`) and output shape.

use burn::prelude::*;
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
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

/// A new contiguous tensor of `shape` on `like`'s device, in its dtype,
/// zeroed: filled as one flat run and viewed with `shape` (a zeroed 2-D
/// tensor is pitched where its rows are not a multiple of CUDA's alignment,
/// XL's 1,600 f16, and the next kernel would copy it).
pub fn zeros_contiguous<const D: usize>(like: &CubeTensor, shape: [usize; D]) -> CubeTensor {
    let flat = zeros_client(
        like.client.clone(),
        like.device.clone(),
        Shape::new([shape.iter().product::<usize>()]),
        like.dtype,
    );
    CubeTensor::new_contiguous(
        flat.client,
        flat.device,
        Shape::new(shape),
        flat.handle,
        flat.dtype,
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

/// An optional operand as a kernel argument: the tensor and `true`, or
/// `stand_in` (unread) and `false` when absent (a `#[cube]` kernel takes
/// every tensor, and a comptime flag says whether to read it).
pub fn or_stand_in(operand: Option<CubeTensor>, stand_in: &CubeTensor) -> (CubeTensor, bool) {
    match operand {
        Some(tensor) => (tensor, true),
        None => (stand_in.clone(), false),
    }
}

/// The output shape of a projection of `x` `[B, K]` by the out-major `w`
/// `[N, K]`: `[B, N]` (the `#[fusion]` metadata of the projection kernels).
pub fn projection_shape(x: &Shape, w: &Shape) -> Shape {
    let [b, _] = x.dims::<2>();
    let [n, _] = w.dims::<2>();
    Shape::new([b, n])
}

/// A projection's operands as its launch gets them: `x` `[B, K]` times the
/// out-major weight `w` `[N, K]` transposed, plus `bias` `[N]`, through
/// tanh-GELU when `gelu`, plus `residual` `[B, N]`; all contiguous. The
/// GEMV, the tensor-core kernel and cuBLASLt take the same operands
/// (`projection_kernel!`).
pub struct Projection {
    /// `[B, K]`.
    pub x: CubeTensor,
    /// `[N, K]`, out-major.
    pub w: CubeTensor,
    /// `[N]`, where the projection has a bias.
    pub bias: Option<CubeTensor>,
    /// `[B, N]`, added last, where there is one.
    pub residual: Option<CubeTensor>,
    /// Whether tanh-GELU follows the bias.
    pub gelu: bool,
}

/// Declares a projection kernel with `cuda_kernel!`
/// (`crate::ops::cuda::extension`): the operands the three projections
/// share, which their launches get as one [`Projection`], then the
/// kernel's own plain values (in the parentheses), passed after it.
macro_rules! projection_kernel {
    ($(#[doc = $doc:tt])* pub fn $tr:ident :: $name:ident ($($own:ident : $t:ident),* $(,)?)) => {
        $crate::ops::cuda::extension::cuda_kernel! {
            /// `x` `[B, K]` times the out-major weight `w` `[N, K]`
            /// transposed, plus `bias` `[N]`, through tanh-GELU when `gelu`,
            /// plus `residual` `[B, N]`. Returns `[B, N]`.
            ///
            $(#[doc = $doc])*
            #[fusion(dtype = x, shape = $crate::ops::cuda::launch::projection_shape(x, w))]
            #[launch(launch(
                $crate::ops::cuda::launch::Projection { x, w, bias, residual, gelu }
                $(, $own)*
            ))]
            pub fn $tr::$name(
                x: Tensor<2>,
                w: Tensor<2>,
                #[optional(flag = has_bias, stand_in = w)] bias: Option<Tensor<1>>,
                #[optional(flag = has_residual, stand_in = w)] residual: Option<Tensor<2>>,
                gelu: bool,
                $($own: $t,)*
            ) -> Tensor<2>
        }
    };
}
pub(crate) use projection_kernel;
