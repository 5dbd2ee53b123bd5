//! `--check-kernels`: the CubeCL paged decode attention and KV write (and the
//! projections, LayerNorm, causal prefill attention and the sampler,
//! `crate::sample_check`) against
//! the tensor-op reference (gather through the block tables + mask + Burn's
//! attention; `select_assign`), on random data on the device. Ragged context
//! lengths (1 to the full table), blocks in scattered order, f16 on CUDA.
//! Prefill attention prints one line per case (fresh ragged rows, a chunk
//! after cached positions, prefix hits, shared blocks, the engine's padding),
//! so one run tells which fails.

use ember_engine::EngineDevice;

/// Runs the checks and returns their numbers.
pub fn run(device: &EngineDevice) -> anyhow::Result<serde_json::Value> {
    #[cfg(feature = "cuda")]
    {
        cuda::run(device)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        anyhow::bail!("--check-kernels needs a CUDA build (--features ember-engine-bench/cuda)")
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn::prelude::*;
    use burn::tensor::Distribution;
    use ember_engine::model::LayerKv;
    use ember_engine::ops::cuda::{
        decode_linear, layer_norm_rows, lt_linear, paged_decode_attention, prefill_attention,
    };
    use ember_engine::ops::plan::{self, LinearPlan};
    use ember_engine::ops::{
        reference, Epilogue, LinearKernel, Ops, PagedContext, SegmentContext, SegmentPadding,
        SegmentRow, TableGeometry,
    };
    use ember_engine::{EngineDevice, KernelTuning};

    use crate::check_data::{floats, ints, max_diff, normal, BLOCK};
    use crate::kv_write_check::{fused_write_check, kv_write_check};
    use crate::prefill_reference::{self, PagedStep};
    use serde_json::json;

    /// Max |kernel - reference| of paged decode attention for one batch.
    fn attention_check(
        tuning: &KernelTuning,
        qkv: &Tensor<2>,
        cache: &LayerKv,
        paged: &PagedContext,
        h: usize,
    ) -> f32 {
        let [b, e3] = qkv.dims();
        let got = paged_decode_attention(tuning, qkv.clone(), &cache.k, &cache.v, paged, h, None);
        let q = qkv.clone().slice([0..b, 0..e3 / 3]);
        let want = reference::decode_attention(q, &cache.k, &cache.v, paged, h);
        max_diff(floats(got), floats(want))
    }

    pub fn run(device: &EngineDevice) -> anyhow::Result<serde_json::Value> {
        let dev = &device.device;
        let tuning = device.ops.tuning();
        let (h, d) = (12usize, 64usize);
        let lens = vec![256i32, 1, 17, 100, 255, 16, 33];
        // Each line is printed (and flushed) as its check finishes, with its
        // seconds, so a run cut short still tells what passed and what hung.
        let started = std::time::Instant::now();
        let say = |line: String| {
            use std::io::Write;
            println!("  {line} [{:.0} s]", started.elapsed().as_secs_f64());
            let _ = std::io::stdout().flush();
        };
        println!(
            "device {}: kernel check (H {h}, D {d}, block {BLOCK}, lens {lens:?}, and x10)",
            device.name
        );
        // The sampler first: the newest kernel, and its line is then never
        // lost to a timeout of the slower checks after it.
        let graph = graph_checks(h, dev, &say);
        let sampler = crate::sample_check::run(dev, &say);
        let penalties = crate::penalty_check::run(dev, &say);
        let vocab = crate::vocab_check::run(dev, &say);
        // The quick kernel checks before the slow ones (decode attention
        // over many lengths, the projections over 1 to 4,096 rows).
        let ln_diff = layer_norm_check(dev);
        say(format!(
            "layer norm: max |kernel - tensor ops| = {ln_diff:e}"
        ));
        let prefill = prefill_checks(h, dev, &say);
        let (attention_diff, split_diff, counters_left) = attention_checks(tuning, &lens, dev);
        say(format!(
            "paged decode attention: max |kernel - reference| = {attention_diff:e}"
        ));
        say(format!("paged decode attention, contexts split across cubes: max |kernel - reference| = {split_diff:e}; counters left at zero: {}", counters_left == 0));
        let (fused_diff, fused_cache_diff) = fused_write_check(tuning, &lens, h, d, dev);
        say(format!("paged decode attention with the KV write folded in (split and unsplit): max |kernel - kv write + reference| = {fused_diff:e}; cache written: max diff {fused_cache_diff:e}"));
        let (write_diff, in_place) = kv_write_check(lens.len(), h, d, dev);
        say(format!(
            "kv write: max |kernel - select_assign| = {write_diff:e}; in place: {in_place}"
        ));
        let lt_diff = device
            .ops
            .cublaslt()
            .then(|| projection_check(&device.ops, dev, ProjectionKernel::Lt));
        say(match lt_diff {
            Some(d) => format!("cuBLASLt projection (bias, GELU, residual; 1 to 4,096 rows): max |cuBLASLt - tensor ops| = {d:e}"),
            None => "cuBLASLt projection: not checked (cuBLASLt unavailable or --cublaslt false)".to_string(),
        });
        let gemv_diff = projection_check(&device.ops, dev, ProjectionKernel::Ember);
        say(format!("decode GEMV and tensor-core projection (bias, GELU, residual): max |kernel - tensor ops| = {gemv_diff:e}"));
        Ok(json!({
            "device": device.name,
            "prefill_graph": graph,
            "sampler": sampler,
            "penalties": penalties,
            "vocab": vocab,
            "attention_max_abs_diff": attention_diff,
            "split_attention_max_abs_diff": split_diff,
            "split_attention_counters_zero": counters_left == 0,
            "fused_write_attention_max_abs_diff": fused_diff,
            "fused_write_cache_max_abs_diff": fused_cache_diff,
            "kv_write_max_abs_diff": write_diff,
            "kv_write_in_place": in_place,
            "gemv_max_abs_diff": gemv_diff,
            "cublaslt_max_abs_diff": lt_diff,
            "layer_norm_max_abs_diff": ln_diff,
            "prefill_attention_max_abs_diff": prefill.iter().map(|c| c.1).fold(0.0f32, f32::max),
            "prefill_attention_cases": prefill
                .iter()
                .map(|(case, diff)| json!({"case": case, "max_abs_diff": diff}))
                .collect::<Vec<_>>(),
        }))
    }

    /// The KV write and prefill attention replayed from graphs captured over
    /// padding-only segment buffers, against eager launches over the rows
    /// written into them since (`crate::graph_attention_check`).
    fn graph_checks(h: usize, dev: &Device, say: &dyn Fn(String)) -> serde_json::Value {
        use crate::graph_attention_check::graph_segment_check;
        let alone = graph_segment_check(false, h, dev);
        let written = graph_segment_check(true, h, dev);
        let in_place = alone.buffers_written_in_place && written.buffers_written_in_place;
        say(format!("prefill attention replayed from a graph captured over padding-only buffers: max |replayed - eager| = {:e}; with the KV write before it: {:e}; buffers written in place: {in_place}", alone.output_diff, written.output_diff));
        json!({"attention_max_abs_diff": alone.output_diff,
               "write_and_attention_max_abs_diff": written.output_diff,
               "buffers_written_in_place": in_place})
    }

    /// Paged decode attention against the reference: unsplit, split across
    /// cubes (twice on the same counters, then one sequence), and a batch
    /// ten times larger. Returns (unsplit diff, split diff, counters left).
    fn attention_checks(tuning: &KernelTuning, lens: &[i32], dev: &Device) -> (f32, f32, i64) {
        let (h, d, bs, blocks, w) = (12usize, 64usize, BLOCK, 80usize, 16usize);
        let e = h * d;
        let lens = lens.to_vec();
        let b = lens.len();
        let cache = LayerKv {
            k: normal([h, blocks * bs, d], dev),
            v: normal([h, blocks * bs, d], dev),
        };
        // Row i's table: blocks (7 * (i * w + j) + 3) mod blocks, scattered.
        let tables: Vec<i32> = (0..b * w).map(|i| ((7 * i + 3) % blocks) as i32).collect();
        let unsplit = PagedContext {
            tables: ints(tables, [b, w], dev),
            lens: ints(lens.clone(), [b], dev),
            block_size: bs,
            max_context: w * bs,
            arrivals: None,
        };
        let qkv = normal([b, 3 * e], dev);

        let mut attention_diff = attention_check(tuning, &qkv, &cache, &unsplit, h);
        // The same batch with each context split across cubes (84 pairs: 4
        // splits by default), twice on the same counters: the second launch
        // only finds its last cube if the first left the counters at zero.
        let paged = PagedContext {
            arrivals: Some(Tensor::zeros([b * h], dev)),
            ..unsplit
        };
        let mut split_diff = attention_check(tuning, &qkv, &cache, &paged, h);
        split_diff = split_diff.max(attention_check(tuning, &qkv, &cache, &paged, h));
        // One sequence (12 pairs: 16 splits), full and one-token contexts.
        for len in [256, 1, 40] {
            let one = PagedContext {
                tables: paged.tables.clone().slice([0..1, 0..w]),
                lens: ints(vec![len], [1], dev),
                ..paged.clone()
            };
            let q1 = qkv.clone().slice([0..1, 0..3 * e]);
            split_diff = split_diff.max(attention_check(tuning, &q1, &cache, &one, h));
        }
        let counters_left: i64 = paged
            .arrivals
            .clone()
            .map_or(0, |c| c.abs().sum().into_scalar::<i64>());
        // A large batch (the kernel's other warp count): the same rows, ten times.
        let big = 10 * b;
        let big_lens: Vec<i32> = (0..big).map(|i| lens[i % b]).collect();
        let big_tables: Vec<i32> = (0..big * w)
            .map(|i| ((7 * i + 3) % blocks) as i32)
            .collect();
        let big_paged = PagedContext {
            tables: ints(big_tables, [big, w], dev),
            lens: ints(big_lens, [big], dev),
            block_size: bs,
            max_context: w * bs,
            arrivals: Some(Tensor::zeros([big * h], dev)),
        };
        let big_qkv = normal([big, 3 * e], dev);
        attention_diff =
            attention_diff.max(attention_check(tuning, &big_qkv, &cache, &big_paged, h));

        (attention_diff, split_diff, counters_left)
    }

    /// Blocks of the prefill checks' cache (the last one is the padding block).
    const PREFILL_BLOCKS: usize = 200;
    /// Blocks per table: GPT-2's 1024 positions.
    const PREFILL_WIDTH: usize = 1024 / BLOCK;

    /// Max |kernel - reference| of prefill attention over rows `(tokens,
    /// start)` with block tables `tables` (one per row), padded to `padding`
    /// and to `tokens` flat tokens when given, `h` heads of `d` dimensions:
    /// random K/V in the cache, random `qkv`, both read by both sides.
    fn segment_check(
        rows: &[(usize, usize)],
        tables: &[Vec<u32>],
        padding: (SegmentPadding, Option<usize>),
        (h, d): (usize, usize),
        dev: &Device,
    ) -> f32 {
        let e = h * d;
        let slots = PREFILL_BLOCKS * BLOCK;
        let cache = LayerKv {
            k: normal([h, slots, d], dev),
            v: normal([h, slots, d], dev),
        };
        let real: usize = rows.iter().map(|r| r.0).sum();
        let (padding, tokens) = padding;
        let t = tokens.unwrap_or(real);
        let qkv = normal([t, 3 * e], dev);
        let segment_rows: Vec<SegmentRow<'_>> = rows
            .iter()
            .zip(tables)
            .map(|(&(queries, start), table)| SegmentRow {
                queries,
                start,
                table,
            })
            .collect();
        let geometry = TableGeometry {
            block_size: BLOCK,
            width: PREFILL_WIDTH,
            padding_block: (PREFILL_BLOCKS - 1) as u32,
        };
        let seg = SegmentContext::new(&segment_rows, padding, geometry, dev);
        let (q_host, k_host, v_host) = (
            floats(qkv.clone()),
            floats(cache.k.clone()),
            floats(cache.v.clone()),
        );
        let step = PagedStep {
            qkv: &q_host,
            k: &k_host,
            v: &v_host,
            heads: h,
            head_dim: d,
            slots,
            block: BLOCK,
        };
        let want = prefill_reference::prefill_attention(&step, rows, tables, t);
        let got = prefill_attention(qkv.clone(), &cache.k, &cache.v, &seg);
        max_diff(floats(got), want)
    }

    /// Scattered tables: entry `j` of row `r` is block `(7 (64 r + j) + 3)
    /// mod 199`, never the padding block.
    fn scattered_tables(rows: usize) -> Vec<Vec<u32>> {
        (0..rows)
            .map(|r| {
                (0..PREFILL_WIDTH)
                    .map(|j| ((7 * (r * PREFILL_WIDTH + j) + 3) % (PREFILL_BLOCKS - 1)) as u32)
                    .collect()
            })
            .collect()
    }

    /// Prefill attention against the reference, one named case each: fresh
    /// rows of ragged lengths, a chunk after cached positions, prefix-cache
    /// hits, blocks shared between rows in reverse order, and the engine's
    /// padding (token bucket, rows, tiles), then head dimensions below 64
    /// (the tiny model's 4 x 16, and 8 x 32). `say` prints each case's line
    /// as it finishes.
    fn prefill_checks(h: usize, dev: &Device, say: &dyn Fn(String)) -> Vec<(String, f32)> {
        let exact = (
            SegmentPadding {
                rows: 0,
                tiles: None,
            },
            None,
        );
        let fresh = [(1, 0), (17, 0), (64, 0), (100, 0), (256, 0)];
        let chunk = [(60, 100), (33, 0)];
        let hits = [(33, 192), (16, 1008), (1, 500)];
        // Two rows sharing their first 4 blocks (a prefix hit on the same
        // prompt), tables walking the pool backwards.
        let shared: Vec<Vec<u32>> = (0..2)
            .map(|r| {
                (0..PREFILL_WIDTH)
                    .map(|j| match j {
                        0..=3 => (190 - 13 * j) as u32,
                        _ => (PREFILL_BLOCKS - 2 - 2 * j - r) as u32 % 190,
                    })
                    .collect()
            })
            .collect();
        let mixed: Vec<(usize, usize)> = [&fresh[..], &chunk[..], &hits[..]].concat();
        let tokens: usize = mixed.iter().map(|r| r.0).sum();
        let bucket = tokens.next_power_of_two();
        let padded = (
            SegmentPadding {
                rows: 64,
                tiles: Some(plan::prefill_tile_bound(bucket, 64)),
            },
            Some(bucket),
        );
        let cases: [PrefillCase<'_>; 7] = [
            (
                "fresh rows of 1, 17, 64, 100, 256 tokens".to_string(),
                &fresh,
                scattered_tables(5),
                exact,
                (h, 64),
            ),
            (
                "a 60-token chunk after 100 cached positions, and a fresh row".into(),
                &chunk,
                scattered_tables(2),
                exact,
                (h, 64),
            ),
            (
                "prefix hits: 33 tokens after 192, 16 after 1008, 1 after 500".into(),
                &hits,
                scattered_tables(3),
                exact,
                (h, 64),
            ),
            (
                "shared and backward blocks: 130 fresh, 70 after 64".into(),
                &[(130, 0), (70, 64)],
                shared,
                exact,
                (h, 64),
            ),
            (
                format!("all ten rows padded to {bucket} tokens, 64 rows, padding tiles"),
                &mixed,
                scattered_tables(10),
                padded,
                (h, 64),
            ),
            (
                "head dim 16 (4 heads): fresh rows, a chunk, prefix hits".into(),
                &mixed,
                scattered_tables(10),
                exact,
                (4, 16),
            ),
            (
                "head dim 32 (8 heads): the same rows padded".into(),
                &mixed,
                scattered_tables(10),
                padded,
                (8, 32),
            ),
        ];
        cases
            .into_iter()
            .map(|(case, rows, tables, padding, heads)| {
                let diff = segment_check(rows, &tables, padding, heads, dev);
                say(format!(
                    "prefill attention, {case}: max |kernel - reference| = {diff:e}"
                ));
                (case, diff)
            })
            .collect()
    }

    /// One prefill attention case: its name, rows `(queries, start)`, block
    /// tables, padding and `(heads, head_dim)` (see [`segment_check`]).
    type PrefillCase<'a> = (
        String,
        &'a [(usize, usize)],
        Vec<Vec<u32>>,
        (SegmentPadding, Option<usize>),
        (usize, usize),
    );

    /// Which projection kernels [`projection_check`] runs.
    #[derive(Clone, Copy, PartialEq)]
    enum ProjectionKernel {
        /// Ember's GEMV / tensor-core kernel, as the plan picks.
        Ember,
        /// cuBLASLt.
        Lt,
    }

    /// A projection kernel against tensor ops, with and without bias, GELU
    /// and residual; returns the max diff.
    fn projection_check(ops: &Ops, dev: &Device, kernel: ProjectionKernel) -> f32 {
        let tuning = ops.tuning();
        let mut gemv_diff = 0.0f32;
        let large: &[(usize, usize, usize)] = match kernel {
            ProjectionKernel::Ember => &[],
            ProjectionKernel::Lt => &[(4096, 768, 2304), (4096, 3072, 768), (1024, 768, 50257)],
        };
        for &(rows, k, n) in [
            (1, 768, 2304),
            (1, 768, 50257),
            (3, 768, 768),
            (16, 3072, 768),
            (32, 768, 2304),
            (48, 768, 768),
            (256, 3072, 768),
            (8, 3072, 768),
            (64, 768, 3072),
            (48, 768, 50257),
        ]
        .iter()
        .chain(large)
        {
            let x = normal([rows, k], dev);
            let w = Tensor::<2>::random([n, k], Distribution::Normal(0.0, 0.05), dev);
            let bias = normal([n], dev);
            // The kernel the server would pick (never the matmul at these rows).
            let plan = match plan::linear(tuning, rows, n, k, false) {
                LinearPlan::Matmul => LinearPlan::Gemv,
                p => p,
            };
            let run = |x: Tensor<2>, bias: Option<&Tensor<1>>, gelu, residual| match kernel {
                ProjectionKernel::Ember => decode_linear(x, &w, bias, gelu, residual, plan),
                ProjectionKernel::Lt => lt_linear(x, &w, bias, gelu, residual),
            };
            // The tensor-op product the engine falls back to (CubeCL's matmul).
            let want = ops.run_linear(LinearKernel::Matmul, x.clone(), &w, None, Epilogue::none());
            let got = run(x.clone(), None, false, None);
            gemv_diff = gemv_diff.max(max_diff(floats(got), floats(want.clone())));
            let got = run(x.clone(), Some(&bias), false, None);
            let want = want + bias.clone().unsqueeze();
            gemv_diff = gemv_diff.max(max_diff(floats(got), floats(want.clone())));
            // GELU (c_fc) and the residual (c_proj), as the model uses them.
            let got = run(x.clone(), Some(&bias), true, None);
            gemv_diff = gemv_diff.max(max_diff(
                floats(got),
                floats(reference::gelu_tanh(want.clone())),
            ));
            let residual = normal([rows, n], dev);
            let got = run(x, Some(&bias), true, Some(residual.clone()));
            let want = residual + reference::gelu_tanh(want);
            gemv_diff = gemv_diff.max(max_diff(floats(got), floats(want)));
        }

        gemv_diff
    }

    /// The LayerNorm kernels against the tensor-op LayerNorm on rows with a
    /// few large dimensions: both plans (one cube a row up to
    /// `CUBE_ROWS_MAX` rows, one warp a row past it), at GPT-2's and XL's
    /// widths; returns the max diff.
    fn layer_norm_check(dev: &Device) -> f32 {
        let mut worst = 0.0f32;
        for (rows, e) in [(1, 1600), (37, 768), (300, 768), (8, 1280)] {
            let x = Tensor::<2>::random([rows, e], Distribution::Normal(0.0, 3.0), dev);
            let x = x.clone() + x.slice([0..rows, 0..1]).mul_scalar(100.0);
            let gamma = Tensor::<1>::random([e], Distribution::Normal(1.0, 0.1), dev);
            let beta = Tensor::<1>::random([e], Distribution::Normal(0.0, 0.1), dev);
            let got = layer_norm_rows(x.clone(), gamma.clone(), beta.clone(), 1e-5);
            let want = reference::layer_norm(x, &gamma, &beta, 1e-5);
            worst = worst.max(max_diff(floats(got), floats(want)));
        }
        worst
    }
}
