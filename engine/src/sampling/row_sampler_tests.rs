//! Tests of the CPU row sampler ([`super::row_sampler`]): the distribution it
//! draws from (chi-square against an independent sort-based f64 reference of
//! the tempered, filtered softmax), the kept sets (zero draws outside them;
//! top-k + top-p keep the intersection), ties, the noise's far tail, allowed
//! bitmasks and seeds. Every test is deterministic (fixed seeds; the draw
//! index is the position), so a pass reproduces and never flakes.

use super::philox::{gumbel, noise_words, token_noise};
use super::row_sampler::{key_of, sample_row, trace_row, trace_rows_host, value_of};
use crate::ops::row_params::{columns, RowParams};

fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> RowParams {
    RowParams {
        temperature,
        top_k,
        top_p,
        min_p,
        seed: 0x5EED_0000_0000_0042,
    }
}

/// `n` roughly normal logits with standard deviation `sd` (a fixed xorshift
/// and Box-Muller), so rows have a realistic spread without ties.
fn normal_row(n: usize, sd: f32, seed: u64) -> Vec<f32> {
    let mut x = seed | 1;
    let mut uniform = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let (u, v) = (uniform(), uniform());
            ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32 * sd
        })
        .collect()
}

fn zipf_row(n: usize) -> Vec<f32> {
    (0..n).map(|i| -1.1 * ((i + 1) as f32).ln()).collect()
}

fn allows(allowed: Option<&[u32]>, i: usize) -> bool {
    allowed.is_none_or(|a| (a[i / 32] >> (i % 32)) & 1 == 1)
}

/// The kept tokens' probabilities (0 = not kept), by sorting, in f64: the
/// semantics of the module docs written independently of the sampler.
fn reference(logits: &[f32], p: &RowParams, allowed: Option<&[u32]>) -> Vec<f64> {
    let s: Vec<Option<f32>> = (0..logits.len())
        .map(|i| {
            (allows(allowed, i) && !logits[i].is_nan()).then(|| logits[i] / p.temperature + 0.0)
        })
        .collect();
    let mut order: Vec<usize> = (0..s.len()).filter(|&i| s[i].is_some()).collect();
    order.sort_by(|&a, &b| s[b].unwrap().total_cmp(&s[a].unwrap()).then(a.cmp(&b)));
    let val = |i: usize| s[i].unwrap();
    let s_max = val(order[0]);
    let k = p.top_k as usize;
    let mut kept: Vec<usize> = if k > 0 && k < order.len() {
        let kth = val(order[k - 1]);
        order.iter().copied().filter(|&i| val(i) >= kth).collect()
    } else {
        order.clone()
    };
    let w = |i: usize| (f64::from(val(i)) - f64::from(s_max)).exp();
    if p.top_p < 1.0 {
        let z: f64 = kept.iter().map(|&i| w(i)).sum();
        let above = |i: usize| -> f64 {
            kept.iter()
                .filter(|&&j| val(j) > val(i))
                .map(|&j| w(j))
                .sum()
        };
        let keep: Vec<bool> = kept
            .iter()
            .map(|&i| above(i) < f64::from(p.top_p) * z || val(i) == s_max)
            .collect();
        kept = kept
            .iter()
            .zip(keep)
            .filter(|x| x.1)
            .map(|x| *x.0)
            .collect();
    }
    if p.min_p > 0.0 {
        let thr = s_max + p.min_p.ln();
        kept.retain(|&i| val(i) >= thr);
    }
    let mut probs = vec![0.0; logits.len()];
    let z: f64 = kept.iter().map(|&i| w(i)).sum();
    for &i in &kept {
        probs[i] = w(i) / z;
    }
    probs
}

/// Token counts over `n` draws (positions `0..n`).
fn draw_counts(logits: &[f32], p: &RowParams, allowed: Option<&[u32]>, n: u32) -> Vec<u32> {
    let mut counts = vec![0u32; logits.len()];
    for pos in 0..n {
        counts[sample_row(logits, p, pos, allowed) as usize] += 1;
    }
    counts
}

