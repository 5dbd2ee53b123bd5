//! The engine's tests against the transformers fixture (tiny GPT-2, Flex f32):
//! logits, greedy continuations, continuous batching with and without
//! bucketed shapes, stop rules, block accounting, warmup.

use std::collections::HashMap;

use burn::prelude::*;

use super::decode::decode_rows;
use super::warmup::powers_of_two_up_to;
use super::*;
use crate::engine::config::{KvBudget, PrefillBounds};
use crate::model::fixtures::{max_abs_diff, reference, tiny_gpt2_dir};
use crate::model::ModelSource;
use crate::params::*;

/// The fixture's EOS, from its config.json (its greedy continuations never
/// produce it).
pub(super) const EOS: u32 = 999;

pub(super) fn engine(block_size: usize, num_blocks: usize) -> Engine {
    engine_with(block_size, num_blocks, false)
}

/// `bucketed` pads every step to its bucket, as on CUDA.
pub(super) fn engine_with(block_size: usize, num_blocks: usize, bucketed: bool) -> Engine {
    engine_cfg(config(block_size, num_blocks, bucketed))
}

/// The fixture model with `num_blocks` blocks of `block_size`, decode
/// batches up to 8, prefill steps of up to 4 rows and 64 tokens, prefix
/// caching on, no graphs.
pub(super) fn config(block_size: usize, num_blocks: usize, bucketed: bool) -> EngineConfig {
    EngineConfig {
        model: ModelSource::Dir(tiny_gpt2_dir()),
        block_size,
        kv: KvBudget::Blocks(num_blocks),
        max_sequences: 8,
        max_batch: 8,
        prefill: PrefillBounds {
            max_rows: 4,
            max_tokens: 64,
        },
        prefix_caching: true,
        cuda_graphs: false,
        bucketed: Some(bucketed),
    }
}

pub(super) fn engine_cfg(config: EngineConfig) -> Engine {
    let device = EngineDevice::cpu().unwrap();
    Engine::new(&config, &device).unwrap()
}

/// The logits `[B, vocab]` a decode step over `ids` computes (the paged
/// decode path), without sampling or advancing the sequences.
fn decode_logits(engine: &mut Engine, ids: &[SeqId]) -> Tensor<2> {
    let rows = decode_rows(&engine.seqs, ids);
    let table = SamplingTable::greedy(rows.len());
    // The rows borrow the sequences; the runner is a separate field.
    let (logits, _) = engine.runner.decode_forward(&rows, &table);
    logits
}

pub(super) fn req(
    id: SeqId,
    prompt: &[u32],
    max_new_tokens: usize,
    sampling: SamplingParams,
) -> SequenceRequest {
    let mut r = SequenceRequest::greedy(id, prompt.to_vec(), max_new_tokens);
    r.params.sampling = sampling;
    r
}

pub(super) fn rows(t: Tensor<2>) -> Vec<Vec<f32>> {
    let [_, v] = t.dims();
    let flat: Vec<f32> = t.into_data().iter::<f32>().collect();
    flat.chunks(v).map(<[f32]>::to_vec).collect()
}

/// Collects a step's tokens per sequence and returns the ids still running.
pub(super) fn absorb(
    out: StepOutput,
    tokens: &mut HashMap<SeqId, Vec<u32>>,
    active: &mut Vec<SeqId>,
) {
    for t in out.tokens {
        tokens.entry(t.id).or_default().push(t.token);
    }
    for f in out.finished {
        active.retain(|&id| id != f.id);
    }
}

/// Prefills `reqs` together and decodes them together until all finish.
pub(super) fn generate(
    engine: &mut Engine,
    reqs: Vec<SequenceRequest>,
) -> HashMap<SeqId, Vec<u32>> {
    let mut active: Vec<SeqId> = reqs.iter().map(|r| r.id).collect();
    let mut tokens = HashMap::new();
    absorb(engine.prefill(reqs).unwrap(), &mut tokens, &mut active);
    while !active.is_empty() {
        let ids = active.clone();
        absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
    }
    tokens
}

