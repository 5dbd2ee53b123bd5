//! `--check-kernels`, the vocabulary part: the argmax and logprobs kernels
//! (`ember_engine::ops::vocab`, never autotuned) against the same numbers
//! computed on the host in f64 from the very logits the device read: each
//! row's argmax (lowest index of a tie), and the log-softmax of a chosen
//! token and of the top `n` (value descending, index ascending). The logits
//! are f16 normals with planted ties (a row's max repeated at a higher
//! index) and a few large outliers, over GPT-2's vocabulary. The logit
//! edits kernel (`logit_bias` and host penalties) against the same edits
//! done on the host in f32.

use burn::prelude::*;
use burn::tensor::DType;
use ember_engine::ops::vocab::{argmax_rows, edit_rows};
use ember_engine::sampling::logprobs;
use serde_json::json;

use crate::check_data::{floats, normal};

/// Rows of the check's logits.
const ROWS: usize = 70;
/// GPT-2's vocabulary.
const VOCAB: usize = 50_257;

/// Runs the check; `say` prints its line. Returns its numbers.
pub fn run(dev: &Device, say: &dyn Fn(String)) -> serde_json::Value {
    // f16 normals, then ties and outliers planted on the host.
    let mut host = floats(normal([ROWS, VOCAB], dev).mul_scalar(3.0));
    for r in 0..ROWS {
        let row = &mut host[r * VOCAB..(r + 1) * VOCAB];
        if r % 3 == 0 {
            row[(r * 7919) % VOCAB] = 20.0;
            row[(r * 7919 + 101) % VOCAB] = 20.0; // a tie, at a higher index mod V
        }
        if r % 5 == 0 {
            row[VOCAB - 1] = 25.0;
        }
    }
    let logits = Tensor::<2>::from_data(TensorData::new(host, [ROWS, VOCAB]), dev);
    // What the device holds (f16 on CUDA), read back as the host's input.
    let seen = floats(logits.clone());

    let got: Vec<i64> = argmax_rows(logits.clone())
        .into_data()
        .convert::<i64>()
        .iter::<i64>()
        .collect();
    let argmax_wrong = (0..ROWS)
        .filter(|&r| got[r] as usize != host_argmax(&seen[r * VOCAB..(r + 1) * VOCAB]))
        .count();

    let n = 20;
    let sampled: Vec<u32> = (0..ROWS).map(|r| ((r * 131) % VOCAB) as u32).collect();
    let asks: Vec<Option<usize>> = (0..ROWS)
        .map(|r| match r % 4 {
            0 => None,
            1 => Some(0),
            2 => Some(n),
            _ => Some(3),
        })
        .collect();
    let (mut value_diff, mut ids_wrong) = (0.0f64, 0usize);
    let edits_diff = edits_check(&logits, &seen, dev);
    let results = logprobs(logits, &sampled, &asks).unwrap_or_default();
    for (r, result) in results.iter().enumerate() {
        let (Some(asked), Some(result)) = (asks[r], result) else {
            ids_wrong += usize::from(asks[r].is_some() != result.is_some());
            continue;
        };
        let want = host_logprobs(
            &seen[r * VOCAB..(r + 1) * VOCAB],
            sampled[r] as usize,
            asked,
        );
        value_diff = value_diff.max((result.logprob as f64 - want.0).abs());
        ids_wrong += usize::from(result.top.len() != want.1.len());
        for (&(id, value), &(want_id, want_value)) in result.top.iter().zip(&want.1) {
            value_diff = value_diff.max((value as f64 - want_value).abs());
            ids_wrong += usize::from(id as usize != want_id);
        }
    }
    say(format!(
        "vocabulary kernels ({ROWS} rows x {VOCAB}, planted ties): argmax rows wrong {argmax_wrong}; logprobs (top 0, 3, {n}) max |kernel - host f64| = {value_diff:e}, ids wrong {ids_wrong}; logit edits max |kernel - host f32| = {edits_diff:e}"
    ));
    json!({
        "argmax_rows_wrong": argmax_wrong,
        "logprobs_max_abs_diff": value_diff,
        "logprobs_ids_wrong": ids_wrong,
        "logit_edits_max_abs_diff": edits_diff,
    })
}

/// The logit edits of ~1,500 distinct entries (every fifth row left alone;
/// positive and negative values, repetition factors above and below one)
/// through [`edit_rows`], against the host's f32 arithmetic on the values
/// the device read (`seen`): the largest difference over all `[B, V]`
/// entries, or -1 off CUDA (no kernel).
fn edits_check(logits: &Tensor<2>, seen: &[f32], dev: &Device) -> f64 {
    let (mut idx, mut add, mut rep, mut sub) = (vec![], vec![], vec![], vec![]);
    for r in (0..ROWS).filter(|r| r % 5 != 4) {
        for k in 0..27 {
            idx.push((r * VOCAB + (k * 1861 + r * 17) % VOCAB) as i32);
            add.push(k as f32 * 0.37 - 5.0);
            rep.push(if k % 3 == 0 {
                1.0
            } else {
                0.6 + k as f32 * 0.05
            });
            sub.push(k as f32 * 0.01);
        }
    }
    let n = idx.len();
    let mut want = seen.to_vec();
    for e in 0..n {
        let x = want[idx[e] as usize] + add[e];
        want[idx[e] as usize] = if x > 0.0 { x / rep[e] } else { x * rep[e] } - sub[e];
    }
    let f = |x: Vec<f32>| Tensor::<1>::from_data(TensorData::new(x, [n]), (dev, DType::F32));
    let ids = Tensor::<1, Int>::from_data(TensorData::new(idx, [n]), dev);
    let Some(got) = edit_rows(logits, &ids, &f(add), &f(rep), &f(sub)) else {
        return -1.0;
    };
    floats(got)
        .iter()
        .zip(&want)
        .map(|(&g, &w)| (g as f64 - w as f64).abs())
        .fold(0.0, f64::max)
}

/// The lowest index of the row's max.
fn host_argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best
}

/// The row's log-softmax at `chosen` and its top `n` `(id, value)`, in f64.
fn host_logprobs(row: &[f32], chosen: usize, n: usize) -> (f64, Vec<(usize, f64)>) {
    let max = row.iter().fold(f64::MIN, |m, &x| m.max(x as f64));
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    let top = order[..n]
        .iter()
        .map(|&i| (i, row[i] as f64 - lse))
        .collect();
    (row[chosen] as f64 - lse, top)
}