/// The chi-square critical value for `df` degrees of freedom at alpha =
/// 1e-4 (Wilson-Hilferty; z = 3.719).
fn chi2_critical(df: usize) -> f64 {
    let d = df as f64;
    let c = 2.0 / (9.0 * d);
    d * (1.0 - c + 3.719 * c.sqrt()).powi(3)
}

/// Draws `n` tokens: none outside the reference's kept set, and the counts
/// pass a chi-square test against its probabilities (bins with an expected
/// count >= 5, the rest pooled). Returns the kept set's size.
fn check_distribution(logits: &[f32], p: &RowParams, allowed: Option<&[u32]>, n: u32) -> usize {
    let probs = reference(logits, p, allowed);
    let counts = draw_counts(logits, p, allowed, n);
    for (i, (&c, &q)) in counts.iter().zip(&probs).enumerate() {
        assert!(
            q > 0.0 || c == 0,
            "{p:?}: token {i} drawn {c} times outside the kept set"
        );
    }
    let (mut chi2, mut bins) = (0.0, 0);
    let (mut pooled_e, mut pooled_o) = (0.0, 0.0);
    for (&c, &q) in counts.iter().zip(&probs).filter(|x| *x.1 > 0.0) {
        let e = q * f64::from(n);
        if e >= 5.0 {
            chi2 += (f64::from(c) - e).powi(2) / e;
            bins += 1;
        } else {
            pooled_e += e;
            pooled_o += f64::from(c);
        }
    }
    if pooled_e >= 5.0 {
        chi2 += (pooled_o - pooled_e).powi(2) / pooled_e;
        bins += 1;
    }
    if bins > 1 {
        let crit = chi2_critical(bins - 1);
        assert!(
            chi2 < crit,
            "{p:?}: chi2 {chi2:.1} >= {crit:.1} ({bins} bins)"
        );
    }
    probs.iter().filter(|&&q| q > 0.0).count()
}

#[test]
fn temperature_only_draws_follow_the_tempered_softmax() {
    let row = normal_row(500, 2.0, 1);
    for t in [0.7, 1.0, 1.5] {
        assert_eq!(
            check_distribution(&row, &params(t, 0, 1.0, 0.0), None, 20_000),
            500
        );
    }
    check_distribution(&zipf_row(400), &params(1.0, 0, 1.0, 0.0), None, 20_000);
    check_distribution(&vec![0.0; 200], &params(1.0, 0, 1.0, 0.0), None, 20_000);
}

#[test]
fn filtered_draws_follow_the_renormalized_softmax_of_the_kept_set() {
    let row = normal_row(500, 2.0, 2);
    let cases = [
        (params(1.0, 5, 1.0, 0.0), Some(5)),
        (params(1.0, 50, 1.0, 0.0), Some(50)),
        (params(1.0, 0, 0.5, 0.0), None),
        (params(1.0, 0, 0.9, 0.0), None),
        (params(1.0, 0, 1.0, 0.05), None),
        (params(1.0, 0, 1.0, 0.1), None),
        (params(0.7, 50, 0.9, 0.0), None),
        (params(1.5, 5, 0.9, 0.05), None),
        (params(1.0, 50, 0.5, 0.1), None),
    ];
    for (p, size) in cases {
        let kept = check_distribution(&row, &p, None, 20_000);
        if let Some(size) = size {
            assert_eq!(kept, size, "{p:?}");
        }
    }
    let zipf = zipf_row(400);
    check_distribution(&zipf, &params(1.0, 0, 0.9, 0.0), None, 20_000);
    check_distribution(&zipf, &params(0.7, 50, 0.9, 0.05), None, 20_000);
}