#[test]
fn prefill_logits_match_transformers() {
    let reference = reference();
    let mut engine = engine(4, 64);
    let prompts: Vec<Vec<u32>> = reference.cases.iter().map(|c| c.prompt.clone()).collect();
    // All prompts in one padded batch, and each alone.
    let batched = rows(engine.prompt_logits(&prompts).unwrap());
    let mut worst = 0.0f32;
    for (case, got) in reference.cases.iter().zip(&batched) {
        worst = worst.max(max_abs_diff(got, &case.last_logits));
        let alone = rows(
            engine
                .prompt_logits(std::slice::from_ref(&case.prompt))
                .unwrap(),
        );
        worst = worst.max(max_abs_diff(&alone[0], &case.last_logits));
    }
    eprintln!("prefill logits: max |burn - transformers| = {worst:e}");
    assert!(worst < 1e-4, "max abs diff {worst}");
    assert_eq!(engine.kv_blocks_used(), 0);
}

#[test]
fn greedy_continuations_and_decode_logits_match_transformers() {
    let reference = reference();
    let n = reference.new_tokens;
    let mut engine = engine(4, 128);
    let reqs: Vec<_> = reference
        .cases
        .iter()
        .enumerate()
        .map(|(i, c)| req(i as SeqId, &c.prompt, n, SamplingParams::greedy()))
        .collect();
    let ids: Vec<SeqId> = (0..reqs.len() as SeqId).collect();
    let mut tokens = HashMap::new();
    let mut active = ids.clone();
    absorb(engine.prefill(reqs).unwrap(), &mut tokens, &mut active);
    for _ in 0..n - 2 {
        absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
    }
    // The last step's logits, through the paged decode path.
    let logits = decode_logits(&mut engine, &ids);
    let logits = rows(logits.narrow(0, 0, ids.len()));
    let worst = reference
        .cases
        .iter()
        .zip(&logits)
        .map(|(c, got)| max_abs_diff(got, &c.final_logits))
        .fold(0.0, f32::max);
    eprintln!("decode logits (step {n}): max |burn - transformers| = {worst:e}");
    assert!(worst < 1e-4, "max abs diff {worst}");
    absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
    assert!(active.is_empty());
    for (i, case) in reference.cases.iter().enumerate() {
        assert_eq!(tokens[&(i as SeqId)], case.greedy, "prompt {i}");
    }
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
}

#[test]
fn mixed_batches_and_late_joiners_match_each_sequence_alone() {
    mixed_batches(false);
}

/// The same with every step padded to its bucket, as on CUDA: padding rows
/// must not disturb real ones.
#[test]
fn bucketed_steps_match_each_sequence_alone() {
    mixed_batches(true);
}

fn mixed_batches(bucketed: bool) {
    let reference = reference();
    let n = reference.new_tokens;
    let cases = &reference.cases;
    // Each alone.
    let mut engine = engine_with(4, 64, bucketed);
    for (i, c) in cases.iter().enumerate() {
        let got = generate(
            &mut engine,
            vec![req(i as SeqId, &c.prompt, n, SamplingParams::greedy())],
        );
        assert_eq!(got[&(i as SeqId)], c.greedy, "alone {i}");
    }
    // Continuous batching: 0 and 2 start together, 1 joins after 3 steps,
    // 3 after 7, with different budgets so they finish at different steps.
    let budgets = [n, n - 5, n, n - 2];
    let mut tokens = HashMap::new();
    let mut active = vec![0, 2];
    let first = vec![
        req(0, &cases[0].prompt, budgets[0], SamplingParams::greedy()),
        req(2, &cases[2].prompt, budgets[2], SamplingParams::greedy()),
    ];
    absorb(engine.prefill(first).unwrap(), &mut tokens, &mut active);
    for step in 1.. {
        if step == 3 || step == 7 {
            let i = if step == 3 { 1 } else { 3 };
            active.push(i as SeqId);
            let r = req(
                i as SeqId,
                &cases[i].prompt,
                budgets[i],
                SamplingParams::greedy(),
            );
            absorb(engine.prefill(vec![r]).unwrap(), &mut tokens, &mut active);
        }
        if active.is_empty() {
            break;
        }
        let ids = active.clone();
        absorb(engine.decode(&ids).unwrap(), &mut tokens, &mut active);
    }
    for (i, c) in cases.iter().enumerate() {
        assert_eq!(tokens[&(i as SeqId)], c.greedy[..budgets[i]], "batched {i}");
    }
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
}

