//! What a projection does to its block of outputs while they are still in
//! cache: `+ bias`, tanh-GELU, `residual +` (the order of
//! [`crate::ops::reference::linear`]).
//!
//! The GELU is GPT-2's `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`
//! with `tanh(u) = (e - 1) / (e + 1)`, `e = exp(2u)`, and `exp` computed
//! here (Cephes' `expf`: a degree-6 polynomial after reducing by `ln 2`,
//! about 1 ulp) so that the loop has no library call and vectorizes; the
//! loops are `#[inline(always)]` into the kernel's `#[target_feature]` entry
//! points ([`super::tile`]), so they run 16 lanes wide on AVX-512. Against
//! the reference's `tanh` the GELU is within about 2e-7 absolute (unit test
//! below); the cancellation in `e - 1` near 0 costs relative, not absolute,
//! accuracy, and GELU multiplies it by `x`.

/// The epilogue's operands. `bias` is indexed by output column; `residual`
/// has the output's shape and row stride.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowEpilogue<'a> {
    pub bias: Option<&'a [f32]>,
    pub gelu: bool,
    pub residual: Option<&'a [f32]>,
}

impl RowEpilogue<'_> {
    /// Checks that the operands cover an `[m, n]` output.
    ///
    /// # Panics
    /// If `bias` is shorter than `n` or `residual` than `m * n`.
    pub fn check(&self, m: usize, n: usize) {
        assert!(
            self.bias.is_none_or(|b| b.len() >= n),
            "gemv: bias too short"
        );
        assert!(
            self.residual.is_none_or(|r| r.len() >= m * n),
            "gemv: residual too short"
        );
    }
}

/// Applies `epilogue` to columns `col .. col + n` of the first `m` rows of
/// `out` (row stride `ldo`).
///
/// # Safety
/// `out` must be valid for `m * ldo` elements, with `col + n <= ldo`, and no
/// other thread may touch those columns meanwhile; `bias` must cover
/// `col + n` columns and `residual` `m * ldo` elements.
#[inline(always)]
pub unsafe fn apply_rows(
    out: *mut f32,
    ldo: usize,
    m: usize,
    col: usize,
    n: usize,
    epilogue: &RowEpilogue<'_>,
) {
    for i in 0..m {
        let row = std::slice::from_raw_parts_mut(out.add(i * ldo + col), n);
        if let Some(bias) = epilogue.bias {
            for (y, b) in row.iter_mut().zip(&bias[col..col + n]) {
                *y += b;
            }
        }
        if epilogue.gelu {
            for y in row.iter_mut() {
                *y = gelu_tanh(*y);
            }
        }
        if let Some(res) = epilogue.residual {
            let start = i * ldo + col;
            for (y, r) in row.iter_mut().zip(&res[start..start + n]) {
                *y += r;
            }
        }
    }
}

/// GPT-2's tanh-GELU (see the module docs).
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + tanh(u))
}

/// `tanh(u)` through `exp(2u)`; beyond `|u| = 9` tanh is +-1 in f32.
#[inline(always)]
fn tanh(u: f32) -> f32 {
    let e = exp(2.0 * u.clamp(-9.0, 9.0));
    (e - 1.0) / (e + 1.0)
}

/// `exp(x)` for `|x| <= 18` (Cephes `expf`): `x = n ln2 + r`, `|r| <= ln2/2`,
/// `exp(r)` by its degree-6 polynomial, times `2^n` built in the exponent bits.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Round to nearest without a library call: adding 1.5 * 2^23 leaves no
    // fraction bits.
    const ROUND: f32 = 12_582_912.0;
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let poly = p * r * r + r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    poly * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_of_std() {
        let mut worst = 0.0f32;
        for i in -18_000..=18_000 {
            let x = i as f32 * 1e-3;
            let rel = (exp(x) - x.exp()).abs() / x.exp();
            worst = worst.max(rel);
        }
        assert!(worst < 4e-7, "worst relative error {worst}");
    }

    #[test]
    fn gelu_matches_the_std_tanh_formula() {
        let reference = |x: f32| {
            let x = f64::from(x);
            let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            0.5 * x * (1.0 + u.tanh())
        };
        let mut worst = 0.0f64;
        for i in -20_000..=20_000 {
            let x = i as f32 * 1e-3;
            let err = (f64::from(gelu_tanh(x)) - reference(x)).abs();
            worst = worst.max(err / (1.0 + f64::from(x).abs()));
        }
        assert!(worst < 5e-7, "worst error {worst}");
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert_eq!(gelu_tanh(-60.0), 0.0);
        assert_eq!(gelu_tanh(60.0), 60.0);
    }

    #[test]
    fn the_epilogue_adds_bias_then_gelu_then_residual_on_its_columns_only() {
        // Two rows of four columns; the block is columns 1..3.
        let mut out = [1.0f32, 0.5, -0.5, 9.0, 2.0, 1.0, 0.0, 9.0];
        let bias = [100.0, 0.5, 0.5, 100.0];
        let residual = [0.0, 10.0, 20.0, 0.0, 0.0, 30.0, 40.0, 0.0];
        let epilogue = RowEpilogue {
            bias: Some(&bias),
            gelu: true,
            residual: Some(&residual),
        };
        unsafe { apply_rows(out.as_mut_ptr(), 4, 2, 1, 2, &epilogue) };
        let expect = |pre: f32, r: f32| r + gelu_tanh(pre);
        assert_eq!(out[0], 1.0);
        assert_eq!(out[3], 9.0);
        assert_eq!(out[1], expect(1.0, 10.0));
        assert_eq!(out[2], expect(0.0, 20.0));
        assert_eq!(out[5], expect(1.5, 30.0));
        assert_eq!(out[6], expect(0.5, 40.0));
    }
}
