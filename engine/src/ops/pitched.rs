//! Device tensors whose rows are pitched: the host buffer an in-place write
//! into such a tensor's memory must send (`super::cuda::inplace`), and a
//! weight matrix made contiguous once ([`settled`]).

use burn::prelude::*;

/// `tensor` as the kernels read it every step: a matrix on CUDA made
/// contiguous once (`super::cuda::settled`: CUDA pitches 2-D rows that are
/// not a multiple of its alignment, and a kernel argument that is not
/// contiguous is copied at every launch); anything else as it is.
pub fn settled<const D: usize>(tensor: Tensor<D>) -> Tensor<D> {
    #[cfg(feature = "cuda")]
    if D == 2 && super::cuda::is_cube_device(&tensor.device()) {
        let dims = tensor.dims();
        let matrix: Tensor<2> = tensor.reshape([dims[0], dims[1]]);
        return super::cuda::settled(matrix).reshape(dims);
    }
    tensor
}

/// `bytes` (row-major over `shape`, elements of `elem` bytes) laid out at
/// `strides` (in elements), the gaps zero: what a device tensor whose rows
/// are pitched holds. CUDA pitches the rows of a 2-D tensor to an alignment
/// (a `[n, 2]` int tensor's 8-byte rows get a 16-byte stride), so a write
/// into its memory must skip the padding, not assume the rows touch.
pub fn pitched_bytes(bytes: &[u8], shape: &[usize], strides: &[usize], elem: usize) -> Vec<u8> {
    let span = shape
        .iter()
        .zip(strides)
        .map(|(&n, &s)| n.saturating_sub(1) * s)
        .sum::<usize>()
        + 1;
    let mut out = vec![0u8; span * elem];
    for (i, value) in bytes.chunks_exact(elem).enumerate() {
        let (mut rest, mut at) = (i, 0);
        for (&n, &s) in shape.iter().zip(strides).rev() {
            at += rest % n * s;
            rest /= n;
        }
        out[at * elem..(at + 1) * elem].copy_from_slice(value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitched_rows_skip_their_padding() {
        // Three rows of two u16s, pitched to a stride of four elements.
        let bytes: Vec<u8> = (1u8..=12).collect();
        let out = pitched_bytes(&bytes, &[3, 2], &[4, 1], 2);
        #[rustfmt::skip]
        assert_eq!(out, [1, 2, 3, 4, 0, 0, 0, 0,   5, 6, 7, 8, 0, 0, 0, 0,   9, 10, 11, 12]);
        // Contiguous strides give the bytes back.
        assert_eq!(pitched_bytes(&bytes, &[3, 2], &[2, 1], 2), bytes);
        assert_eq!(pitched_bytes(&bytes[..4], &[2], &[1], 2), &bytes[..4]);
    }
}
