//! The overlapped step loop ([`super::decode`]) against the synchronous one
//! and against transformers (`controls.json`), f32 on the CPU: the same
//! tokens and finishes for every option (penalties, logit_bias, min_tokens,
//! stop token ids, logprobs, a constraint, seeded sampling), with steps
//! queued ahead wherever the option allows it; sequences released or
//! preempted with a step in flight leak nothing and resume exactly; lengths
//! are planned exactly.

use std::collections::HashMap;

use super::logit_controls_tests::Only;
use super::tests::{config, engine, engine_cfg, req};
use super::*;
use crate::engine::config::PrefillBounds;
use crate::model::fixtures::{controls, reference};
use crate::params::*;

/// What a run produced: each sequence's tokens (with logprobs) and finish.
#[derive(Debug, Default)]
struct Run {
    tokens: HashMap<SeqId, Vec<(u32, Option<f32>)>>,
    finished: HashMap<SeqId, FinishReason>,
    /// Calls that returned a step's output while another was queued.
    overlapped_calls: usize,
}

impl Run {
    fn absorb(&mut self, out: StepOutput) {
        for t in out.tokens {
            let lp = t.logprobs.map(|l| l.logprob);
            self.tokens.entry(t.id).or_default().push((t.token, lp));
        }
        for f in out.finished {
            assert!(
                self.finished.insert(f.id, f.reason).is_none(),
                "{} finished twice",
                f.id
            );
        }
    }

    /// The same tokens and finishes as `other` (however the calls went),
    /// logprobs within f32 noise (a wasted row changes a step's batch).
    fn assert_same(&self, other: &Run, what: &str) {
        assert_eq!(self.finished, other.finished, "{what}");
        assert_eq!(self.tokens.len(), other.tokens.len(), "{what}");
        for (id, mine) in &self.tokens {
            let theirs = &other.tokens[id];
            assert_eq!(self.ids(*id), other.ids(*id), "sequence {id} ({what})");
            for ((_, a), (_, b)) in mine.iter().zip(theirs) {
                match (a, b) {
                    (Some(a), Some(b)) => {
                        assert!((a - b).abs() < 1e-4, "{id}: {a} vs {b} ({what})")
                    }
                    (a, b) => assert_eq!(a.is_some(), b.is_some(), "{id} ({what})"),
                }
            }
        }
    }

    fn ids(&self, id: SeqId) -> Vec<u32> {
        self.tokens
            .get(&id)
            .map(|t| t.iter().map(|x| x.0).collect())
            .unwrap_or_default()
    }
}

/// Prefills `reqs`, then decodes every decoding sequence each step, as the
/// scheduler does: synchronously, or overlapped (each call queues a step
/// and judges the one before).
fn run(engine: &mut Engine, reqs: Vec<SequenceRequest>, overlapped: bool) -> Run {
    let mut run = Run::default();
    run.absorb(engine.prefill(reqs).unwrap());
    loop {
        let ids = engine.decoding();
        if ids.is_empty() && !engine.has_pending() {
            break;
        }
        let out = match overlapped {
            true => engine.decode_async(&ids).unwrap(),
            false => engine.decode(&ids).unwrap(),
        };
        if engine.has_pending() && !out.tokens.is_empty() {
            run.overlapped_calls += 1;
        }
        run.absorb(out);
    }
    assert_eq!(engine.kv_blocks_used(), 0, "every block back");
    assert_eq!(engine.num_active(), 0);
    run
}

/// The control cases, beside plain, sampled and logprob rows.
fn mixed_requests() -> Vec<SequenceRequest> {
    let c = controls();
    let mut reqs: Vec<SequenceRequest> = c
        .cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let mut r = req(
                i as SeqId + 1,
                &case.prompt,
                c.new_tokens,
                SamplingParams::greedy(),
            );
            r.params = named_options::with_named_options(r.params, &case.options).unwrap();
            r.params.stop.ignore_eos = false;
            r
        })
        .collect();
    let plain = reference();
    let sampled = SamplingParams {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.0,
        seed: Some(5),
    };
    let prompt = &plain.cases[1].prompt;
    reqs.push(req(100, prompt, 12, SamplingParams::greedy()));
    reqs.push(req(101, prompt, 12, sampled));
    let mut lp = req(102, &plain.cases[2].prompt, 9, SamplingParams::greedy());
    lp.params.outputs.logprobs = Some(3);
    reqs.push(lp);
    reqs
}

#[test]
fn overlapped_steps_match_transformers_and_the_synchronous_loop() {
    let c = controls();
    // Penalties stay host edits on the CPU (no device slots) and logprobs
    // are read with the ids: their steps run synchronously, so the rows
    // that overlap on the CPU are also run on their own.
    let overlaps = |r: &SequenceRequest| {
        !r.params.transforms.penalties.any() && r.params.outputs.logprobs.is_none()
    };
    for bucketed in [false, true] {
        let mut e = engine_cfg(EngineConfig {
            max_batch: 16,
            prefill: PrefillBounds {
                max_rows: 16,
                max_tokens: 512,
            },
            ..config(4, 512, bucketed)
        });
        let what = format!("bucketed {bucketed}");
        let sync = run(&mut e, mixed_requests(), false);
        let overlapped = run(&mut e, mixed_requests(), true);
        for (i, case) in c.cases.iter().enumerate() {
            let id = i as SeqId + 1;
            assert_eq!(overlapped.ids(id), case.tokens, "{} ({what})", case.name);
        }
        overlapped.assert_same(&sync, &what);
        let some: Vec<SequenceRequest> = mixed_requests().into_iter().filter(overlaps).collect();
        assert!(some.len() >= 8);
        let sync = run(&mut e, some.clone(), false);
        let overlapped = run(&mut e, some, true);
        assert!(
            overlapped.overlapped_calls > 5,
            "steps were queued ahead ({what})"
        );
        overlapped.assert_same(&sync, &what);
    }
}

