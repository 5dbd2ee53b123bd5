//! A weight matrix made contiguous once, when it is loaded.
//!
//! CUDA allocations of 2-D tensors are pitched: a row whose bytes are not a
//! multiple of the allocator's alignment is padded (GPT-2 XL's 1,600-wide
//! f16 rows, 3,200 bytes, are; 768, 1,024 and 1,280 are not). Every Ember
//! kernel takes its tensor arguments contiguous
//! (`crate::ops::cuda::extension::contiguous`: a copy where they are not),
//! so a pitched weight was copied at every launch, inside every captured
//! step too: on an H200 that was 74 us of copies a layer and 0.32 ms for the
//! LM head in each XL decode step of ~6.1 ms (ncu, call 36). Settling the
//! weights at load makes that copy once.

use burn_cubecl::tensor::CubeTensor;

use crate::ops::cuda::extension::cuda_kernel;

cuda_kernel! {
    /// `weight` contiguous (the declaration's default for an argument: a
    /// copy only where it is not), for weights read at every step.
    #[fusion(dtype = weight, shape = weight)]
    pub fn Settle::settled(weight: Tensor<2>) -> Tensor<2>
}

/// `weight` as the declaration hands it over: already contiguous.
pub fn launch(weight: CubeTensor) -> CubeTensor {
    weight
}
