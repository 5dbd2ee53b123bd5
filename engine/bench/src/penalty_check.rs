//! `--check-kernels`, the row options part: the sampling kernel reading a
//! penalty slot table of counts and logit biases
//! (`ember_engine::sampling::penalty_state`) against the same kernel on
//! logits biased and penalized on the host (the f32 operations of
//! `ember_engine::sampling::transforms`), greedy and sampled rows; the
//! count kernel's update of the table; and allowed-token masks
//! (`ember_engine::sampling::mask_rows`) against the host sampler with the
//! same masks. Tokens must be equal for >= 99.5% of rows (an ulp at a near
//! tie may differ), the update exact, and no masked row may pick a token
//! its mask excludes.

#[cfg(feature = "cuda")]
pub use cuda::run;

#[cfg(feature = "cuda")]
mod cuda {
    use burn::prelude::*;
    use burn::tensor::DType;
    use ember_engine::ops::cuda::{count_chosen, sample_rows};
    use ember_engine::ops::row_params::{
        self, slot_row_len, RowParams, RowPenalty, COUNT_MASK, FLOAT_COLS, INT_COLS, IN_PROMPT,
    };
    use ember_engine::sampling::row_sampler::trace_rows_host;
    use serde_json::json;

    use crate::check_data::{floats, ints, normal};

    /// A deterministic table entry for (row, token): most tokens absent,
    /// some in the prompt, some with output counts up to 3.
    fn entry(row: usize, token: usize) -> u32 {
        let h = (row as u32).wrapping_mul(0x9E37_79B9) ^ (token as u32).wrapping_mul(0x85EB_CA6B);
        let h = h ^ (h >> 15);
        match h % 40 {
            0 => IN_PROMPT,
            1 => 1,
            2 => 2 | IN_PROMPT,
            3 => 3,
            _ => 0,
        }
    }

    /// A deterministic logit bias for (row, token), on every third row: a
    /// few tokens pushed up or down, one row's token 5 far up.
    fn bias(row: usize, token: usize) -> f32 {
        if !row.is_multiple_of(3) {
            return 0.0;
        }
        let h = (row as u32).wrapping_mul(0x27D4_EB2F) ^ (token as u32).wrapping_mul(0x1656_67B1);
        match (h ^ (h >> 13)) % 64 {
            _ if row == 3 && token == 5 => 100.0,
            0 => 4.5,
            1 => -3.25,
            2 => 0.75,
            _ => 0.0,
        }
    }

    /// `l` penalized as the host edits do (`transforms::apply`).
    fn penalized(l: f32, e: u32, p: &RowPenalty) -> f32 {
        let count = e & COUNT_MASK;
        let x = if l > 0.0 {
            l / p.repetition
        } else {
            l * p.repetition
        };
        x - (p.frequency * count as f32 + if count > 0 { p.presence } else { 0.0 })
    }

    /// The batch's rows: every other one sampled, some with top-k or top-p,
    /// each with one of four penalty settings and a slot of its own.
    fn rows(b: usize) -> (Vec<RowParams>, Vec<RowPenalty>) {
        let mut rows_params = Vec::new();
        let mut penalties = Vec::new();
        let settings = [
            (1.3, 0.0, 0.0),
            (1.0, 0.7, 0.5),
            (1.2, 0.4, 0.6),
            (0.8, -0.5, 1.0),
        ];
        for i in 0..b {
            let sampled = i % 2 == 1;
            rows_params.push(RowParams {
                temperature: if sampled { 1.0 } else { 0.0 },
                top_k: if i % 4 == 3 { 50 } else { 0 },
                top_p: if i % 8 == 1 { 0.9 } else { 1.0 },
                min_p: 0.0,
                seed: 77 + i as u64,
            });
            let (repetition, frequency, presence) = settings[i % settings.len()];
            penalties.push(RowPenalty {
                slot: (b - 1 - i) as u32,
                repetition,
                frequency,
                presence,
                bias: i % 3 == 0,
            });
        }
        (rows_params, penalties)
    }