#[test]
fn stop_rules_eos_and_length() {
    let reference = reference();
    let case = &reference.cases[1];
    let mut engine = engine(4, 32);
    assert_eq!(engine.eos_token_id, EOS, "the model's (config.json)");
    // EOS = the first greedy token: finishes at prefill, not emitted.
    engine.eos_token_id = case.greedy[0];
    let mut r = req(1, &case.prompt, 8, SamplingParams::greedy());
    r.params.stop.ignore_eos = false;
    let out = engine.prefill(vec![r.clone()]).unwrap();
    assert!(out.tokens.is_empty());
    assert_eq!(
        out.finished,
        [FinishedSeq {
            id: 1,
            reason: FinishReason::Eos,
            generated: 0,
        }]
    );
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
    // ignore_eos: emitted like any token.
    r.params.stop.ignore_eos = true;
    let out = engine.prefill(vec![r]).unwrap();
    assert_eq!(
        out.tokens,
        [SampledToken {
            id: 1,
            index: 0,
            token: case.greedy[0],
            logprobs: None,
        }]
    );
    assert!(out.finished.is_empty());
    assert_eq!(engine.release(1), Some(1));
    // max_new_tokens = 1: the token is emitted and the sequence finishes.
    let out = engine
        .prefill(vec![req(2, &case.prompt, 1, SamplingParams::greedy())])
        .unwrap();
    assert_eq!(
        out.tokens,
        [SampledToken {
            id: 2,
            index: 0,
            token: case.greedy[0],
            logprobs: None,
        }]
    );
    assert_eq!(
        out.finished,
        [FinishedSeq {
            id: 2,
            reason: FinishReason::Length,
            generated: 1,
        }]
    );
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
}

#[test]
fn release_frees_blocks_and_unknown_ids_are_errors() {
    let mut engine = engine(4, 32);
    engine
        .prefill(vec![req(1, &[1, 2, 3, 4, 5], 6, SamplingParams::greedy())])
        .unwrap();
    // The prompt and the next token: 2 blocks (the rest come as it grows).
    assert_eq!(engine.kv_blocks_used(), 2);
    engine.decode(&[1]).unwrap();
    assert!(matches!(
        engine.decode(&[1, 2]),
        Err(EngineError::UnknownSequence(2))
    ));
    assert!(matches!(
        engine.decode(&[1, 1]),
        Err(EngineError::InvalidRequest(_))
    ));
    assert!(engine.release(1).is_some());
    assert_eq!(engine.release(1), None);
    assert_eq!(
        (
            engine.kv_blocks_used(),
            engine.kv_blocks_free(),
            engine.num_active()
        ),
        (0, 32, 0)
    );
}

