//! The vector operations the projection kernel is written in, once per
//! instruction set: [`Avx512`] (16 lanes), [`Avx2`] (8 lanes, FMA) and
//! [`Portable`] (8 lanes of plain Rust the compiler vectorizes for the build's
//! baseline).
//!
//! Every method is `#[inline(always)]` and the kernel that uses them is too,
//! down to one `#[target_feature]` entry point per instruction set
//! ([`super::tile`]): the whole kernel is inlined into that entry point and
//! compiled for its features, so one binary carries all three and runs the
//! one [`crate::ops::cpu::CpuIsa::detect`] picked.
//!
//! [`WeightElem`] is how a weight element becomes a lane: `f32` as is, `bf16`
//! widened exactly (its bits are the top half of an f32), so bf16 weights
//! are multiplied and accumulated in f32.

use half::bf16;

/// One instruction set's vector of f32 lanes.
///
/// # Safety
/// Every method may only run on a CPU with the instruction set's features
/// (the entry points in [`super::tile`] are only called after detection),
/// and pointer arguments must be valid for `WIDTH` reads.
pub trait Lanes {
    type V: Copy;
    /// f32 lanes per vector.
    const WIDTH: usize;
    /// All lanes 0.
    ///
    /// # Safety
    /// The CPU must have the instruction set's features.
    unsafe fn zero() -> Self::V;
    /// `WIDTH` f32 from `p` (unaligned).
    ///
    /// # Safety
    /// As [`Lanes::zero`]; `p` must be valid for `WIDTH` reads.
    unsafe fn load(p: *const f32) -> Self::V;
    /// `WIDTH` bf16 values from `p` widened to f32.
    ///
    /// # Safety
    /// As [`Lanes::zero`]; `p` must be valid for `WIDTH` reads.
    unsafe fn load_bf16(p: *const bf16) -> Self::V;
    /// `*p` in every lane (one broadcast load).
    ///
    /// # Safety
    /// As [`Lanes::zero`]; `p` must be valid for one read.
    unsafe fn splat(p: *const f32) -> Self::V;
    /// Stores `WIDTH` f32 at `p` (unaligned).
    ///
    /// # Safety
    /// As [`Lanes::zero`]; `p` must be valid for `WIDTH` writes.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + acc`.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn fma(a: Self::V, b: Self::V, acc: Self::V) -> Self::V;
    /// `a + b`, lane by lane.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// The sum of the lanes.
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn sum(v: Self::V) -> f32;
    /// Asks for the cache line at `p` (a hint: any address, never faults).
    ///
    /// # Safety
    /// As [`Lanes::zero`].
    unsafe fn prefetch<T>(p: *const T);
}

/// A weight element type the kernels stream: `f32`, or `bf16` widened to f32.
pub trait WeightElem: Copy + Send + Sync + 'static {
    /// Whether [`WeightElem::f32_rows`] widens into its scratch (else the
    /// rows are used in place).
    const WIDENS: bool;
    /// `L::WIDTH` elements from `p`, as f32 lanes.
    ///
    /// # Safety
    /// As [`Lanes`].
    unsafe fn load<L: Lanes>(p: *const Self) -> L::V;
    /// `rows` (each valid for `len` reads) as f32 rows: f32 in place, bf16
    /// widened into `scratch` (row `j` at `scratch + j * len`).
    ///
    /// # Safety
    /// As [`Lanes`]; for bf16, `scratch` must be valid for `N * len` writes.
    unsafe fn f32_rows<L: Lanes, const N: usize>(
        rows: [*const Self; N],
        len: usize,
        scratch: *mut f32,
    ) -> [*const f32; N];
    fn to_f32(self) -> f32;
}

