//! [`transposed`]: a weight matrix transposed on the host, before it is
//! uploaded, whatever its element type.
//!
//! GPT-2's Conv1D stores projection weights `[in, out]`; the decode kernels
//! read them out-major (`super::weights`). Transposing on the device would
//! mean an upload, a transpose kernel, a read back and a second upload of
//! every projection (GPT-2 XL: ~3 GB each way, with a device sync per
//! tensor). On the host it is one pass over the bytes: square tiles of
//! `TILE` x `TILE` elements (so both the reads and the writes stay in cache),
//! the output's row bands split over the rayon pool. The element is moved as
//! raw bytes, so f16 weights stay f16 (no conversion on the way).

use burn::tensor::TensorData;
use rayon::prelude::*;

/// Tile edge, in elements.
const TILE: usize = 64;

/// `data` (`[rows, cols]`, any element type) as `[cols, rows]`, row-major.
pub fn transposed(data: TensorData) -> TensorData {
    let shape = data.shape().to_vec();
    let [rows, cols] = shape[..] else {
        return data;
    };
    let dtype = data.dtype();
    let size = dtype.size();
    let src = data.as_bytes();
    let mut out = vec![0u8; src.len()];
    // Output row `c` (one input column) is `rows` elements long.
    out.par_chunks_mut(TILE * rows * size)
        .enumerate()
        .for_each(|(band, dst)| {
            let c0 = band * TILE;
            let c1 = (c0 + TILE).min(cols);
            for r0 in (0..rows).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    for c in c0..c1 {
                        let from = (r * cols + c) * size;
                        let to = ((c - c0) * rows + r) * size;
                        dst[to..to + size].copy_from_slice(&src[from..from + size]);
                    }
                }
            }
        });
    TensorData::from_bytes_vec(out, [cols, rows], dtype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_odd_shapes_of_f32_and_f16() {
        for (rows, cols) in [(1, 1), (3, 5), (70, 130), (129, 64)] {
            let values: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transposed(TensorData::new(values.clone(), [rows, cols]));
            assert_eq!(t.shape().to_vec(), [cols, rows]);
            let got: Vec<f32> = t.try_to_vec().unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(got[c * rows + r], values[r * cols + c], "f32 {rows}x{cols}");
                }
            }
            let halves: Vec<half::f16> = values.iter().map(|&v| half::f16::from_f32(v)).collect();
            let t = transposed(TensorData::new(halves.clone(), [rows, cols]));
            let got: Vec<half::f16> = t.try_to_vec().unwrap();
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(got[c * rows + r], halves[r * cols + c], "f16 {rows}x{cols}");
                }
            }
        }
    }
}