    /// Runs the comparison; returns the report (`ok` as described above).
    pub fn run(dev: &Device, say: &dyn Fn(String)) -> serde_json::Value {
        let (b, v) = (64usize, 50_257usize);
        let (rows_params, penalties) = rows(b);
        let plain_cols = row_params::columns(&rows_params, &[], b);
        let mut cols = plain_cols.clone();
        for (i, p) in penalties.iter().enumerate() {
            p.write_into(&mut cols, i);
        }
        // Slot `b - 1 - i` holds batch row `i`'s counts, then its bias.
        let w = slot_row_len(v);
        let mut table = vec![0i32; b * w];
        for (i, p) in penalties.iter().enumerate() {
            let at = p.slot as usize * w;
            for t in 0..v {
                table[at + t] = entry(i, t) as i32;
                table[at + v + t] = bias(i, t).to_bits() as i32;
            }
        }
        let logits = normal([b, v], dev).mul_scalar(3.0).cast(DType::F16);
        let host = floats(logits.clone());
        let mut edited = host.clone();
        for (i, p) in penalties.iter().enumerate() {
            for t in 0..v {
                let (e, add) = (entry(i, t), bias(i, t));
                let mut x = host[i * v + t];
                if p.bias {
                    x += add;
                }
                if e != 0 {
                    x = penalized(x, e, p);
                }
                edited[i * v + t] = x;
            }
        }
        let float_cols = |f: Vec<f32>| {
            Tensor::<2>::from_data(TensorData::new(f, [b, FLOAT_COLS]), (dev, DType::F32))
        };
        let positions = ints((0..b as i32).map(|i| 3 + 5 * i).collect(), [b], dev);
        let counts = ints(table.clone(), [b, w], dev);
        let int_cols = ints(cols.1.clone(), [b, INT_COLS], dev);
        let device_ids = sample_rows(
            logits,
            float_cols(cols.0.clone()),
            int_cols.clone(),
            positions.clone(),
            None,
            Some(counts.clone()),
            None,
        );
        let edited = Tensor::<2>::from_data(TensorData::new(edited, [b, v]), (dev, DType::F32));
        let host_ids = sample_rows(
            edited,
            float_cols(plain_cols.0.clone()),
            ints(plain_cols.1.clone(), [b, INT_COLS], dev),
            positions,
            None,
            None,
            None,
        );
        let read = |t: Tensor<2, Int>| -> Vec<i64> { t.into_data().iter::<i64>().collect() };
        let (got, want) = (read(device_ids.clone()), read(host_ids));
        let same = got.iter().zip(&want).filter(|(a, c)| a == c).count();
        // The update: each row's token counted once in its slot, nothing else.
        let _ = count_chosen(counts.clone(), device_ids.clone(), int_cols.clone(), false);
        // Undone and done again: the same table.
        let _ = count_chosen(counts.clone(), device_ids.clone(), int_cols.clone(), true);
        let _ = count_chosen(counts.clone(), device_ids, int_cols, false);
        let after = read(counts);
        let mut expected: Vec<i64> = table.iter().map(|&x| i64::from(x)).collect();
        for (i, p) in penalties.iter().enumerate() {
            expected[p.slot as usize * w + got[i] as usize] += 1;
        }
        let update_ok = after == expected;
        let ok = same * 1000 >= b * 995 && update_ok;
        say(format!(
            "sample_rows with device penalties and biases vs host-edited logits: {same}/{b} tokens equal; count update exact: {update_ok}: {}",
            if ok { "ok" } else { "FAILED" }
        ));
        let masks = masks(dev, say);
        let rows_ok = row_writes(dev, say);
        json!({ "ok": ok, "rows": b, "tokens_equal": same, "count_update_exact": update_ok,
            "masks": masks, "row_writes_ok": rows_ok })
    }

