//! How one projection's work is cut into rayon tasks: contiguous ranges of
//! output features (weight rows), each a [`Block`] that a kernel runs on its
//! own, writing only its own columns of the shared output.
//!
//! Both kernels ([`super::tile`] for f32 lanes, [`super::dot_bf16`] for
//! native bf16 products) run on these blocks; [`for_each_block`] does the
//! fork (or none, for a call too small to be worth one).

use rayon::prelude::*;

/// Below this many multiply-adds a call runs on the calling thread: a rayon
/// fork costs more than the work.
const SERIAL_MACS: usize = 1 << 16;

/// Tasks per rayon thread, so that a slow thread does not hold up the call.
const TASKS_PER_THREAD: usize = 4;

/// Weight rows of a task are a multiple of this (whole tiles of every
/// kernel: 4 rows on the tiled paths, 16 on the native bf16 stream).
const ROW_QUANTUM: usize = 16;

/// One block of work: `n` weight rows (of `k`) against all `m` rows of `x`,
/// written to columns `col .. col + n` of the `[m, ldo]` output. `X` and `W`
/// are the element types of the activations and the weights.
#[derive(Clone, Copy)]
pub struct Block<'a, X, W> {
    /// `[m, k]`, row-major.
    pub x: &'a [X],
    pub m: usize,
    pub k: usize,
    /// The block's weight rows, `[n, k]`.
    pub w: &'a [W],
    pub n: usize,
    /// First output column of the block.
    pub col: usize,
    /// Row stride of the output.
    pub ldo: usize,
}

/// The output pointer, shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: tasks only write disjoint columns through it (see `for_each_block`).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `kernel` on every block of `x` `[m, k]` against `w` `[n, k]` and
/// returns the `[m, n]` output it wrote, blocks in parallel on the rayon pool
/// (or all on this thread for a small call).
///
/// # Safety
/// `kernel(block, out)` must write nothing but columns `block.col ..
/// block.col + block.n` of the first `m` rows of the `[m, n]` output at
/// `out` (row stride `n`), and may assume that the block's slices hold
/// their shapes.
///
/// # Panics
/// If `x` or `w` is shorter than its shape says.
pub unsafe fn for_each_block<X: Sync, W: Sync>(
    x: &[X],
    m: usize,
    k: usize,
    w: &[W],
    n: usize,
    kernel: impl Fn(Block<'_, X, W>, *mut f32) + Sync,
) -> Vec<f32> {
    assert!(
        x.len() >= m * k && w.len() >= n * k,
        "gemv: operand too short"
    );
    let mut out = vec![0.0f32; m * n];
    let out_ptr = SharedOut(out.as_mut_ptr());
    let rows = rows_per_task(m, n, k);
    let task = |first: usize| {
        let n_rows = rows.min(n - first);
        let block = Block {
            x,
            m,
            k,
            w: &w[first * k..(first + n_rows) * k],
            n: n_rows,
            col: first,
            ldo: n,
        };
        kernel(block, out_ptr.get());
    };
    if m * n * k < SERIAL_MACS {
        (0..n).step_by(rows).for_each(task);
    } else {
        (0..n).into_par_iter().step_by(rows).for_each(task);
    }
    out
}

/// Weight rows per task: about [`TASKS_PER_THREAD`] tasks per rayon thread,
/// whole multiples of [`ROW_QUANTUM`].
fn rows_per_task(m: usize, n: usize, k: usize) -> usize {
    if m * n * k < SERIAL_MACS {
        return n.max(1);
    }
    let tasks = rayon::current_num_threads() * TASKS_PER_THREAD;
    n.div_ceil(tasks)
        .next_multiple_of(ROW_QUANTUM)
        .max(ROW_QUANTUM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_calls_split_into_whole_tiles_and_small_ones_stay_on_one_thread() {
        assert_eq!(rows_per_task(1, 8, 8), 8);
        let rows = rows_per_task(1, 50_257, 768);
        assert_eq!(rows % ROW_QUANTUM, 0);
        assert!(rows * rayon::current_num_threads() * TASKS_PER_THREAD >= 50_257);
    }

    #[test]
    fn every_column_is_written_once_by_the_block_that_owns_it() {
        let (m, k, n) = (3, 64, 1000);
        let (x, w) = (vec![0u8; m * k], vec![0u8; n * k]);
        // SAFETY: the kernel writes only its block's columns.
        let out = unsafe {
            for_each_block(&x, m, k, &w, n, |b, out| {
                assert_eq!(b.w.len(), b.n * k);
                for i in 0..b.m {
                    for j in b.col..b.col + b.n {
                        *out.add(i * b.ldo + j) += (j + 1) as f32;
                    }
                }
            })
        };
        for i in 0..m {
            for j in 0..n {
                assert_eq!(out[i * n + j], (j + 1) as f32);
            }
        }
    }
}