#[test]
fn out_of_blocks_leaves_the_engine_unchanged() {
    let g = SamplingParams::greedy();
    let mut engine = engine(4, 3);
    // 7 prompt tokens and the next one: 2 blocks.
    engine
        .prefill(vec![req(1, &[1, 2, 3, 4, 5, 6, 7], 5, g)])
        .unwrap();
    assert_eq!(engine.kv_blocks_used(), 2);
    let before = (engine.kv_blocks_free(), engine.num_active());
    // 4 + 1 tokens need 2 blocks, 1 is free: refused, nothing changed.
    let err = engine
        .prefill(vec![req(2, &[4, 5, 6, 7], 5, g)])
        .unwrap_err();
    assert!(
        matches!(err, EngineError::OutOfBlocks { needed: 2, free: 1 }),
        "{err}"
    );
    assert_eq!((engine.kv_blocks_free(), engine.num_active()), before);
    assert!(!engine.contains(2));
    // One that fits takes the last block.
    engine.prefill(vec![req(3, &[7, 8], 8, g)]).unwrap();
    assert_eq!(engine.kv_blocks_free(), 0);
    // Sequence 1 writes position 7, the end of its second block; the next
    // step would start a third, and none is free.
    engine.decode(&[1, 3]).unwrap();
    assert_eq!(engine.blocks_to_grow(&[1, 3]), 1);
    assert_eq!(engine.blocks_to_grow(&[3]), 0);
    let err = engine.decode(&[1, 3]).unwrap_err();
    assert!(
        matches!(err, EngineError::OutOfBlocks { needed: 1, free: 0 }),
        "{err}"
    );
    assert_eq!(engine.kv_blocks_used(), 3, "nothing taken");
    // Sequence 3 alone needs nothing; once it is gone, 1 grows.
    engine.decode(&[3]).unwrap();
    engine.release(3);
    engine.decode(&[1]).unwrap();
    assert_eq!(engine.kv_blocks_used(), 3);
}

#[test]
fn invalid_requests_are_rejected() {
    let mut engine = engine(4, 64);
    let g = SamplingParams::greedy();
    let cases = [
        req(1, &[], 4, g),        // empty prompt
        req(1, &[1, 2], 0, g),    // no tokens to generate
        req(1, &[1000], 4, g),    // token id >= vocab
        req(1, &[1; 100], 29, g), // 129 > n_positions 128
    ];
    for r in cases {
        assert!(matches!(
            engine.prefill(vec![r]),
            Err(EngineError::InvalidRequest(_))
        ));
    }
    engine.prefill(vec![req(1, &[1; 100], 28, g)]).unwrap(); // exactly 128 fits
    assert!(matches!(
        engine.prefill(vec![req(1, &[1], 1, g)]),
        Err(EngineError::DuplicateSequence(1))
    ));
    assert!(matches!(
        engine.prefill(vec![req(5, &[1], 2, g), req(5, &[2], 2, g)]),
        Err(EngineError::DuplicateSequence(5))
    ));
    assert_eq!(engine.num_active(), 1);
}

#[test]
fn seeded_sampling_is_reproducible_and_seeds_differ() {
    let mut engine = engine(4, 64);
    let prompt = reference().cases[2].prompt.clone();
    let sample = |engine: &mut Engine, seed, top_k, top_p| {
        let p = SamplingParams {
            temperature: 1.5,
            top_k,
            top_p,
            seed: Some(seed),
            min_p: 0.0,
        };
        generate(engine, vec![req(7, &prompt, 12, p)])
            .remove(&7)
            .unwrap()
    };
    for (top_k, top_p) in [(0, 1.0), (50, 1.0), (0, 0.9), (40, 0.95)] {
        let a = sample(&mut engine, 1, top_k, top_p);
        let b = sample(&mut engine, 1, top_k, top_p);
        let c = sample(&mut engine, 2, top_k, top_p);
        assert_eq!(a, b, "same seed, top_k {top_k} top_p {top_p}");
        assert_ne!(a, c, "different seeds, top_k {top_k} top_p {top_p}");
    }
    // Sampling rows next to greedy rows: both unaffected by batching.
    let greedy = reference().cases[2].greedy[..12].to_vec();
    let p = SamplingParams {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        seed: Some(1),
        min_p: 0.0,
    };
    let alone = sample(&mut engine, 1, 0, 1.0);
    let mixed = generate(
        &mut engine,
        vec![
            req(7, &prompt, 12, p),
            req(8, &prompt, 12, SamplingParams::greedy()),
        ],
    );
    assert_eq!((mixed[&7].clone(), mixed[&8].clone()), (alone, greedy));
    assert_eq!(engine.kv_blocks_used(), 0);
}