    /// A penalty slot's row written from the host lands in the table the
    /// kernels read (the same memory), other rows untouched.
    fn row_writes(dev: &Device, say: &dyn Fn(String)) -> bool {
        use ember_engine::sampling::PenaltyState;
        let v = 50_257usize;
        let mut state = PenaltyState::new(4, v, dev);
        let table = state.counts();
        let a = state.acquire([(5, 2, false), (50_000, 1, true)], &[]);
        let b = state.acquire([(7, 3, true)], &[(9, -2.0)]);
        let all: Vec<i64> = table.into_data().iter::<i64>().collect();
        let w = slot_row_len(v);
        let row = |s: Option<u32>| s.map(|s| &all[s as usize * w..(s as usize + 1) * w]);
        let nonzero = all.iter().filter(|&&x| x != 0).count();
        let minus_two = i64::from((-2.0f32).to_bits() as i32);
        let ok = row(a).is_some_and(|r| r[5] == 2 && r[50_000] == 1 | IN_PROMPT as i64)
            && row(b).is_some_and(|r| r[7] == 3 | IN_PROMPT as i64 && r[v + 9] == minus_two)
            && nonzero == 4;
        say(format!(
            "penalty slot rows written in place (read through the handle taken before): {}",
            if ok { "ok" } else { "FAILED" }
        ));
        ok
    }

    /// Masked rows (every other row; about a third of the tokens allowed,
    /// one row with a single token) against the host sampler.
    fn masks(dev: &Device, say: &dyn Fn(String)) -> serde_json::Value {
        let (b, v) = (64usize, 50_257usize);
        let w = v.div_ceil(32);
        let params: Vec<RowParams> = (0..b)
            .map(|i| RowParams {
                temperature: if i % 4 < 2 { 0.0 } else { 1.0 },
                top_k: if i % 8 == 2 { 50 } else { 0 },
                top_p: if i % 8 == 6 { 0.9 } else { 1.0 },
                min_p: 0.0,
                seed: 5 + i as u64,
            })
            .collect();
        let masked: Vec<bool> = (0..b).map(|i| i % 2 == 0).collect();
        let mut words = vec![0u32; b * w];
        for i in 0..b {
            for t in 0..v {
                let keep = if i == 4 {
                    t == 1234
                } else {
                    entry(i + 7, t) != 0 || t % 3 == 0
                };
                if keep {
                    words[i * w + t / 32] |= 1 << (t % 32);
                }
            }
        }
        let cols = row_params::columns(&params, &masked, b);
        let logits = normal([b, v], dev).mul_scalar(3.0).cast(DType::F16);
        let host = floats(logits.clone());
        let positions: Vec<i32> = (0..b as i32).map(|i| 11 + 3 * i).collect();
        let ids = sample_rows(
            logits,
            Tensor::<2>::from_data(
                TensorData::new(cols.0.clone(), [b, FLOAT_COLS]),
                (dev, DType::F32),
            ),
            ints(cols.1.clone(), [b, INT_COLS], dev),
            ints(positions.clone(), [b], dev),
            Some(ints(words.iter().map(|&x| x as i32).collect(), [b, w], dev)),
            None,
            None,
        );
        let got: Vec<i64> = ids.into_data().iter::<i64>().collect();
        let want = trace_rows_host(&host, v, &cols.0, &cols.1, &positions, Some(&words));
        let same = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| **g as u32 == w.token)
            .count();
        let outside = (0..b)
            .filter(|&i| masked[i] && words[i * w + got[i] as usize / 32] >> (got[i] % 32) & 1 == 0)
            .count();
        let ok = same * 1000 >= b * 995 && outside == 0 && got[4] == 1234;
        say(format!(
            "sample_rows with allowed-token masks vs the host sampler: {same}/{b} tokens equal, {outside} outside a mask: {}",
            if ok { "ok" } else { "FAILED" }
        ));
        json!({ "ok": ok, "rows": b, "tokens_equal": same, "outside_mask": outside })
    }
}