#[test]
fn top_k_and_top_p_keep_the_intersection() {
    // A Zipf row: the top 3 tokens hold well under 0.9 of the mass, so top-p
    // alone keeps many more; together they keep the top 3 only.
    let row = zipf_row(300);
    let both = params(1.0, 3, 0.9, 0.0);
    assert!(
        reference(&row, &params(1.0, 0, 0.9, 0.0), None)
            .iter()
            .filter(|&&q| q > 0.0)
            .count()
            > 50
    );
    assert_eq!(check_distribution(&row, &both, None, 20_000), 3);
    let counts = draw_counts(&row, &both, None, 5_000);
    assert_eq!(counts[..3].iter().sum::<u32>(), 5_000);
    assert!(counts[..3].iter().all(|&c| c > 0));
}

#[test]
fn greedy_is_the_raw_argmax_with_the_lowest_index_on_ties() {
    let g = RowParams::GREEDY;
    assert_eq!(sample_row(&[1.0, 3.0, 3.0, 2.0], &g, 0, None), 1);
    assert_eq!(sample_row(&[-0.0, 0.0], &g, 0, None), 0);
    assert_eq!(sample_row(&[0.0, -0.0, -1.0], &g, 0, None), 0);
    assert_eq!(sample_row(&[f32::NAN, 1.0, f32::NAN], &g, 0, None), 1);
    assert_eq!(sample_row(&[f32::NEG_INFINITY; 3], &g, 0, None), 0);
    // Greedy whatever else is set: T <= 0, NaN, or top_k == 1.
    let row = normal_row(1000, 2.0, 3);
    let argmax = (0..1000)
        .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
        .unwrap();
    for p in [
        params(0.0, 0, 0.5, 0.1),
        params(-1.0, 7, 1.0, 0.0),
        params(f32::NAN, 0, 1.0, 0.0),
        params(1.3, 1, 0.9, 0.0),
    ] {
        for pos in 0..5 {
            assert_eq!(sample_row(&row, &p, pos, None), argmax as u32, "{p:?}");
        }
    }
    // No token present: 0.
    assert_eq!(sample_row(&[1.0, 2.0], &g, 0, Some(&[0])), 0);
    assert_eq!(
        sample_row(&[1.0, 2.0], &params(1.0, 0, 1.0, 0.0), 0, Some(&[0])),
        0
    );
}

#[test]
fn ties_are_kept_or_dropped_together() {
    // top-k 2 with three tokens tied at the 2nd value keeps all four.
    let row = [5.0, 4.0, 4.0, 4.0, 1.0, 0.0];
    let p = params(1.0, 2, 1.0, 0.0);
    assert_eq!(check_distribution(&row, &p, None, 20_000), 4);
    assert_eq!(trace_row(&row, &p, 0, None).tau_k, key_of(4.0));
    // top-p: probs ~ [.534, .197, .197, .072]; the tied pair has .534 above.
    let row = [2.0, 1.0, 1.0, 0.0];
    assert_eq!(
        check_distribution(&row, &params(1.0, 0, 0.6, 0.0), None, 20_000),
        3
    );
    assert_eq!(
        check_distribution(&row, &params(1.0, 0, 0.5, 0.0), None, 5_000),
        1
    );
    // A flat row: nothing is strictly above anything, so top-p keeps all.
    assert_eq!(
        check_distribution(&[0.5; 40], &params(1.0, 0, 0.3, 0.0), None, 20_000),
        40
    );
    // top_p <= 0 keeps the top key only (here the tied top pair).
    let counts = draw_counts(&[3.0, 1.0, 3.0], &params(1.0, 0, 0.0, 0.0), None, 2_000);
    assert_eq!(counts[1], 0);
    assert!(counts[0] > 800 && counts[2] > 800);
}

