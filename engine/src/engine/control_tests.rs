//! The engine's per-request controls on the transformers fixture (tiny GPT-2,
//! Flex f32): logprobs checked against a log_softmax computed here from the
//! engine's own logits, stop token ids, and their validation.

use std::collections::HashMap;

use super::tests::{engine, req, rows};
use super::*;
use crate::limits::MAX_TOP_LOGPROBS;
use crate::model::fixtures::reference;
use crate::params::*;

/// Prefills `reqs` together and decodes them together until all finish;
/// returns every emitted token and every finish, per sequence.
fn run(
    engine: &mut Engine,
    reqs: Vec<SequenceRequest>,
) -> (
    HashMap<SeqId, Vec<SampledToken>>,
    HashMap<SeqId, FinishReason>,
) {
    let mut active: Vec<SeqId> = reqs.iter().map(|r| r.id).collect();
    let mut tokens: HashMap<SeqId, Vec<SampledToken>> = HashMap::new();
    let mut finished = HashMap::new();
    let mut out = engine.prefill(reqs).unwrap();
    loop {
        for t in out.tokens {
            tokens.entry(t.id).or_default().push(t);
        }
        for f in out.finished {
            active.retain(|&id| id != f.id);
            finished.insert(f.id, f.reason);
        }
        if active.is_empty() {
            return (tokens, finished);
        }
        out = engine.decode(&active.clone()).unwrap();
    }
}

/// log_softmax of `logits` in f64, on the host.
fn log_softmax_host(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    logits.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

#[test]
fn logprobs_match_a_log_softmax_of_the_engines_logits() {
    let reference = reference();
    let prompt = reference.cases[0].prompt.clone();
    let mut engine = engine(4, 64);
    let top_n = 5;
    let with = |id, sampling, logprobs| {
        let mut r = req(id, &prompt, 6, sampling);
        r.params.outputs.logprobs = logprobs;
        r
    };
    let sampled = SamplingParams {
        temperature: 0.7,
        top_k: 3,
        top_p: 0.9,
        seed: Some(11),
        min_p: 0.0,
    };
    // Greedy with logprobs, greedy without (same batch), sampled with top-0.
    let (tokens, _) = run(
        &mut engine,
        vec![
            with(1, SamplingParams::greedy(), Some(top_n)),
            with(2, SamplingParams::greedy(), None),
            with(3, sampled, Some(0)),
        ],
    );
    assert!(tokens[&2].iter().all(|t| t.logprobs.is_none()));
    assert_eq!(
        tokens[&1].iter().map(|t| t.token).collect::<Vec<_>>(),
        tokens[&2].iter().map(|t| t.token).collect::<Vec<_>>(),
        "asking for logprobs changed the tokens"
    );

    for id in [1, 3] {
        let mut context = prompt.clone();
        for t in &tokens[&id] {
            let logits = rows(
                engine
                    .prompt_logits(std::slice::from_ref(&context))
                    .unwrap(),
            );
            let expected = log_softmax_host(&logits[0]);
            let lp = t.logprobs.as_ref().expect("asked for logprobs");
            // The unmodified distribution, whatever the sampling parameters.
            let want = expected[t.token as usize];
            assert!((lp.logprob as f64 - want).abs() < 1e-4, "{lp:?} vs {want}");
            if id == 3 {
                assert!(lp.top.is_empty());
            } else {
                assert_eq!(lp.top.len(), top_n);
                // Greedy: the sampled token is the most likely one.
                assert_eq!(lp.top[0], (t.token, lp.logprob));
                assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1), "{lp:?}");
                let mass: f32 = lp.top.iter().map(|&(_, l)| l.exp()).sum();
                assert!(mass <= 1.0 + 1e-5, "{mass}");
                let mut ranked: Vec<usize> = (0..expected.len()).collect();
                ranked.sort_by(|&a, &b| expected[b].total_cmp(&expected[a]));
                for (j, &(tok, l)) in lp.top.iter().enumerate() {
                    assert_eq!(tok as usize, ranked[j], "rank {j}");
                    assert!((l as f64 - expected[tok as usize]).abs() < 1e-4);
                }
            }
            context.push(t.token);
        }
    }
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
}

