//! Tests of admission and the prefill step: prefix-cache reuse (shared
//! prefixes, whole-prompt hits, generated blocks, block accounting) and
//! chunked prefill, each against the same requests computed without it.

use std::collections::HashMap;

use super::tests::{absorb, config, engine, engine_cfg, generate, req};
use super::*;
use crate::model::fixtures::reference;
use crate::model::{ModelSource, Preset};
use crate::params::*;

/// The tiny preset (1024 positions, random weights) with 16-token blocks.
fn tiny(prefix_caching: bool, num_blocks: usize) -> Engine {
    let source = ModelSource::Preset {
        preset: Preset::Tiny,
        seed: 3,
    };
    engine_cfg(EngineConfig {
        model: source,
        prefix_caching,
        ..config(16, num_blocks, false)
    })
}

/// `n` pseudo-random token ids from `seed` (below the tiny vocabulary).
fn tokens(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed.wrapping_mul(7919) + i.wrapping_mul(104_729)) % 50_000)
        .collect()
}

/// Admits `r` and prefills it in chunks of `chunk` tokens, then decodes it
/// to the end. Returns its tokens and how many prefill steps it took.
fn chunked(engine: &mut Engine, r: SequenceRequest, chunk: usize) -> (Vec<u32>, usize) {
    let id = r.id;
    engine.admit(&r).unwrap();
    let mut tokens = HashMap::new();
    let mut active = vec![id];
    let mut steps = 0;
    while engine.prompt_remaining(id).is_some() {
        let out = engine
            .prefill_step(&[PrefillChunk { id, tokens: chunk }])
            .unwrap();
        absorb(out, &mut tokens, &mut active);
        steps += 1;
    }
    while !active.is_empty() {
        absorb(engine.decode(&[id]).unwrap(), &mut tokens, &mut active);
    }
    (tokens.remove(&id).unwrap_or_default(), steps)
}

#[test]
fn chunked_prefill_matches_transformers() {
    let reference = reference();
    let n = reference.new_tokens;
    for chunk in [1, 3, 8] {
        let mut engine = engine_cfg(EngineConfig {
            prefix_caching: false,
            ..config(4, 64, false)
        });
        for (i, c) in reference.cases.iter().enumerate() {
            let r = req(i as SeqId, &c.prompt, n, SamplingParams::greedy());
            let (got, steps) = chunked(&mut engine, r, chunk);
            assert_eq!(got, c.greedy, "prompt {i}, chunks of {chunk}");
            assert_eq!(steps, c.prompt.len().div_ceil(chunk));
        }
        assert_eq!(engine.kv_blocks_used(), 0);
    }
}

#[test]
fn a_shared_200_token_prefix_is_computed_once() {
    let shared = tokens(1, 200);
    let prompt = |suffix: u32, n| [shared.clone(), tokens(suffix, n)].concat();
    let (a, b) = (prompt(2, 10), prompt(3, 15));
    // Without the cache: the reference tokens.
    let mut off = tiny(false, 64);
    let want_a = generate(&mut off, vec![req(1, &a, 8, SamplingParams::greedy())]);
    let want_b = generate(&mut off, vec![req(2, &b, 8, SamplingParams::greedy())]);

    let mut on = tiny(true, 64);
    let got_a = generate(&mut on, vec![req(1, &a, 8, SamplingParams::greedy())]);
    assert_eq!(got_a, want_a);
    // B finds the 12 full blocks of the shared prefix (192 tokens) and
    // prefills only the rest: 8 shared tokens and its own 15.
    let rb = req(2, &b, 8, SamplingParams::greedy());
    let cost = on.admission_cost(&rb);
    assert_eq!(cost.cached_tokens, 192);
    // 223 tokens = 14 blocks: 2 fresh, 12 parked hits that cost a free block each.
    assert_eq!(cost.blocks, 14);
    assert_eq!(on.admit(&rb).unwrap(), 192);
    assert_eq!(on.prompt_remaining(2), Some(215 - 192));
    on.release(2);
    assert_eq!(generate(&mut on, vec![rb]), want_b);
    assert_eq!(on.kv_blocks_used(), 0);
    assert_eq!(on.kv_blocks_free(), 64, "cached blocks count as free");
    assert!(on.kv_blocks_cached() >= 12);
}