#[test]
fn thresholds_match_a_brute_force_search() {
    // Logits on a coarse grid put many tokens on the same key and many keys
    // in the same 16-bit bucket, so the boundary bucket is resolved for real.
    let row: Vec<f32> = normal_row(3000, 1.5, 4)
        .iter()
        .map(|x| (x * 64.0).round() / 64.0)
        .collect();
    for (t, k, p, m) in [
        (1.0, 0, 0.9, 0.0),
        (0.8, 200, 0.7, 0.0),
        (1.2, 0, 0.3, 0.02),
        (1.0, 40, 0.95, 0.0),
    ] {
        let prm = params(t, k, p, m);
        let trace = trace_row(&row, &prm, 9, None);
        let probs = reference(&row, &prm, None);
        // The threshold keeps exactly the reference's set.
        for (i, &l) in row.iter().enumerate() {
            assert_eq!(
                key_of(l / t) >= trace.threshold,
                probs[i] > 0.0,
                "{prm:?}: token {i}"
            );
        }
        if k > 0 {
            let mut keys: Vec<u32> = row.iter().map(|&l| key_of(l / t)).collect();
            keys.sort_unstable_by(|a, b| b.cmp(a));
            assert_eq!(trace.tau_k, keys[k as usize - 1]);
        }
        assert!(probs[trace.token as usize] > 0.0);
    }
}

#[test]
fn keys_preserve_order_and_invert() {
    let values = [
        f32::NEG_INFINITY,
        -1e30,
        -2.5,
        -1e-40,
        -0.0,
        0.0,
        1e-40,
        1.0,
        3.0e38,
        f32::INFINITY,
    ];
    for w in values.windows(2) {
        assert!(key_of(w[0]) <= key_of(w[1]), "{w:?}");
    }
    assert_eq!(key_of(-0.0), key_of(0.0));
    for v in values.iter().filter(|v| v.to_bits() != (-0.0f32).to_bits()) {
        assert_eq!(value_of(key_of(*v)).to_bits(), v.to_bits());
    }
    assert!(key_of(f32::NEG_INFINITY) > 0);
}

#[test]
fn the_noise_tail_has_its_exact_rate() {
    // g is decreasing in the word over [0, 2^31): the words whose noise
    // exceeds t are [0, x_t), and x_t / 2^32 must be P(G > t).
    let count_above = |t: f32| {
        let (mut lo, mut hi) = (0u32, 1u32 << 31);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if gumbel(mid) > t {
                lo = mid + 1
            } else {
                hi = mid
            }
        }
        lo
    };
    for (t, tolerance) in [(12.0f32, 0.001), (16.0, 0.005), (18.0, 0.02)] {
        let want = -(-(-f64::from(t)).exp()).exp_m1() * 2f64.powi(32);
        let got = f64::from(count_above(t));
        assert!(
            (got / want - 1.0).abs() < tolerance,
            "t {t}: {got} words, want {want:.1}"
        );
    }
    // Out to 20 nats within a word, and the tail reaches past 22.
    let want20 = (-20f64).exp() * 2f64.powi(32);
    assert!((f64::from(count_above(20.0)) - want20).abs() <= 1.0);
    assert!(count_above(22.0) >= 1);
}

#[test]
fn a_far_tail_is_sampled_at_its_rate() {
    // Token 0 at 0, 1000 tokens at -12: the tail wins with probability
    // 1000 e^-12 / (1 + 1000 e^-12) = 6.10e-3; 40k draws expect 244 +- 16.
    let mut row = vec![-12.0f32; 1001];
    row[0] = 0.0;
    let p = params(1.0, 0, 1.0, 0.0);
    let n = 40_000u32;
    let hits = (0..n)
        .filter(|&pos| sample_row(&row, &p, pos, None) != 0)
        .count() as f64;
    let q = 1000.0 * (-12f64).exp() / (1.0 + 1000.0 * (-12f64).exp());
    let (mean, sd) = (q * f64::from(n), (q * (1.0 - q) * f64::from(n)).sqrt());
    assert!(
        (hits - mean).abs() < 4.0 * sd,
        "{hits} tail draws, want {mean:.0} +- {sd:.0}"
    );
}