#[test]
fn a_stop_token_found_a_step_late_costs_no_token() {
    let plain = reference();
    let prompt = &plain.cases[0].prompt;
    let mut e = engine(4, 128);
    let free = run(
        &mut e,
        vec![req(1, prompt, 10, SamplingParams::greedy())],
        false,
    );
    let stop = free.ids(1)[4];
    let mut stopping = req(1, prompt, 10, SamplingParams::greedy());
    stopping.params.stop.stop_token_ids = vec![stop];
    let overlapped = run(&mut e, vec![stopping.clone()], true);
    let first = free.ids(1).iter().position(|&t| t == stop).unwrap();
    assert_eq!(overlapped.ids(1), free.ids(1)[..first]);
    assert_eq!(overlapped.finished[&1], FinishReason::StopToken(stop));
    assert!(overlapped.overlapped_calls > 0);
    overlapped.assert_same(&run(&mut e, vec![stopping], false), "stop token");
}

#[test]
fn constrained_rows_are_queued_in_halves_and_keep_their_tokens() {
    let plain = reference();
    let prompt = &plain.cases[3].prompt;
    let constrained = |id, len| {
        let mut r = req(id, prompt, 8, SamplingParams::greedy());
        r.params.constraint = Some(std::sync::Arc::new(std::sync::Mutex::new(Only {
            tokens: vec![5, 77, 300],
            len,
            eos: 999,
            accepted: Vec::new(),
        })));
        r.params.stop.ignore_eos = false;
        r
    };
    // Two grammar rows (their tokens accepted in parallel) beside a plain one.
    let reqs = || {
        vec![
            constrained(1, 5),
            req(2, prompt, 8, SamplingParams::greedy()),
            constrained(3, 3),
        ]
    };
    let mut e = engine(4, 128);
    let sync = run(&mut e, reqs(), false);
    let overlapped = run(&mut e, reqs(), true);
    overlapped.assert_same(&sync, "constrained");
    assert!(
        overlapped.overlapped_calls > 3,
        "the grammar rows' steps were queued in halves"
    );
    assert!(overlapped.ids(1)[..5]
        .iter()
        .all(|t| [5, 77, 300].contains(t)));
    assert!(overlapped.ids(3)[..3]
        .iter()
        .all(|t| [5, 77, 300].contains(t)));
}

#[test]
fn lengths_are_planned_exactly() {
    let plain = reference();
    let mut e = engine(4, 128);
    e.prefill(vec![req(
        1,
        &plain.cases[0].prompt,
        3,
        SamplingParams::greedy(),
    )])
    .unwrap();
    // Prefill gave token 1; two steps give tokens 2 and 3, then no more.
    e.decode_async(&[1]).unwrap();
    assert_eq!(e.decoding(), [1]);
    e.decode_async(&[1]).unwrap();
    assert!(e.decoding().is_empty(), "its last token is queued");
    let out = e.flush().unwrap();
    assert_eq!(out.tokens.len(), 1);
    assert_eq!(out.finished[0].reason, FinishReason::Length);
    assert_eq!(e.kv_blocks_used(), 0);
}

#[test]
fn released_and_preempted_sequences_with_a_step_in_flight_leak_nothing_and_resume_exactly() {
    let plain = reference();
    let reqs = || {
        (1..=3)
            .map(|id| {
                req(
                    id,
                    &plain.cases[id as usize].prompt,
                    12,
                    SamplingParams::greedy(),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut e = engine(4, 128);
    let whole = run(&mut e, reqs(), false);
    let mut got = Run::default();
    got.absorb(e.prefill(reqs()).unwrap());
    for _ in 0..4 {
        got.absorb(e.decode_async(&[1, 2, 3]).unwrap());
    }
    assert!(e.has_pending());
    // Sequence 1 leaves (a cancel), 2 is preempted, both with a step queued.
    assert!(e.release(1).is_some());
    let resumed = e.preempt(2).unwrap();
    got.absorb(e.decode_async(&[3]).unwrap());
    got.absorb(e.prefill(vec![resumed]).unwrap());
    loop {
        let ids = e.decoding();
        if ids.is_empty() && !e.has_pending() {
            break;
        }
        got.absorb(e.decode_async(&ids).unwrap());
    }
    assert_eq!(e.kv_blocks_used(), 0, "no block leaked");
    assert_eq!(e.num_active(), 0);
    for id in [2, 3] {
        assert_eq!(got.ids(id), whole.ids(id), "sequence {id}");
    }
    let cut = got.ids(1);
    assert_eq!(
        cut,
        whole.ids(1)[..cut.len()],
        "sequence 1 up to its release"
    );
}
