//! `--check-kernels`, the sampler part: the `sample_rows` kernel against its
//! spec, the host row sampler (`ember_engine::sampling::row_sampler`), on
//! identical f16 logits and parameter columns, and its cost beside an argmax.
//!
//! Rows mix greedy, temperature-only, top-k, top-p, min-p and their
//! combinations, each at several positions (so many draws per setting). The
//! kernel runs twice on each batch: with the trace (every pass) and without
//! (top-p rows without top-k try the rejection shortcut first). Its per-pass
//! keys (`trace`) must equal the host's; both runs' tokens must lie in the
//! host's kept set always, and equal the host's token except where the
//! device's `ln` and the host's differ by an ulp at a near tie (counted and
//! printed, a pass needs >= 99.5% equal; traces too, for a top-p mass
//! within rounding of its bound).

#[cfg(feature = "cuda")]
pub use cuda::run;

#[cfg(feature = "cuda")]
mod cuda {
    use burn::prelude::*;
    use burn::tensor::DType;
    use ember_engine::ops::cuda::sample_rows;
    use ember_engine::ops::row_params::{self, RowParams, FLOAT_COLS, INT_COLS, TRACE_COLS};
    use ember_engine::ops::vocab::argmax_rows;
    use ember_engine::sampling::row_sampler::{key_of, trace_rows_host};
    use serde_json::json;

    use crate::check_data::{floats, ints, normal};

