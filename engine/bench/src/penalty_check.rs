//! `--check-kernels`, the penalties part: the sampling kernel reading a
//! penalty counts table (`ember_engine::sampling::penalty_state`) against
//! the same kernel on logits penalized on the host (the f32 operations of
//! `ember_engine::sampling::transforms`), greedy and sampled rows, and the
//! count kernel's update of the table. Tokens must be equal for >= 99.5%
//! of rows (an ulp at a near tie may differ) and the update exact.

#[cfg(feature = "cuda")]
pub use cuda::run;

#[cfg(feature = "cuda")]
mod cuda {
    use burn::prelude::*;
    use burn::tensor::DType;
    use ember_engine::ops::cuda::{count_chosen, sample_rows};
    use ember_engine::ops::row_params::{
        self, RowParams, RowPenalty, COUNT_MASK, FLOAT_COLS, INT_COLS, IN_PROMPT,
    };
    use serde_json::json;

    use crate::check_data::{ints, normal};

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

    /// Runs the comparison; returns the report (`ok` as described above).
    pub fn run(dev: &Device, say: &dyn Fn(String)) -> serde_json::Value {
        let (b, v) = (64usize, 50_257usize);
        let mut rows_params = Vec::new();
        let mut penalties = Vec::new();
        for i in 0..b {
            let sampled = i % 2 == 1;
            rows_params.push(RowParams {
                temperature: if sampled { 1.0 } else { 0.0 },
                top_k: if i % 4 == 3 { 50 } else { 0 },
                top_p: if i % 8 == 1 { 0.9 } else { 1.0 },
                min_p: 0.0,
                seed: 77 + i as u64,
            });
            let settings = [
                (1.3, 0.0, 0.0),
                (1.0, 0.7, 0.5),
                (1.2, 0.4, 0.6),
                (0.8, -0.5, 1.0),
            ];
            let (repetition, frequency, presence) = settings[i % settings.len()];
            penalties.push(RowPenalty {
                slot: (b - 1 - i) as u32,
                repetition,
                frequency,
                presence,
            });
        }
        let plain_cols = row_params::columns(&rows_params, &[], b);
        let mut cols = plain_cols.clone();
        for (i, p) in penalties.iter().enumerate() {
            p.write_into(&mut cols, i);
        }
        // Counts: row `slot` holds the entries of batch row `b - 1 - slot`.
        let mut table = vec![0i32; b * v];
        for (i, p) in penalties.iter().enumerate() {
            for t in 0..v {
                table[p.slot as usize * v + t] = entry(i, t) as i32;
            }
        }
        let logits = normal([b, v], dev).mul_scalar(3.0).cast(DType::F16);
        let host: Vec<f32> = logits
            .clone()
            .cast(DType::F32)
            .into_data()
            .iter::<f32>()
            .collect();
        let mut edited = host.clone();
        for (i, p) in penalties.iter().enumerate() {
            for t in 0..v {
                let e = entry(i, t);
                if e != 0 {
                    edited[i * v + t] = penalized(host[i * v + t], e, p);
                }
            }
        }
        let floats = |f: Vec<f32>| {
            Tensor::<2>::from_data(TensorData::new(f, [b, FLOAT_COLS]), (dev, DType::F32))
        };
        let positions = ints((0..b as i32).map(|i| 3 + 5 * i).collect(), [b], dev);
        let counts = ints(table.clone(), [b, v], dev);
        let int_cols = ints(cols.1.clone(), [b, INT_COLS], dev);
        let device_ids = sample_rows(
            logits,
            floats(cols.0.clone()),
            int_cols.clone(),
            positions.clone(),
            None,
            Some(counts.clone()),
            None,
        );
        let edited = Tensor::<2>::from_data(TensorData::new(edited, [b, v]), (dev, DType::F32));
        let host_ids = sample_rows(
            edited,
            floats(plain_cols.0.clone()),
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
        let _ = count_chosen(counts.clone(), device_ids, int_cols);
        let after = read(counts);
        let mut expected: Vec<i64> = table.iter().map(|&x| i64::from(x)).collect();
        for (i, p) in penalties.iter().enumerate() {
            expected[p.slot as usize * v + got[i] as usize] += 1;
        }
        let update_ok = after == expected;
        let ok = same * 1000 >= b * 995 && update_ok;
        say(format!(
            "sample_rows with device penalties vs host-penalized logits: {same}/{b} tokens equal; count update exact: {update_ok}: {}",
            if ok { "ok" } else { "FAILED" }
        ));
        json!({ "ok": ok, "rows": b, "tokens_equal": same, "count_update_exact": update_ok })
    }
}