#[test]
fn block_accounting() {
    let engine = engine(16, 10);
    assert_eq!(engine.blocks_required(1, 1), 1);
    assert_eq!(engine.blocks_required(10, 6), 1);
    assert_eq!(engine.blocks_required(10, 7), 2);
    assert_eq!(engine.blocks_required(100, 28), 8);
    assert_eq!(
        (
            engine.kv_blocks_total(),
            engine.kv_blocks_free(),
            engine.kv_blocks_used()
        ),
        (10, 10, 0)
    );
    assert_eq!(powers_of_two_up_to(0), Vec::<usize>::new());
    assert_eq!(powers_of_two_up_to(6), [1, 2, 4, 6]);
    assert_eq!(powers_of_two_up_to(8), [1, 2, 4, 8]);
}

#[test]
fn warmup_leaves_no_state_behind() {
    let mut engine = engine(4, 16);
    engine
        .prefill(vec![req(1, &[3, 4], 3, SamplingParams::greedy())])
        .unwrap();
    engine.warmup().unwrap();
    assert_eq!((engine.num_active(), engine.kv_blocks_used()), (1, 1));
    // The sequence is unaffected by the warmup's padding-only steps.
    engine.decode(&[1]).unwrap();
    engine.release(1);
    assert_eq!(engine.kv_blocks_used(), 0);
}

#[test]
fn bucketed_warmup_covers_every_shape_and_leaves_no_state_behind() {
    let mut engine = engine_cfg(EngineConfig {
        prefill: PrefillBounds {
            max_rows: 4,
            max_tokens: 256,
        },
        ..config(16, 16, true)
    });
    let report = engine.warmup().unwrap();
    // Buckets 1, 2, 4, 8 (decode shapes do not depend on the context), greedy and sampling.
    assert_eq!(report.decode_shapes, 4 * 2);
    assert!(report.prefill_shapes >= 3, "{report:?}");
    assert_eq!(report.requests, 4 + 4 + 2, "the warm requests ran");
    assert_eq!((engine.num_active(), engine.kv_blocks_used()), (0, 0));
    let reference = reference();
    let c = &reference.cases[0];
    let got = generate(
        &mut engine,
        vec![req(0, &c.prompt, 6, SamplingParams::greedy())],
    );
    assert_eq!(got[&0], c.greedy[..6]);
}

#[test]
fn rejects_unusable_configs() {
    let device = EngineDevice::cpu().unwrap();
    let bad = EngineConfig {
        block_size: 0,
        ..config(4, 64, false)
    };
    assert!(matches!(
        Engine::new(&bad, &device),
        Err(EngineError::InvalidConfig(_))
    ));
    let missing = EngineConfig::new(ModelSource::Dir("/nonexistent/model".into()));
    assert!(matches!(
        Engine::new(&missing, &device),
        Err(EngineError::Model(_))
    ));
}

/// The captured decode step (on the CPU the "graph" re-runs the captured
/// closure) against eager steps, over many steps whose tokens, positions,
/// block tables and batch sizes change: same ids, and the cache the replays
/// write is the one later steps read.
#[test]
fn captured_decode_steps_match_eager_steps() {
    let reference = reference();
    let run = |graphs: bool| {
        let mut engine = engine_cfg(EngineConfig {
            prefill: PrefillBounds {
                max_rows: 2,
                max_tokens: 64,
            },
            ..config(4, 64, true)
        });
        // On the CPU the engine drops graphs (no speed-up); asked for here
        // to check the capture plumbing.
        engine.cuda_graphs = graphs;
        let report = engine.warmup().unwrap();
        assert_eq!(report.graphs, 0, "no hardware graphs on the CPU");
        assert_eq!(engine.captured_graphs(), if graphs { 4 } else { 0 });
        let reqs = reference
            .cases
            .iter()
            .enumerate()
            .map(|(i, c)| req(i as SeqId, &c.prompt, 10 + 3 * i, SamplingParams::greedy()))
            .collect();
        generate(&mut engine, reqs)
    };
    let eager = run(false);
    let captured = run(true);
    assert_eq!(captured, eager);
    let n = reference.new_tokens.min(10);
    for (i, c) in reference.cases.iter().enumerate() {
        assert_eq!(eager[&(i as SeqId)][..n], c.greedy[..n], "case {i}");
    }
}