#[test]
fn a_stop_token_finishes_the_sequence_without_emitting_it() {
    let reference = reference();
    let case = &reference.cases[1];
    // The first greedy token not seen before it (past the first).
    let k = (1..case.greedy.len())
        .find(|&k| !case.greedy[..k].contains(&case.greedy[k]))
        .expect("a fresh token in the greedy continuation");
    let stop = case.greedy[k];
    let mut engine = engine(4, 64);
    let (tokens, finished) = run(
        &mut engine,
        vec![{
            let mut r = req(1, &case.prompt, 20, SamplingParams::greedy());
            r.params.stop.stop_token_ids = vec![stop];
            r
        }],
    );
    let ids: Vec<u32> = tokens[&1].iter().map(|t| t.token).collect();
    assert_eq!(ids, case.greedy[..k]);
    assert_eq!(finished[&1], FinishReason::StopToken(stop));
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
}

#[test]
fn bad_controls_are_invalid_requests() {
    let reference = reference();
    let prompt = &reference.cases[0].prompt;
    let mut engine = engine(4, 64);
    let vocab = engine.model_config().vocab_size as u32;
    let bad = [
        {
            let mut r = req(1, prompt, 4, SamplingParams::greedy());
            r.params.stop.stop_token_ids = vec![1, vocab];
            r
        },
        {
            let mut r = req(2, prompt, 4, SamplingParams::greedy());
            r.params.outputs.logprobs = Some(MAX_TOP_LOGPROBS + 1);
            r
        },
    ];
    for (r, field) in bad.into_iter().zip(["stop_token_ids[1]", "logprobs"]) {
        match engine.prefill(vec![r]) {
            Err(EngineError::InvalidRequest(msg)) => assert!(msg.contains(field), "{msg}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert_eq!((engine.kv_blocks_used(), engine.num_active()), (0, 0));
}

/// Admits `r` and prefills its prompt in chunks of `chunk` tokens; returns
/// how many prompt tokens were found cached and the steps' outputs merged.
fn prefill_in_chunks(
    engine: &mut Engine,
    r: &SequenceRequest,
    chunk: usize,
) -> (usize, StepOutput) {
    let cached = engine.admit(r).unwrap();
    let mut out = StepOutput::default();
    while engine.prompt_remaining(r.id).is_some() {
        let step = engine
            .prefill_step(&[PrefillChunk {
                id: r.id,
                tokens: chunk,
            }])
            .unwrap();
        out.tokens.extend(step.tokens);
        out.finished.extend(step.finished);
    }
    (cached, out)
}

/// The controls act on a prefill step's first token however its prompt got
/// into the cache: whole, in chunks, or after a prefix-cache hit.
#[test]
fn controls_apply_to_chunked_and_cached_prefills() {
    let reference = reference();
    let case = reference
        .cases
        .iter()
        .max_by_key(|c| c.prompt.len())
        .expect("reference cases");
    let asking = |id| {
        let mut r = req(id, &case.prompt, 4, SamplingParams::greedy());
        r.params.outputs.logprobs = Some(3);
        r
    };
    let mut engine = engine(4, 64);
    let (whole, _) = run(&mut engine, vec![asking(1)]);
    let want = whole[&1][0].clone();
    let want_lp = want.logprobs.clone().expect("asked for logprobs");
    let same = |got: &SampledToken| {
        let lp = got.logprobs.as_ref().expect("asked for logprobs");
        assert_eq!(got.token, want.token);
        assert!((lp.logprob - want_lp.logprob).abs() < 1e-4, "{lp:?}");
        let ids = |l: &TokenLogprobs| l.top.iter().map(|&(t, _)| t).collect::<Vec<_>>();
        assert_eq!(ids(lp), ids(&want_lp));
    };

    // After a prefix-cache hit (the first request's prompt blocks).
    let (cached, out) = prefill_in_chunks(&mut engine, &asking(2), usize::MAX);
    assert!(cached > 0, "the prompt's full blocks were cached");
    same(&out.tokens[0]);
    engine.release(2);

    // In chunks of 3 on a fresh engine (nothing cached).
    let mut fresh = super::tests::engine(4, 64);
    let (cached, out) = prefill_in_chunks(&mut fresh, &asking(3), 3);
    assert_eq!(cached, 0);
    same(&out.tokens[0]);
    fresh.release(3);

    // A stop token id judged on the first token of a chunked prefill after
    // a hit (request 3's blocks).
    let stopping = {
        let mut r = req(4, &case.prompt, 4, SamplingParams::greedy());
        r.params.stop.stop_token_ids = vec![want.token];
        r
    };
    let (_, out) = prefill_in_chunks(&mut fresh, &stopping, 3);
    assert!(out.tokens.is_empty());
    assert_eq!(
        out.finished,
        [FinishedSeq {
            id: 4,
            reason: FinishReason::StopToken(want.token),
            generated: 0,
        }]
    );
    for e in [&engine, &fresh] {
        assert_eq!((e.kv_blocks_used(), e.num_active()), (0, 0));
    }
}