#[test]
fn a_tail_token_wins_with_noise_beyond_a_24_bit_uniform() {
    // Token 0 at 0, 4096 tokens at -17.5: a tail token wins only with noise
    // above ~17 nats, past the ~16.6 cap of a 24-bit uniform. Find the first
    // position where one wins and check it is the exact argmax.
    let mut row = vec![-17.5f32; 4097];
    row[0] = 0.0;
    let p = params(1.0, 0, 1.0, 0.0);
    let noise = |pos: u32, i: u32| token_noise(p.seed, pos, i);
    let pos = (0..200_000u32)
        .find(|&pos| {
            let token = sample_row(&row, &p, pos, None);
            token != 0 && noise(pos, token) > 17.0
        })
        .expect("no tail draw with noise > 17 in 200k positions (expected ~1 in 15k)");
    let token = sample_row(&row, &p, pos, None);
    let g = |i: u32| noise(pos, i);
    let exact = (0..4097u32)
        .max_by(|&a, &b| {
            (row[a as usize] + g(a))
                .total_cmp(&(row[b as usize] + g(b)))
                .then(b.cmp(&a))
        })
        .unwrap();
    assert_eq!(token, exact);
}

#[test]
fn the_allowed_bitmask_removes_tokens_before_everything() {
    let row = normal_row(100, 2.0, 5);
    let mut mask = [0u32; 4];
    for t in [3usize, 17, 42, 64, 99] {
        mask[t / 32] |= 1 << (t % 32);
    }
    assert_eq!(
        check_distribution(&row, &params(1.0, 0, 1.0, 0.0), Some(&mask), 20_000),
        5
    );
    assert_eq!(
        check_distribution(&row, &params(1.0, 2, 1.0, 0.0), Some(&mask), 10_000),
        2
    );
    let best = [3usize, 17, 42, 64, 99]
        .into_iter()
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap();
    assert_eq!(
        sample_row(&row, &RowParams::GREEDY, 0, Some(&mask)),
        best as u32
    );
}

#[test]
fn seeds_give_different_streams_and_a_seeded_row_ignores_its_batch() {
    let row = vec![0.0f32; 64];
    let stream = |seed: u64| -> Vec<u32> {
        let p = RowParams {
            seed,
            ..params(1.0, 0, 1.0, 0.0)
        };
        (0..200)
            .map(|pos| sample_row(&row, &p, pos, None))
            .collect()
    };
    let (a, b) = (stream(1), stream(2));
    assert_eq!(a, stream(1));
    assert!(a.iter().zip(&b).filter(|(x, y)| x != y).count() > 150);

    // The same row (seed, position) in different slots of batches with
    // different neighbours, bitmask flags and sizes draws the same token.
    let v = 300;
    let me = normal_row(v, 2.0, 6);
    let mine = params(0.9, 40, 0.9, 0.02);
    let mut tokens = Vec::new();
    for (slot, rows) in [(0usize, 1usize), (2, 4), (5, 7)] {
        let mut logits = Vec::new();
        let mut ps = Vec::new();
        let mut positions = Vec::new();
        for r in 0..rows {
            if r == slot {
                logits.extend_from_slice(&me);
                ps.push(mine);
                positions.push(77);
            } else {
                logits.extend(normal_row(v, 3.0, 100 + r as u64));
                ps.push(RowParams {
                    seed: r as u64,
                    ..params(1.0, 0, 1.0, 0.0)
                });
                positions.push(r as i32);
            }
        }
        let flags: Vec<bool> = (0..rows).map(|r| r != slot).collect();
        let (floats, ints) = columns(&ps, &flags, rows);
        let mask = vec![0x5555_5555u32; rows * v.div_ceil(32)];
        let traces = trace_rows_host(&logits, v, &floats, &ints, &positions, Some(&mask));
        tokens.push(traces[slot].token);
        assert_eq!(traces[slot], trace_row(&me, &mine, 77, None));
    }
    assert!(tokens.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn noise_words_are_shared_by_groups_of_four_tokens() {
    let w = noise_words(3, 5, 2);
    for j in 0..4u32 {
        assert_eq!(token_noise(3, 5, 8 + j), gumbel(w[j as usize]));
    }
}
