//! The preemption seam on the transformers fixture (tiny GPT-2, Flex f32): a
//! sequence preempted mid-decode (or mid-prefill) and admitted again from the
//! request [`Engine::preempt`] returned emits exactly what it would have
//! emitted undisturbed, greedy and sampled, with its token indices going on
//! and its blocks freed while it is out.

use std::collections::HashMap;

use super::tests::{engine, generate, req};
use super::*;
use crate::model::fixtures::reference;
use crate::params::*;

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        seed: Some(seed),
        min_p: 0.0,
    }
}

/// Runs `r` alone, preempting it after `steps` decode steps, admitting the
/// returned request again, and running it to its end; returns its emitted
/// tokens and their indices.
fn preempted_run(engine: &mut Engine, r: SequenceRequest, steps: usize) -> Vec<(usize, u32)> {
    let id = r.id;
    let mut got = Vec::new();
    let mut record = |out: StepOutput| {
        let done = !out.finished.is_empty();
        got.extend(out.tokens.iter().map(|t| (t.index, t.token)));
        done
    };
    record(engine.prefill(vec![r]).unwrap());
    for _ in 0..steps {
        record(engine.decode(&[id]).unwrap());
    }
    let used_before = engine.kv_blocks_used();
    let resumable = engine.preempt(id).expect("a running sequence");
    assert!(
        engine.kv_blocks_used() < used_before,
        "its blocks are freed"
    );
    assert!(!engine.contains(id));
    let resume = resumable.resume.as_ref().expect("resume state");
    assert_eq!(resume.generated.len(), steps + 1);
    // Admitted again: the prompt and the generated tokens are the input; the
    // computed blocks are still in the prefix cache.
    let cached = engine.admit(&resumable).unwrap();
    let bs = engine.block_size();
    let reusable = (resumable.input_len() - 1) / bs * bs;
    assert_eq!(
        cached, reusable,
        "every computed full block is a hit on resume"
    );
    let left = engine.prompt_remaining(id).expect("prefilling");
    assert_eq!(cached + left, resumable.input_len());
    let mut done = record(
        engine
            .prefill_step(&[PrefillChunk { id, tokens: left }])
            .unwrap(),
    );
    while !done {
        done = record(engine.decode(&[id]).unwrap());
    }
    got
}

#[test]
fn a_preempted_sequence_resumes_exactly_where_it_left() {
    let reference = reference();
    let case = &reference.cases[2]; // 12 tokens: 3 full blocks of 4
    for (sampling, name) in [
        (SamplingParams::greedy(), "greedy"),
        (sampled(5), "sampled"),
    ] {
        let n = 14;
        let alone: HashMap<SeqId, Vec<u32>> =
            generate(&mut engine(4, 64), vec![req(1, &case.prompt, n, sampling)]);
        for steps in [0, 3, 9] {
            let mut e = engine(4, 64);
            let got = preempted_run(&mut e, req(1, &case.prompt, n, sampling), steps);
            let indices: Vec<usize> = got.iter().map(|g| g.0).collect();
            let tokens: Vec<u32> = got.iter().map(|g| g.1).collect();
            assert_eq!(indices, (0..n).collect::<Vec<_>>(), "{name} at {steps}");
            assert_eq!(tokens, alone[&1], "{name}, preempted after {steps} steps");
            assert_eq!((e.kv_blocks_used(), e.num_active()), (0, 0));
        }
    }
}

#[test]
fn a_sequence_preempted_while_prefilling_starts_over_and_unknown_ids_are_none() {
    let reference = reference();
    let case = &reference.cases[3]; // 37 tokens
    let mut e = engine(4, 64);
    e.admit(&req(3, &case.prompt, 4, SamplingParams::greedy()))
        .unwrap();
    e.prefill_step(&[PrefillChunk { id: 3, tokens: 10 }])
        .unwrap();
    let back = e.preempt(3).expect("prefilling sequence");
    assert_eq!(back.resumed_tokens(), 0);
    assert_eq!(e.kv_blocks_used(), 0);
    // Its first two blocks were computed: a hit when it comes back.
    assert_eq!(e.admission_cost(&back).cached_tokens, 8);
    assert!(e.preempt(3).is_none());
    let got = generate(&mut e, vec![back]);
    assert_eq!(got[&3], case.greedy[..4]);
}
