//! The machine's streaming-read bandwidth, measured the way a decode step
//! reads its weights: every thread of the rayon pool (the pool the engine's
//! CPU kernels run on) sums its own contiguous part of one large buffer with
//! the widest vector loads the CPU has, so the figure is what the weight
//! stream could reach at best.
//!
//! The buffer (`--membw-mib`, default in `run_cpu.sh`: 1024 MiB) is many
//! times the last-level cache, starts on a cache line (as Flex's tensors
//! do, so no 64-byte load straddles two lines), is written once first (so
//! every page exists), and is then read `reps` times; each read is timed as
//! a whole (fork to join). The loop keeps eight vectors in flight, as the
//! `gemm` crate's and Ember's matrix-vector loops do. Best and median GB/s
//! (1e9 bytes per second) are reported; the weight-read floor of a decode
//! step is its weight bytes over the best.

use std::time::Instant;

use rayon::prelude::*;
use serde_json::json;

/// Reads of the whole buffer, each timed.
const REPS: usize = 10;

/// Measures read bandwidth over a buffer of `mib` MiB; prints one line and
/// returns `{"buffer_mib", "threads", "reps", "best_gb_s", "median_gb_s"}`.
pub fn measure(mib: usize) -> serde_json::Value {
    let len = mib * (1 << 20) / 4;
    let mut storage = vec![0.0f32; len + 16];
    let skip = storage.as_ptr().align_offset(64).min(16);
    let buf = &mut storage[skip..skip + len];
    buf.par_chunks_mut(1 << 16)
        .enumerate()
        .for_each(|(i, c)| c.fill(i as f32));
    let threads = rayon::current_num_threads();
    let part = len.div_ceil(threads).max(1);
    let mut gb_s = Vec::with_capacity(REPS);
    let mut checksum = 0.0f32;
    for _ in 0..REPS {
        let t = Instant::now();
        let sum: f32 = buf.par_chunks(part).map(sum_wide).sum();
        let secs = t.elapsed().as_secs_f64();
        checksum += sum;
        gb_s.push((len * 4) as f64 / secs / 1e9);
    }
    gb_s.sort_by(f64::total_cmp);
    let best = gb_s[gb_s.len() - 1];
    let median = gb_s[gb_s.len() / 2];
    println!(
        "memory read: {best:.1} GB/s best, {median:.1} median ({threads} threads, {mib} MiB x {REPS}; checksum {checksum:e})"
    );
    json!({"buffer_mib": mib, "threads": threads, "reps": REPS,
           "best_gb_s": best, "median_gb_s": median})
}

/// The sum of `v`, with the widest loads this CPU has.
fn sum_wide(v: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            return unsafe { x86::sum_avx512(v) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { x86::sum_avx2(v) };
        }
    }
    sum_portable(v)
}

/// Eight independent accumulators, which the compiler vectorizes.
fn sum_portable(v: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = v.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Eight 16-lane accumulators (128 floats, eight cache lines per
    /// iteration).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn sum_avx512(v: &[f32]) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 8];
        let chunks = v.chunks_exact(128);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            let p = c.as_ptr();
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_add_ps(*a, _mm512_loadu_ps(p.add(16 * i)));
            }
        }
        let s = acc
            .iter()
            .fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a));
        _mm512_reduce_add_ps(s) + tail
    }

    /// Eight 8-lane accumulators.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub unsafe fn sum_avx2(v: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 8];
        let chunks = v.chunks_exact(64);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            let p = c.as_ptr();
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm256_add_ps(*a, _mm256_loadu_ps(p.add(8 * i)));
            }
        }
        let mut lanes = [0.0f32; 8];
        let s = acc
            .iter()
            .fold(_mm256_setzero_ps(), |s, &a| _mm256_add_ps(s, a));
        _mm256_storeu_ps(lanes.as_mut_ptr(), s);
        lanes.iter().sum::<f32>() + tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sum_agrees() {
        let v: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let exact: f32 = v.iter().sum();
        assert_eq!(sum_portable(&v), exact);
        assert_eq!(sum_wide(&v), exact);
    }

    #[test]
    fn a_small_measurement_reports_positive_rates() {
        let r = measure(4);
        assert!(r["best_gb_s"].as_f64().unwrap() > 0.0);
        assert!(r["median_gb_s"].as_f64().unwrap() <= r["best_gb_s"].as_f64().unwrap());
    }
}
