//! Moving weight bytes on the host before they are uploaded, whatever their
//! element type: [`transposed_bytes`] (a matrix transposed) and [`copied`]
//! (a plain copy), both over the rayon pool.
//!
//! GPT-2's Conv1D stores projection weights `[in, out]`; the decode kernels
//! read them out-major (`super::weights`). Transposing on the device would
//! mean an upload, a transpose kernel, a read back and a second upload of
//! every projection (GPT-2 XL: ~3 GB each way, with a device sync per
//! tensor). On the host it is one pass over the bytes, read straight from
//! the memory-mapped checkpoint (`super::checkpoint`): the output is split
//! into bands of [`BAND`] output rows (input columns), one rayon task each;
//! a band reads its columns of each input row (one cache line of f16) and
//! writes one element into each of its output rows, so both sides stay in
//! cache. Elements move as fixed-size byte arrays, so f16 weights stay f16
//! (no conversion) and the copy compiles to plain 2- or 4-byte moves.

use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

/// Output rows (input columns) per rayon task.
const BAND: usize = 32;

/// Bytes per task of [`copied`].
const COPY_CHUNK: usize = 1 << 20;

/// `data` (`[rows, cols]`, any element type) as `[cols, rows]`, row-major.
pub fn transposed(data: TensorData) -> TensorData {
    let shape = data.shape().to_vec();
    let [rows, cols] = shape[..] else {
        return data;
    };
    transposed_bytes(data.as_bytes(), rows, cols, data.dtype())
}

/// The `[rows, cols]` matrix of `dtype` elements in `src` (little-endian,
/// row-major, any alignment) as data of shape `[cols, rows]`.
pub fn transposed_bytes(src: &[u8], rows: usize, cols: usize, dtype: DType) -> TensorData {
    let size = dtype.size();
    debug_assert_eq!(
        src.len(),
        rows * cols * size,
        "a [{rows}, {cols}] {dtype:?} matrix"
    );
    let mut out = vec![0u8; src.len()];
    // Elements as byte arrays: alignment 1, so any offset of the map works.
    use bytemuck::{cast_slice as c, cast_slice_mut as m};
    match size {
        2 => transpose_into::<[u8; 2]>(c(src), m(&mut out), rows, cols),
        4 => transpose_into::<[u8; 4]>(c(src), m(&mut out), rows, cols),
        8 => transpose_into::<[u8; 8]>(c(src), m(&mut out), rows, cols),
        // The rest are 1-byte dtypes.
        _ => transpose_into::<u8>(src, &mut out, rows, cols),
    }
    TensorData::from_bytes_vec(out, [cols, rows], dtype)
}

/// Transposes the `[rows, cols]` elements of `src` into `dst` (see the
/// module docs).
fn transpose_into<T: Copy + Send + Sync>(src: &[T], dst: &mut [T], rows: usize, cols: usize) {
    if rows == 0 || cols == 0 {
        return;
    }
    dst.par_chunks_mut(BAND * rows)
        .enumerate()
        .for_each(|(band, out)| {
            let c0 = band * BAND;
            let width = out.len() / rows;
            for r in 0..rows {
                let row = &src[r * cols + c0..r * cols + c0 + width];
                for (i, &v) in row.iter().enumerate() {
                    out[i * rows + r] = v;
                }
            }
        });
}

/// A copy of `src`, made in chunks of [`COPY_CHUNK`] over the rayon pool
/// (from a memory-mapped file, each task also takes its own page faults).
pub fn copied(src: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; src.len()];
    out.par_chunks_mut(COPY_CHUNK)
        .zip(src.par_chunks(COPY_CHUNK))
        .for_each(|(dst, src)| dst.copy_from_slice(src));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_odd_shapes_of_f32_and_f16() {
        for (rows, cols) in [(1, 1), (3, 5), (70, 130), (129, 64), (5, 33)] {
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

    #[test]
    fn transposes_from_unaligned_bytes_and_copies_exactly() {
        // Safetensors data may sit at any offset of the map: an f32 matrix
        // one byte into a buffer is read all the same.
        let (rows, cols) = (37, 45);
        let values: Vec<f32> = (0..rows * cols).map(|i| i as f32 * 0.5).collect();
        let mut buffer = vec![0u8];
        buffer.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        let t = transposed_bytes(&buffer[1..], rows, cols, DType::F32);
        let got: Vec<f32> = t.try_to_vec().unwrap();
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(got[c * rows + r], values[r * cols + c]);
            }
        }
        let big: Vec<u8> = (0..3 * COPY_CHUNK + 7).map(|i| (i * 31) as u8).collect();
        assert_eq!(copied(&big[3..]), big[3..]);
        assert!(copied(&[]).is_empty());
    }
}
