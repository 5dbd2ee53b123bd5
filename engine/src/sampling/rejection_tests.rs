//! The premise of the sampling kernel's top-p shortcut
//! (`ops::cuda::kernels::sample_rows`, "Rejection"), on the CPU spec: the
//! Gumbel-max draw over what min-p keeps, when the mass of the keys above
//! its key is under `p Z`, is exactly the token the full top-p sampler
//! draws (same seed, same position). A draw that is rejected happens at
//! most at the rate `1 - p` of the mass outside the nucleus.

use super::row_sampler::{key_of, sample_row, value_of};
use crate::ops::row_params::RowParams;

/// `n` logits spread like an LM's (a fixed xorshift, a heavy upper tail).
fn row(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (3.0 * (-(-u.ln()).ln())) as f32
        })
        .collect()
}

#[test]
fn an_accepted_draw_is_the_full_samplers_token() {
    let (mut accepted, mut draws) = (0u32, 0u32);
    for (i, (temperature, top_p, min_p)) in
        [(1.0f32, 0.9f32, 0.0f32), (0.7, 0.5, 0.0), (1.3, 0.95, 0.02)]
            .into_iter()
            .enumerate()
    {
        let logits = row(4096, 7 + i as u64);
        let full = RowParams {
            temperature,
            top_k: 0,
            top_p,
            min_p,
            seed: 99 + i as u64,
        };
        let open = RowParams { top_p: 1.0, ..full };
        let keys: Vec<u32> = logits.iter().map(|&l| key_of(l / temperature)).collect();
        let s_max = value_of(*keys.iter().max().expect("a row"));
        let mass = |above: u32| -> f32 {
            keys.iter()
                .filter(|&&k| k > above)
                .map(|&k| (value_of(k) - s_max).exp())
                .sum()
        };
        let z = mass(0);
        for pos in 0..400u32 {
            let candidate = sample_row(&logits, &open, pos, None);
            draws += 1;
            if mass(keys[candidate as usize]) < top_p * z {
                accepted += 1;
                assert_eq!(
                    candidate,
                    sample_row(&logits, &full, pos, None),
                    "T {temperature}, p {top_p}, min_p {min_p}, position {pos}"
                );
            }
        }
    }
    // Rejections happen at about the mass outside the nucleus (<= 1 - p).
    let rate = f64::from(accepted) / f64::from(draws);
    assert!(rate > 0.6, "accepted {accepted} of {draws}");
}
