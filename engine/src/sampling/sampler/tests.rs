//! The sampler's unit tests: greedy and seeded rows, the graph's ids,
//! padding, the top-k and top-p intersection, columns written back.

use super::*;
use crate::sampling::table::RowSampling;
use crate::sampling::test_logits::logits;

fn s(temperature: f32, top_k: i32, top_p: f32, seed: u64) -> RowSampling {
    let params = SamplingParams {
        temperature,
        top_k,
        top_p,
        seed: Some(seed),
        ..SamplingParams::greedy()
    };
    RowSampling::plain(params, 5, None)
}

const G: fn() -> RowSampling = RowSampling::greedy;

fn table(rows: &[RowSampling]) -> SamplingTable {
    let mut t = SamplingTable::with_capacity(rows.len());
    rows.iter().for_each(|r| t.push(r.clone()));
    t
}

fn pick(l: Tensor<2>, rows: &[RowSampling]) -> Vec<u32> {
    let [b, v] = l.dims();
    let mut params = SamplingParamsRows::new(b, v, &Device::flex(), DeviceSampling::default());
    let t = table(rows);
    params.write(&t);
    sample(l, None, &params, &t).unwrap()
}

#[test]
fn greedy_is_argmax() {
    let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0]]);
    assert_eq!(pick(l, &[G(), G()]), [1, 0]);
}

#[test]
fn a_precomputed_argmax_serves_an_all_greedy_batch_and_padding_is_dropped() {
    // The ids a replayed graph computed are what greedy rows get (here
    // deliberately not the logits' argmax, to tell them apart); rows past
    // the table's (padding) are not returned.
    let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0], &[0.0, 0.0, 9.0]]);
    let given =
        || Tensor::<2, Int>::from_data(TensorData::new(vec![2i64, 1, 0], [3, 1]), &Device::flex());
    let mut params = SamplingParamsRows::new(3, 3, &Device::flex(), DeviceSampling::default());
    let greedy = table(&[G(), G()]);
    params.write(&greedy);
    assert_eq!(sample(l, Some(given()), &params, &greedy).unwrap(), [2, 1]);
    // A mixed batch: greedy rows take the argmax of their logits, the
    // sampled row (all its mass on token 0) samples.
    let hot = logits(&[&[0.1, 3.0, 0.2], &[50.0, 0.0, 0.0], &[0.0, 0.0, 9.0]]);
    let mixed = table(&[G(), s(1.0, 0, 1.0, 3)]);
    params.write(&mixed);
    assert_eq!(sample(hot, Some(given()), &params, &mixed).unwrap(), [1, 0]);
}

#[test]
fn a_seeded_row_samples_the_same_token_in_any_slot_and_batch() {
    let row: &[f32] = &[0.3, 0.1, 0.2, 0.25, 0.15];
    let alone = pick(logits(&[row]), &[s(1.0, 0, 1.0, 42)]);
    let l = logits(&[row, row, row, row]);
    let batch = pick(
        l,
        &[
            G(),
            s(0.7, 0, 1.0, 1),
            s(1.0, 0, 1.0, 42),
            s(1.0, 3, 0.9, 9),
        ],
    );
    assert_eq!(batch[2], alone[0]);
    // Other seeds give other draws somewhere among 64 positions.
    let draws = |seed| {
        (0..64)
            .map(|pos| {
                let r = RowSampling {
                    pos,
                    ..s(1.0, 0, 1.0, seed)
                };
                pick(logits(&[row]), &[r])[0]
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(draws(42), draws(42));
    assert_ne!(draws(42), draws(43));
}

#[test]
fn top_k_and_top_p_keep_their_intersection() {
    // probs ~ [0.30, 0.25, 0.2, 0.15, 0.1]: top_k 3 alone keeps {0, 1,
    // 2}; top_p 0.9 alone keeps {0, 1, 2, 3}; both keep {0, 1, 2}.
    let row: Vec<f32> = [0.30f32, 0.25, 0.2, 0.15, 0.1]
        .iter()
        .map(|p| p.ln())
        .collect();
    let rows: Vec<RowSampling> = (0..400).map(|i| s(1.0, 3, 0.9, i)).collect();
    let l = logits(&vec![row.as_slice(); 400]);
    let got = pick(l, &rows);
    assert!(got.iter().all(|&t| t < 3), "{got:?}");
    assert!((0..3).all(|t| got.contains(&t)));
}

#[test]
fn a_greedy_row_with_edits_ignores_the_graphs_argmax_and_others_keep_it() {
    let l = logits(&[&[0.1, 3.0, 0.2], &[5.0, 1.0, 0.0]]);
    let given =
        Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 0], [2, 1]), &Device::flex());
    // Row 0: token 1 banned -> token 2; row 1 the argmax.
    let banned = RowSampling {
        banned: vec![1],
        ..G()
    };
    let t = table(&[banned, G()]);
    let mut params = SamplingParamsRows::new(2, 3, &Device::flex(), DeviceSampling::default());
    params.write(&t);
    assert_eq!(sample(l, Some(given), &params, &t).unwrap(), [2, 0]);
}

#[test]
fn an_all_greedy_step_after_a_sampled_one_writes_the_greedy_columns_back() {
    // A replayed graph's kernel reads the columns on every step, and an
    // all-greedy step reads its ids straight from it: stale sampled
    // columns would sample those rows.
    let mut params = SamplingParamsRows::new(2, 3, &Device::flex(), DeviceSampling::default());
    params.write(&table(&[G(), s(1.0, 0, 0.9, 7)]));
    assert_ne!(params.written, params.greedy);
    params.write(&table(&[G(), G()]));
    assert_eq!(params.written, params.greedy);
    let (floats, ints) = params.greedy.clone();
    let on_device = |t: Tensor<2>| t.into_data().iter::<f32>().collect::<Vec<_>>();
    assert_eq!(on_device(params.floats.tensor()), floats);
    let ids: Vec<i64> = params.ints.tensor().into_data().iter::<i64>().collect();
    assert_eq!(ids, ints.iter().map(|&x| i64::from(x)).collect::<Vec<_>>());
}

#[test]
fn padding_rows_are_greedy_and_not_read_back() {
    let row: &[f32] = &[0.1f32.ln(), 0.6f32.ln(), 0.3f32.ln()];
    let pad: &[f32] = &[9.0, 0.0, 0.0];
    let l = logits(&[row, pad, pad]);
    assert_eq!(pick(l, &[s(1.0, 1, 1.0, 1)]), [1]);
}
