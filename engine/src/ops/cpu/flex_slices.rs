//! Raw access to Flex (CPU) tensors for the hand-written CPU kernels
//! ([`super::paged_attention`]) and their vector loops.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::prelude::*;
use burn::tensor::kind::Basic;

/// The tensor's Flex storage, made dense (row-major from offset 0) if it is
/// not; `None` when the tensor lives on another backend.
pub fn dense<const D: usize, K>(t: &Tensor<D, K>) -> Option<FlexTensor>
where
    K: Basic + burn::tensor::BackendPrimitive<Flex, Primitive = FlexTensor>,
{
    let t = t.clone().try_into_primitive::<Flex>().ok()?;
    Some(if t.is_contiguous() && t.layout().start_offset() == 0 {
        t
    } else {
        t.to_contiguous()
    })
}

/// The elements of a dense tensor.
pub fn values<E: burn::tensor::Element + bytemuck::Pod>(t: &FlexTensor) -> &[E] {
    let n = t.layout().shape().num_elements();
    &t.storage::<E>()[..n]
}

/// The values of a small int tensor on Flex, as `i32` (`None` elsewhere or
/// in another int dtype).
pub fn int_values<const D: usize>(t: &Tensor<D, Int>) -> Option<Vec<i32>> {
    let t = dense(t)?;
    (t.dtype() == burn::tensor::DType::I32).then(|| values::<i32>(&t).to_vec())
}

/// `a . b` with eight independent accumulators (vectorizes; inlined into
/// the kernels' `#[target_feature]` entry points).
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((a, &xi), &yi) in acc.iter_mut().zip(x).zip(y) {
            *a += xi * yi;
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `out += alpha * x` (inlined as [`dot`]).
#[inline(always)]
pub fn axpy(alpha: f32, x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o += alpha * v;
    }
}
