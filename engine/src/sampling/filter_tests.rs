//! The sampling filters (temperature, top-k, top-p, min-p) against
//! transformers' warpers on the fixture (`filters.json`): for each reference
//! prompt's last-position logits and each setting, thousands of draws (each
//! row its own seed) never leave the set transformers keeps, and
//! their frequencies fit the tempered softmax renormalized over that set
//! (chi-square at alpha = 1e-4; the draws are seeded, so a pass reproduces).

use burn::prelude::*;

use super::device_sampler::DeviceSampling;
use super::sampler::{sample, SamplingParamsRows};
use super::table::{RowSampling, SamplingTable};
use crate::model::fixtures::{filters, reference, FilterCase};
use crate::params::SamplingParams;

/// Draws per setting.
const DRAWS: usize = 4000;

/// The setting's sampling parameters, with `seed`.
fn params(case: &FilterCase, seed: u64) -> SamplingParams {
    let o = &case.options;
    let f = |k: &str, default: f64| o.get(k).and_then(|v| v.as_f64()).unwrap_or(default);
    SamplingParams {
        temperature: f("temperature", 1.0) as f32,
        top_k: f("top_k", 0.0) as i32,
        top_p: f("top_p", 1.0) as f32,
        min_p: f("min_p", 0.0) as f32,
        seed: Some(seed),
    }
}

/// `DRAWS` tokens drawn from `logits` under `case`'s setting.
fn draws(logits: &[f32], case: &FilterCase) -> Vec<u32> {
    let v = logits.len();
    let device = Device::flex();
    let data: Vec<f32> = logits.iter().copied().cycle().take(DRAWS * v).collect();
    let rows = Tensor::<2>::from_data(TensorData::new(data, [DRAWS, v]), &device);
    let mut table = SamplingTable::with_capacity(DRAWS);
    for i in 0..DRAWS {
        // Each draw its own seed, all at one position.
        table.push(RowSampling::plain(params(case, i as u64), 11, None));
    }
    let mut buffers = SamplingParamsRows::new(DRAWS, v, &device, DeviceSampling::default());
    buffers.write(&table);
    sample(rows, None, &buffers, &table).unwrap()
}

/// The upper critical value of chi-square with `df` degrees of freedom at
/// alpha = 1e-4 (Wilson-Hilferty; z = 3.719).
fn chi2_critical(df: usize) -> f64 {
    let df = df as f64;
    let h = 2.0 / (9.0 * df);
    df * (1.0 - h + 3.719 * h.sqrt()).powi(3)
}

/// Checks `got` against the tempered softmax of `logits` over `kept`.
fn check(logits: &[f32], case: &FilterCase, got: &[u32]) {
    let t = params(case, 0).temperature as f64;
    let kept = &case.kept;
    let outside: Vec<u32> = got
        .iter()
        .copied()
        .filter(|g| kept.binary_search(g).is_err())
        .collect();
    assert!(
        outside.is_empty(),
        "{:?}: {} draws outside transformers' kept set of {} tokens, e.g. {:?}",
        case.options,
        outside.len(),
        kept.len(),
        &outside[..outside.len().min(5)]
    );
    let max = kept
        .iter()
        .map(|&i| logits[i as usize] as f64 / t)
        .fold(f64::MIN, f64::max);
    let w: Vec<f64> = kept
        .iter()
        .map(|&i| (logits[i as usize] as f64 / t - max).exp())
        .collect();
    let z: f64 = w.iter().sum();
    let mut counts = vec![0usize; kept.len()];
    for g in got {
        counts[kept.binary_search(g).unwrap()] += 1;
    }
    // Bins of tokens expected at least 5 times; the rest pooled.
    let (mut stat, mut bins, mut rest_exp, mut rest_obs) = (0.0, 0, 0.0, 0.0);
    for (c, wi) in counts.iter().zip(&w) {
        let expected = DRAWS as f64 * wi / z;
        if expected >= 5.0 {
            stat += (*c as f64 - expected).powi(2) / expected;
            bins += 1;
        } else {
            rest_exp += expected;
            rest_obs += *c as f64;
        }
    }
    if rest_exp >= 5.0 {
        stat += (rest_obs - rest_exp).powi(2) / rest_exp;
        bins += 1;
    }
    if bins > 1 {
        let crit = chi2_critical(bins - 1);
        assert!(
            stat < crit,
            "{:?}: chi-square {stat:.1} over {bins} bins (critical {crit:.1})",
            case.options
        );
    }
}

#[test]
fn draws_stay_in_the_set_transformers_keeps_and_follow_its_distribution() {
    let reference = reference();
    let mut checked = 0;
    for case in &filters().filters {
        let logits = &reference.cases[case.case].last_logits;
        check(logits, case, &draws(logits, case));
        checked += 1;
    }
    assert_eq!(checked, 36, "every setting of every prompt");
}