/// A prefill step replayed from its captured graph computes the eager
/// step's logits (on the CPU the graph re-runs the closure over the
/// shape's buffers: the buffers, the shape key and the slot are what is
/// checked here; the GPU check is `ember-engine-bench --reference --graphs`).
#[test]
fn a_replayed_prefill_step_gives_the_eager_logits() {
    let floats = |t: Tensor<2>| -> Vec<f32> { t.into_data().iter::<f32>().collect() };
    let reference = reference();
    let mut engine = engine_cfg(config(4, 64, true));
    assert_eq!(
        engine.capture_prefill_graphs(),
        0,
        "no hardware graphs on the CPU"
    );
    // Token buckets 16, 32 and 64, each with the decode batch's rows.
    assert_eq!(engine.captured_prefill_graphs(), 3);
    let prompts: Vec<Vec<u32>> = reference.cases.iter().map(|c| c.prompt.clone()).collect();
    let eager = floats(engine.prompt_logits(&prompts).unwrap());
    let replayed = floats(engine.prompt_logits_replayed(&prompts).unwrap());
    assert_eq!(replayed, eager);
    // A second replay over other rows reads the rewritten buffers.
    let one = vec![prompts[1].clone()];
    let eager = floats(engine.prompt_logits(&one).unwrap());
    let replayed = floats(engine.prompt_logits_replayed(&one).unwrap());
    assert_eq!(replayed, eager);
    // The bench's probe finds nothing apart: every buffer holds the step,
    // every layer's K/V and the logits are the eager step's.
    let probe = engine.probe_prefill_graph(&prompts).unwrap();
    assert!(probe.buffers_differ.is_empty(), "{probe:?}");
    assert_eq!(probe.kv_diffs.len(), 2, "one pair a layer");
    assert!(probe.kv_diffs.iter().all(|&d| d == (0.0, 0.0)), "{probe:?}");
    assert_eq!((probe.logits_diff, probe.after_eager_diff), (0.0, 0.0));
    assert_eq!(probe.recaptured_diff, None, "no hardware graph on the CPU");
    assert_eq!(engine.kv_blocks_used(), 0);
}

/// `--cpu-weights bf16`: weights, activations and the KV cache rounded to
/// bf16, products summed in f32. The logits move by the rounding (2.3e-2
/// measured, 2.2e-2 with an f32 cache; max |logit| 3.2) and the greedy
/// continuations stay transformers'.
#[test]
fn bf16_weights_stay_near_transformers_and_keep_its_greedy_tokens() {
    use crate::cpu_tuning::{CpuTuning, CpuWeights};
    use crate::device::{self, DeviceOptions, DeviceSpec};
    let options = DeviceOptions {
        cpu: CpuTuning {
            cpu_weights: CpuWeights::Bf16,
            ..CpuTuning::default()
        },
        ..DeviceOptions::default()
    };
    let device = device::open(DeviceSpec::Cpu, &options).unwrap();
    let mut engine = Engine::new(&config(4, 128, false), &device).unwrap();
    let reference = reference();
    let prompts: Vec<Vec<u32>> = reference.cases.iter().map(|c| c.prompt.clone()).collect();
    let logits = rows(engine.prompt_logits(&prompts).unwrap());
    let worst = reference
        .cases
        .iter()
        .zip(&logits)
        .map(|(c, got)| max_abs_diff(got, &c.last_logits))
        .fold(0.0, f32::max);
    eprintln!("bf16 prefill logits: max |burn - transformers| = {worst:e}");
    assert!(worst < 4e-2, "max abs diff {worst}");
    let n = reference.new_tokens;
    let reqs = (reference.cases.iter().enumerate())
        .map(|(i, c)| req(i as SeqId, &c.prompt, n, SamplingParams::greedy()))
        .collect();
    let tokens = generate(&mut engine, reqs);
    for (i, case) in reference.cases.iter().enumerate() {
        assert_eq!(tokens[&(i as SeqId)], case.greedy, "prompt {i}");
    }
}