#[test]
fn sharers_hold_the_same_blocks_and_accounting_counts_them_once() {
    let prompt = tokens(4, 40); // 2 full blocks + 8
    let mut e = tiny(true, 16);
    let r = |id| req(id, &prompt, 8, SamplingParams::greedy());
    // 48 tokens = 3 blocks each.
    let first = generate(&mut e, vec![r(1)]);
    e.admit(&r(1)).unwrap();
    e.prefill_step(&[PrefillChunk { id: 1, tokens: 64 }])
        .unwrap();
    assert_eq!(e.kv_blocks_used(), 3);
    // The second holds the first's two prompt blocks: one more block used.
    assert_eq!(e.admission_cost(&r(2)).blocks, 1);
    assert_eq!(e.admit(&r(2)).unwrap(), 32);
    assert_eq!(e.kv_blocks_used(), 4);
    // Releasing the first keeps the shared blocks held by the second.
    e.release(1);
    assert_eq!(e.kv_blocks_used(), 3);
    let mut tokens = HashMap::new();
    let mut active = vec![2];
    let out = e
        .prefill_step(&[PrefillChunk { id: 2, tokens: 64 }])
        .unwrap();
    absorb(out, &mut tokens, &mut active);
    while !active.is_empty() {
        absorb(e.decode(&[2]).unwrap(), &mut tokens, &mut active);
    }
    assert_eq!(tokens[&2], first[&1]);
    assert_eq!((e.kv_blocks_used(), e.num_active()), (0, 0));
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let mut e = tiny(true, 32);
    for len in [32, 33] {
        let p = tokens(5 + len as u32, len);
        let want = generate(&mut e, vec![req(1, &p, 6, SamplingParams::greedy())]);
        let r = req(2, &p, 6, SamplingParams::greedy());
        // 32 tokens: the second block holds the last token, so only the first
        // is reused; 33: both full blocks are, and one token is computed.
        let cached = e.admit(&r).unwrap();
        assert_eq!(
            (cached, e.prompt_remaining(2)),
            ((len - 1) / 16 * 16, Some(len - cached))
        );
        e.release(2);
        assert_eq!(
            generate(&mut e, vec![r]),
            HashMap::from([(2, want[&1].clone())])
        );
    }
}

#[test]
fn generated_blocks_are_reused_by_a_follow_up() {
    let mut e = tiny(true, 32);
    let p = tokens(9, 20);
    let out = generate(&mut e, vec![req(1, &p, 40, SamplingParams::greedy())]);
    // The follow-up repeats the conversation: prompt, answer, a new turn.
    let follow = [p.clone(), out[&1].clone(), tokens(10, 5)].concat();
    let r = req(2, &follow, 4, SamplingParams::greedy());
    // 60 tokens were in the cache (the 40th generated token never was): 3 full blocks.
    assert_eq!(e.admit(&r).unwrap(), 48);
    e.release(2);
    let mut off = tiny(false, 32);
    assert_eq!(
        generate(&mut e, vec![r.clone()]),
        generate(&mut off, vec![r])
    );
}

#[test]
fn chunked_and_cached_prefills_sample_like_whole_ones() {
    let p = tokens(11, 70);
    let sampling = SamplingParams {
        temperature: 1.2,
        top_k: 40,
        top_p: 0.95,
        seed: Some(17),
        min_p: 0.0,
    };
    let mut off = tiny(false, 32);
    let want = generate(&mut off, vec![req(1, &p, 12, sampling)]).remove(&1);
    let (got, steps) = chunked(&mut off, req(1, &p, 12, sampling), 16);
    assert_eq!((got.as_slice(), steps), (want.as_deref().unwrap(), 5));
    let mut on = tiny(true, 32);
    generate(&mut on, vec![req(1, &p, 12, sampling)]);
    let (cached, steps) = chunked(&mut on, req(2, &p, 12, sampling), 5);
    assert_eq!((cached.as_slice(), steps), (want.as_deref().unwrap(), 2));
}

#[test]
fn prefill_steps_mix_chunks_and_completions_in_one_batch() {
    let mut e = engine(4, 64);
    let reference = reference();
    let (long, short) = (&reference.cases[3], &reference.cases[2]);
    let g = SamplingParams::greedy();
    e.admit(&req(1, &long.prompt, 4, g)).unwrap();
    e.admit(&req(2, &short.prompt, 4, g)).unwrap();
    // One step: 10 tokens of the long prompt, all 12 of the short one.
    let out = e
        .prefill_step(&[
            PrefillChunk { id: 1, tokens: 10 },
            PrefillChunk { id: 2, tokens: 12 },
        ])
        .unwrap();
    assert_eq!(out.tokens.iter().map(|t| t.id).collect::<Vec<_>>(), [2]);
    assert_eq!(
        (e.prompt_remaining(1), e.prompt_remaining(2)),
        (Some(27), None)
    );
    // A prefilling sequence cannot decode yet; bad chunks are refused.
    assert!(matches!(
        e.decode(&[1]),
        Err(EngineError::UnknownSequence(1))
    ));
    assert!(matches!(
        e.prefill_step(&[PrefillChunk { id: 2, tokens: 1 }]),
        Err(EngineError::UnknownSequence(2))
    ));
    assert!(matches!(
        e.prefill_step(&[PrefillChunk { id: 1, tokens: 0 }]),
        Err(EngineError::InvalidRequest(_))
    ));
    let out = e
        .prefill_step(&[PrefillChunk { id: 1, tokens: 100 }])
        .unwrap();
    assert_eq!(out.tokens.len(), 1);
    let mut tokens = HashMap::new();
    absorb(out, &mut tokens, &mut vec![]);
    let mut active = vec![1, 2];
    while !active.is_empty() {
        let ids = active.clone();
        absorb(e.decode(&ids).unwrap(), &mut tokens, &mut active);
    }
    assert_eq!(tokens[&1], long.greedy[..4]);
    assert_eq!((e.kv_blocks_used(), e.num_active()), (0, 0));
}
