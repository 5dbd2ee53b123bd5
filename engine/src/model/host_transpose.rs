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
//! (no conversion) and the copy compiles to plain 2- or 4-byte moves. The
//! output is written into uninitialized memory ([`written`]): zeroing it
//! first would be one more pass on one thread.

use std::mem::MaybeUninit;

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
    // Exactly the matrix (a shorter `src` panics here): `written` below
    // relies on `transpose_into` covering every element of `len` bytes.
    let len = rows * cols * size;
    let src = &src[..len];
    // Elements as byte arrays: alignment 1, so any offset of the map works.
    use bytemuck::cast_slice as c;
    // Safety (each): `transpose_into` writes all `rows * cols` elements of
    // `size` bytes, i.e. `len` bytes.
    let out = match size {
        1 => unsafe { written(len, |d| transpose_into::<u8>(src, d, rows, cols)) },
        2 => unsafe { written(len, |d| transpose_into::<[u8; 2]>(c(src), d, rows, cols)) },
        4 => unsafe { written(len, |d| transpose_into::<[u8; 4]>(c(src), d, rows, cols)) },
        8 => unsafe { written(len, |d| transpose_into::<[u8; 8]>(c(src), d, rows, cols)) },
        // No such float dtype: element by element, into zeros.
        _ => {
            let mut out = vec![0u8; len];
            for (j, dst) in out.chunks_exact_mut(size.max(1)).enumerate() {
                let from = ((j % rows) * cols + j / rows) * size;
                dst.copy_from_slice(&src[from..from + size]);
            }
            out
        }
    };
    TensorData::from_bytes_vec(out, [cols, rows], dtype)
}

/// Transposes the `[rows, cols]` elements of `src` into `dst` (see the
/// module docs), writing every element of `dst` (`rows * cols` long) once.
fn transpose_into<T: Copy + Send + Sync>(
    src: &[T],
    dst: &mut [MaybeUninit<T>],
    rows: usize,
    cols: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    // Each band is `width` whole output rows of `rows` elements, and writes
    // each of them at every `r`: together, every element of `dst`.
    dst.par_chunks_mut(BAND * rows)
        .enumerate()
        .for_each(|(band, out)| {
            let c0 = band * BAND;
            let width = out.len() / rows;
            for r in 0..rows {
                let row = &src[r * cols + c0..r * cols + c0 + width];
                for (i, &v) in row.iter().enumerate() {
                    out[i * rows + r].write(v);
                }
            }
        });
}

/// `len` bytes written by `fill` as `T`s (a byte, or an array of bytes),
/// never zeroed first: a zeroed buffer is one more pass over the bytes on
/// one thread (an allocator reusing freed memory must clear it), where
/// `fill` writes them once over the rayon pool.
///
/// # Safety
///
/// `fill` must write every element of the slice it is given.
unsafe fn written<T: Copy>(len: usize, fill: impl FnOnce(&mut [MaybeUninit<T>])) -> Vec<u8> {
    const { assert!(std::mem::align_of::<T>() == 1) };
    let n = len / std::mem::size_of::<T>().max(1);
    let mut out = Vec::<u8>::with_capacity(len);
    // Safety: the capacity holds `len` bytes, that is `n` `T`s of alignment
    // 1, and uninitialized slots are what `MaybeUninit` describes.
    let slots =
        unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<MaybeUninit<T>>(), n) };
    fill(slots);
    // Safety: `fill` wrote all `n * size_of::<T>() = len` bytes (the
    // caller's contract; `len` is a whole number of `T`s).
    unsafe { out.set_len(n * std::mem::size_of::<T>()) };
    out
}

/// A copy of `src`, made in chunks of [`COPY_CHUNK`] over the rayon pool
/// (from a memory-mapped file, each task also takes its own page faults).
pub fn copied(src: &[u8]) -> Vec<u8> {
    let fill = |dst: &mut [MaybeUninit<u8>]| {
        dst.par_chunks_mut(COPY_CHUNK)
            .zip(src.par_chunks(COPY_CHUNK))
            .for_each(|(dst, src)| {
                for (d, &s) in dst.iter_mut().zip(src) {
                    d.write(s);
                }
            });
    };
    // Safety: the chunks of `dst` and `src` pair up one for one, of equal
    // lengths, so every byte is written.
    unsafe { written(src.len(), fill) }
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
        // Every element size, against the definition.
        let bytes: Vec<u8> = (0..rows * cols * 8).map(|i| (i * 7 + 3) as u8).collect();
        for dtype in [DType::U8, DType::F16, DType::F32, DType::F64] {
            let size = dtype.size();
            let src = &bytes[..rows * cols * size];
            let t = transposed_bytes(src, rows, cols, dtype);
            let got = t.as_bytes();
            for r in 0..rows {
                for c in 0..cols {
                    let (to, from) = ((c * rows + r) * size, (r * cols + c) * size);
                    assert_eq!(got[to..to + size], src[from..from + size], "{dtype:?}");
                }
            }
        }
        let big: Vec<u8> = (0..3 * COPY_CHUNK + 7).map(|i| (i * 31) as u8).collect();
        assert_eq!(copied(&big[3..]), big[3..]);
        assert!(copied(&[]).is_empty());
    }
}