impl WeightElem for f32 {
    const WIDENS: bool = false;
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const Self) -> L::V {
        L::load(p)
    }
    #[inline(always)]
    unsafe fn f32_rows<L: Lanes, const N: usize>(
        rows: [*const Self; N],
        _len: usize,
        _scratch: *mut f32,
    ) -> [*const f32; N] {
        rows
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl WeightElem for bf16 {
    const WIDENS: bool = true;
    #[inline(always)]
    unsafe fn load<L: Lanes>(p: *const Self) -> L::V {
        L::load_bf16(p)
    }
    #[inline(always)]
    unsafe fn f32_rows<L: Lanes, const N: usize>(
        rows: [*const Self; N],
        len: usize,
        scratch: *mut f32,
    ) -> [*const f32; N] {
        let mut out = [scratch.cast_const(); N];
        let vectors = len - len % L::WIDTH;
        for (j, (&src, o)) in rows.iter().zip(out.iter_mut()).enumerate() {
            let dst = scratch.add(j * len);
            let mut t = 0;
            while t < vectors {
                L::store(dst.add(t), L::load_bf16(src.add(t)));
                t += L::WIDTH;
            }
            for t in vectors..len {
                *dst.add(t) = WeightElem::to_f32(*src.add(t));
            }
            *o = dst;
        }
        out
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// Plain Rust, 8 lanes: what the build's baseline vectorizes.
pub struct Portable;

impl Lanes for Portable {
    type V = [f32; 8];
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        p.cast::<[f32; 8]>().read_unaligned()
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const bf16) -> Self::V {
        let h = p.cast::<[bf16; 8]>().read_unaligned();
        h.map(WeightElem::to_f32)
    }
    #[inline(always)]
    unsafe fn splat(p: *const f32) -> Self::V {
        [*p; 8]
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        p.cast::<[f32; 8]>().write_unaligned(v);
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, mut acc: Self::V) -> Self::V {
        for ((o, x), y) in acc.iter_mut().zip(a).zip(b) {
            *o += x * y;
        }
        acc
    }
    #[inline(always)]
    unsafe fn add(mut a: Self::V, b: Self::V) -> Self::V {
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
        a
    }
    #[inline(always)]
    unsafe fn prefetch<T>(_p: *const T) {}
    #[inline(always)]
    unsafe fn sum(v: Self::V) -> f32 {
        let [a, b, c, d, e, f, g, h] = v;
        ((a + e) + (b + f)) + ((c + g) + (d + h))
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::bf16;

    use crate::ops::cpu::gemv::lanes::Lanes;

    /// AVX-512F: 16 lanes.
    pub struct Avx512;

    impl Lanes for Avx512 {
        type V = __m512;
        const WIDTH: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const bf16) -> Self::V {
            let h = _mm256_loadu_si256(p.cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
        #[inline(always)]
        unsafe fn splat(p: *const f32) -> Self::V {
            _mm512_set1_ps(*p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn fma(a: Self::V, b: Self::V, acc: Self::V) -> Self::V {
            _mm512_fmadd_ps(a, b, acc)
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            _mm512_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn prefetch<T>(p: *const T) {
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
        }
        #[inline(always)]
        unsafe fn sum(v: Self::V) -> f32 {
            _mm512_reduce_add_ps(v)
        }
    }

    /// AVX2 with FMA: 8 lanes.
    pub struct Avx2;

    impl Lanes for Avx2 {
        type V = __m256;
        const WIDTH: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const bf16) -> Self::V {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
        #[inline(always)]
        unsafe fn splat(p: *const f32) -> Self::V {
            _mm256_broadcast_ss(&*p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self::V) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn fma(a: Self::V, b: Self::V, acc: Self::V) -> Self::V {
            _mm256_fmadd_ps(a, b, acc)
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn prefetch<T>(p: *const T) {
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
        }
        #[inline(always)]
        unsafe fn sum(v: Self::V) -> f32 {
            let half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
            let one = _mm_add_ss(pairs, _mm_movehdup_ps(pairs));
            _mm_cvtss_f32(one)
        }
    }
}
