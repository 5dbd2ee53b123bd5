//! The sampling noise: Philox4x32-10 (Random123's counter-based generator)
//! and the Gumbel variate of each token, a pure function of (request seed,
//! position, token id), so a seeded request draws the same tokens whatever
//! its batch-mates, its slot, or a preemption in between. The CUDA kernel
//! (`ops::cuda::kernels::sample_rows`) computes the same function with the
//! same f32 operations; the constants live in [`crate::ops::row_params`].
//!
//! **Noise of a word `x`** (one of Philox's four outputs), in f32:
//! - `x < 2^31`: `v = (x + 0.5) 2^-32` (in `(0, 0.5]`), `E = -ln(1 - v)`
//!   computed as `ln1p` by Goldberg's trick (`u = 1 - v`; `E = v` if `u == 1`,
//!   else `ln(u) v / (u - 1)`), fine near `v -> 0`;
//! - `x >= 2^31`: `w = (!x + 0.5) 2^-32` (that is `1 - v`, exactly), `E =
//!   -ln(w)`, fine near `w -> 0`;
//! - `g = -ln(E)`, in about `[-3.13, 22.87]`: `E ~ Exp(1)` and `argmax(s_i +
//!   g_i)` is an exact draw from `softmax(s)` (Gumbel-max, the exponential
//!   race).
//!
//! Splitting at `2^31` keeps `v` below 1 (a single `(x + 0.5) 2^-32` in f32
//! rounds to 1 for the top 128 words, whose noise would be `-inf`) and gives
//! both tails 32 bits. The CUDA backend lowers `log1p` to `ln(1 + x)`, which
//! loses the small-`v` tail, hence the explicit trick on both sides.
//!
//! [`noise_bound`] bounds a word's noise from its leading zeros alone
//! (`v >= 2^-(lz + 1)` so `g <= -ln v <= (lz + 1) ln 2`): the samplers skip
//! the logarithms of every token whose logit plus that bound cannot beat the
//! best so far, which is exact and leaves a few per row.

use crate::ops::row_params::{
    LN_2, NOISE_SLACK, PHILOX_M0, PHILOX_M1, PHILOX_ROUNDS, PHILOX_W0, PHILOX_W1, STREAM_SAMPLE,
    TWO_POW_M32,
};

/// Philox4x32 with `PHILOX_ROUNDS` (10) rounds: counter `ctr`, key `key`.
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (ctr, key);
    for round in 0..PHILOX_ROUNDS {
        if round > 0 {
            k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
        }
        let p0 = u64::from(PHILOX_M0) * u64::from(c[0]);
        let p1 = u64::from(PHILOX_M1) * u64::from(c[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// The four noise words of tokens `4 group .. 4 group + 4` at position `pos`
/// for `seed`.
pub fn noise_words(seed: u64, pos: u32, group: u32) -> [u32; 4] {
    philox4x32_10(
        [pos, group, STREAM_SAMPLE, 0],
        [seed as u32, (seed >> 32) as u32],
    )
}

/// The Gumbel variate of word `x` (module docs).
pub fn gumbel(x: u32) -> f32 {
    let e = if x < 1 << 31 {
        let v = (x as f32 + 0.5) * TWO_POW_M32;
        let u = 1.0 - v;
        if u == 1.0 {
            v
        } else {
            u.ln() * v / (u - 1.0)
        }
    } else {
        -(((!x) as f32 + 0.5) * TWO_POW_M32).ln()
    };
    -e.ln()
}

/// An upper bound of [`gumbel`]`(x)` from `x`'s leading zeros (module docs).
pub fn noise_bound(x: u32) -> f32 {
    (x.leading_zeros() + 1) as f32 * LN_2 + NOISE_SLACK
}

/// The noise of token `i` at position `pos` for `seed`.
pub fn token_noise(seed: u64, pos: u32, i: u32) -> f32 {
    gumbel(noise_words(seed, pos, i / 4)[(i % 4) as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::row_params::NOISE_MAX;

    /// Random123's `tests/kat_vectors`, the three `philox4x32 10` lines
    /// (counter, key, expected output).
    const KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        (
            [0, 0, 0, 0],
            [0, 0],
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
        ),
        (
            [u32::MAX; 4],
            [u32::MAX; 2],
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
        ),
        (
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0],
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
        ),
    ];

    #[test]
    fn philox_matches_the_random123_known_answers() {
        for (ctr, key, want) in KAT {
            assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:x?} key {key:x?}");
        }
    }

    /// The exact `-ln(-ln(1 - v))` in f64 for the uniform `x` stands for.
    fn exact(x: u32) -> f64 {
        let v = (f64::from(x) + 0.5) / 2f64.powi(32);
        -(-(-v).ln_1p()).ln()
    }

    #[test]
    fn noise_is_accurate_in_both_tails_and_under_its_bounds() {
        let mut words: Vec<u32> = (0..64).collect();
        words.extend((0..64).map(|i| u32::MAX - i));
        words.extend((0..32).map(|b| 1u32 << b));
        words.extend((0..32).map(|b| (1u32 << b) - 1));
        words.extend((0..4096u32).map(|i| i.wrapping_mul(0x9E37_79B9)));
        for x in words {
            let g = gumbel(x);
            assert!(
                (f64::from(g) - exact(x)).abs() < 2e-5,
                "x {x:#x}: {g} vs {}",
                exact(x)
            );
            assert!(g <= noise_bound(x) && g < NOISE_MAX, "x {x:#x}: {g}");
            assert!(g > -3.2, "x {x:#x}: {g}");
        }
        assert!((gumbel(0) - 33.0 * LN_2).abs() < 1e-4);
    }

    #[test]
    fn noise_is_keyed_by_seed_position_and_token_only() {
        let a = token_noise(7, 100, 12345);
        assert_eq!(a, token_noise(7, 100, 12345));
        assert_ne!(a, token_noise(8, 100, 12345));
        assert_ne!(a, token_noise(7, 101, 12345));
        assert_ne!(a, token_noise(7, 100, 12346));
        // High seed bits matter (the key's second word).
        assert_ne!(a, token_noise(7 | 1 << 40, 100, 12345));
        assert_eq!(noise_words(7, 100, 12345 / 4)[1], {
            philox4x32_10([100, 3086, 0, 0], [7, 0])[1]
        });
    }

    #[test]
    fn noise_has_the_gumbel_mean_and_variance() {
        // Mean Euler-Mascheroni 0.5772, variance pi^2 / 6 = 1.6449, over
        // 400k draws (sd of the mean ~0.002).
        let n = 400_000u32;
        let (mut sum, mut sq) = (0f64, 0f64);
        for i in 0..n {
            let g = f64::from(token_noise(42, i / 1000, i % 1000));
            sum += g;
            sq += g * g;
        }
        let mean = sum / f64::from(n);
        let var = sq / f64::from(n) - mean * mean;
        assert!((mean - 0.577_215_7).abs() < 0.01, "mean {mean}");
        assert!((var - 1.644_934).abs() < 0.02, "variance {var}");
    }
}