    /// The settings each block of rows cycles through: (temperature, top_k,
    /// top_p, min_p).
    const SETTINGS: [(f32, u32, f32, f32); 10] = [
        (0.0, 0, 1.0, 0.0),
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.0),
        (1.0, 50, 1.0, 0.0),
        (1.0, 0, 0.9, 0.0),
        (1.0, 0, 1.0, 0.05),
        (1.0, 50, 0.9, 0.0),
        (0.8, 40, 0.95, 0.02),
        (1.3, 3, 0.5, 0.0),
        (1.0, 1000, 0.99, 0.1),
    ];

    /// Host copies of a batch's inputs.
    struct Batch {
        logits: Tensor<2>,
        floats: Vec<f32>,
        ints: Vec<i32>,
        positions: Vec<i32>,
    }

    fn batch(b: usize, v: usize, scale: f32, pos0: i32, dev: &Device) -> Batch {
        let params: Vec<RowParams> = (0..b)
            .map(|i| {
                let (temperature, top_k, top_p, min_p) = SETTINGS[i % SETTINGS.len()];
                RowParams {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                    seed: 1000 + i as u64,
                }
            })
            .collect();
        let (floats, ints) = row_params::columns(&params, &[], b);
        let logits = normal([b, v], dev).mul_scalar(scale).cast(DType::F16);
        let positions = (0..b as i32).map(|i| pos0 + 7 * i).collect();
        Batch {
            logits,
            floats,
            ints,
            positions,
        }
    }

    /// Runs the kernel on `batch` with the trace (every pass run) and
    /// without (top-p rows try the rejection shortcut first): both runs'
    /// ids and the trace, on the host.
    fn kernel(batch: &Batch, dev: &Device) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let b = batch.positions.len();
        let floats = Tensor::<2>::from_data(
            TensorData::new(batch.floats.clone(), [b, FLOAT_COLS]),
            (dev, DType::F32),
        );
        let int_cols = ints(batch.ints.clone(), [b, INT_COLS], dev);
        let positions = ints(batch.positions.clone(), [b], dev);
        let trace = ints(vec![0; b * TRACE_COLS], [b, TRACE_COLS], dev);
        let ids = sample_rows(
            batch.logits.clone(),
            floats.clone(),
            int_cols.clone(),
            positions.clone(),
            None,
            None,
            Some(trace.clone()),
        );
        let plain = sample_rows(
            batch.logits.clone(),
            floats,
            int_cols,
            positions,
            None,
            None,
            None,
        );
        let host = |t: Tensor<2, Int>| -> Vec<u32> {
            t.into_data().iter::<i64>().map(|x| x as u32).collect()
        };
        (host(ids), host(trace), host(plain))
    }

    /// One batch: (rows, equal tokens, equal traces, tokens outside the kept set).
    fn compare(batch: &Batch, v: usize, dev: &Device) -> (usize, usize, usize, usize) {
        let (ids, trace, plain) = kernel(batch, dev);
        let host_logits: Vec<f32> = batch
            .logits
            .clone()
            .cast(DType::F32)
            .into_data()
            .iter::<f32>()
            .collect();
        let want = trace_rows_host(
            &host_logits,
            v,
            &batch.floats,
            &batch.ints,
            &batch.positions,
            None,
        );
        let b = want.len();
        let (mut same, mut same_trace, mut outside) = (0, 0, 0);
        for (i, w) in want.iter().enumerate() {
            let t = &trace[i * TRACE_COLS..(i + 1) * TRACE_COLS];
            same_trace += usize::from(t == [w.argmax, w.tau_k, w.top_p, w.threshold]);
            let temperature = batch.floats[i * FLOAT_COLS];
            for token in [ids[i], plain[i]] {
                same += usize::from(token == w.token);
                let l = host_logits[i * v + token as usize];
                let s = if temperature > 0.0 {
                    l / temperature
                } else {
                    l
                };
                outside += usize::from(key_of(s) < w.threshold);
            }
        }
        (b, same, same_trace, outside)
    }

    /// Mean milliseconds of `f` over `n` runs after a warm run, synced.
    fn time(dev: &Device, n: usize, mut f: impl FnMut()) -> f64 {
        f();
        let _ = dev.sync();
        let started = std::time::Instant::now();
        for _ in 0..n {
            f();
        }
        let _ = dev.sync();
        started.elapsed().as_secs_f64() * 1e3 / n as f64
    }

    /// The kernel's launch time beside an argmax, `[b, v]` f16, all rows
    /// sampled (temperature 1, top_p 0.9) or all greedy.
    fn timings(b: usize, v: usize, dev: &Device) -> serde_json::Value {
        let data = batch(b, v, 3.0, 5, dev);
        let cols = |settings: RowParams| {
            let (f, i) = row_params::columns(&vec![settings; b], &[], b);
            (
                Tensor::<2>::from_data(TensorData::new(f, [b, FLOAT_COLS]), (dev, DType::F32)),
                ints(i, [b, INT_COLS], dev),
            )
        };
        let positions = ints(data.positions.clone(), [b], dev);
        let base = RowParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            min_p: 0.0,
            seed: 7,
        };
        let run = |p: RowParams| {
            let (f, i) = cols(p);
            let (l, pos) = (data.logits.clone(), positions.clone());
            time(dev, 50, || {
                let _ = sample_rows(
                    l.clone(),
                    f.clone(),
                    i.clone(),
                    pos.clone(),
                    None,
                    None,
                    None,
                );
            })
        };
        let greedy = run(RowParams {
            temperature: 0.0,
            ..base
        });
        let temperature = run(RowParams { top_p: 1.0, ..base });
        let top_p = run(base);
        let top_k = run(RowParams {
            top_k: 50,
            top_p: 1.0,
            ..base
        });
        let min_p = run(RowParams {
            min_p: 0.05,
            top_p: 1.0,
            ..base
        });
        let l = data.logits.clone();
        let argmax = time(dev, 50, || {
            let _ = l.clone().argmax(1);
        });
        json!({ "rows": b, "argmax_ms": argmax, "greedy_ms": greedy, "temperature_ms": temperature,
            "top_p_ms": top_p, "top_k_ms": top_k, "min_p_ms": min_p })
    }

    /// The host's argmax of a row (the lowest index of a tie; NaN absent;
    /// 0 for a row of NaNs).
    fn host_argmax(row: &[f32]) -> u32 {
        let mut best: Option<(f32, usize)> = None;
        for (i, &x) in row.iter().enumerate() {
            if !x.is_nan() && best.is_none_or(|(m, _)| x > m) {
                best = Some((x, i));
            }
        }
        best.map_or(0, |(_, i)| i as u32)
    }

    /// Ember's argmax (`ops::vocab::argmax_rows`, split into parts at few
    /// rows) against the host's on f16 rows of `v`: random rows, rows whose
    /// maximum appears twice half a row apart (two parts) and, past one row,
    /// a row of NaNs. Returns (rows equal, rows, ms per launch).
    fn argmax_check(b: usize, v: usize, dev: &Device) -> (usize, usize, f64) {
        let mut host = floats(normal([b, v], dev).mul_scalar(3.0));
        for r in 0..b {
            let row = &mut host[r * v..(r + 1) * v];
            if r % 3 == 1 {
                let first = (r * 7919 + 11) % (v / 2);
                row[first + v / 2] = 30.0;
                row[first] = 30.0;
            }
            if b > 1 && r == b - 1 {
                row.fill(f32::NAN);
            }
        }
        let logits = Tensor::<2>::from_data(TensorData::new(host, [b, v]), dev).cast(DType::F16);
        let rounded = floats(logits.clone());
        let got: Vec<i64> = argmax_rows(logits.clone())
            .into_data()
            .iter::<i64>()
            .collect();
        let equal = (0..b)
            .filter(|&r| got[r] == i64::from(host_argmax(&rounded[r * v..(r + 1) * v])))
            .count();
        let ms = time(dev, 50, || {
            let _ = argmax_rows(logits.clone());
        });
        (equal, b, ms)
    }

    /// Runs the comparison and the timings; `ok` when every kept-set check
    /// passes, the traces agree and >= 99.5% of tokens are equal.
    pub fn run(dev: &Device, say: &dyn Fn(String)) -> serde_json::Value {
        let v = 50257;
        let (mut rows, mut same, mut same_trace, mut outside) = (0, 0, 0, 0);
        for (round, scale) in [1.0f32, 3.0, 8.0, 0.3].into_iter().enumerate() {
            let data = batch(256, v, scale, 1 + 1000 * round as i32, dev);
            let (r, s, t, o) = compare(&data, v, dev);
            rows += r;
            same += s;
            same_trace += t;
            outside += o;
        }
        // Two kernel runs per row (with and without the trace).
        let draws = 2 * rows;
        // A top-p threshold whose cumulative mass is within rounding of
        // `p Z` may land one key apart (sums in another order): as rare as
        // a token's near tie, and held to the same bar.
        let ok = outside == 0 && same_trace * 1000 >= rows * 995 && same * 1000 >= draws * 995;
        say(format!(
            "sample_rows vs the host sampler: {same}/{draws} tokens equal (with and without the trace), {same_trace}/{rows} traces equal, {outside} outside the kept set: {}",
            if ok { "ok" } else { "FAILED" }
        ));
        let (mut argmax_equal, mut argmax_rows_seen) = (0, 0);
        for b in [1usize, 8, 64, 200] {
            let (e, r, ms) = argmax_check(b, v, dev);
            argmax_equal += e;
            argmax_rows_seen += r;
            say(format!(
                "vocab argmax at {b} rows: {e}/{r} rows equal to the host's, {ms:.4} ms a launch"
            ));
        }
        let ok = ok && argmax_equal == argmax_rows_seen;
        let times: Vec<serde_json::Value> = [1usize, 64, 256]
            .into_iter()
            .map(|b| {
                let t = timings(b, v, dev);
                say(format!("sample_rows timing: {t}"));
                t
            })
            .collect();
        json!({ "ok": ok, "rows": rows, "draws": draws, "tokens_equal": same, "traces_equal": same_trace,
            "outside_kept_set": outside, "argmax_rows_equal": argmax_equal, "argmax_rows": argmax_rows_seen,
            "timings": times })
    }
}
