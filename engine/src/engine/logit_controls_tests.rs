//! The logit controls (penalties, logit_bias, min_tokens) against
//! `controls.json`: what transformers' logits give under vLLM's semantics
//! (`scripts/make_reference_fixtures.py --controls`), token for token,
//! greedy, f32 on the CPU; in a batch beside plain rows, on their own, and
//! through a captured decode step (the in-graph argmax must not serve them).

use super::tests::{config, engine, engine_cfg, generate, req};
use super::*;
use crate::engine::config::PrefillBounds;
use crate::model::fixtures::{controls, reference, ControlCase};
use crate::params::*;

/// The request `case` describes (its options under OpenAI / vLLM names).
fn request(id: SeqId, case: &ControlCase, n: usize) -> SequenceRequest {
    let mut r = req(id, &case.prompt, n, SamplingParams::greedy());
    r.params = named_options::with_named_options(r.params, &case.options).unwrap();
    r.params.stop.ignore_eos = false;
    r
}

#[test]
fn each_control_matches_transformers_token_for_token() {
    let c = controls();
    let n = c.new_tokens;
    for case in &c.cases {
        let got = generate(&mut engine(4, 128), vec![request(1, case, n)]);
        let tokens = got.get(&1).cloned().unwrap_or_default();
        assert_eq!(
            tokens,
            case.tokens,
            "{} (prompt {})",
            case.name,
            case.prompt.len()
        );
    }
}

#[test]
fn controlled_rows_beside_plain_ones_keep_their_results() {
    let c = controls();
    let n = c.new_tokens;
    let plain = reference();
    let mut reqs: Vec<SequenceRequest> = c
        .cases
        .iter()
        .enumerate()
        .map(|(i, case)| request(i as SeqId + 1, case, n))
        .collect();
    let greedy_case = &plain.cases[2];
    reqs.push(req(100, &greedy_case.prompt, n, SamplingParams::greedy()));
    // Bucketed shapes with captured decode graphs: the rows with controls
    // must not take the graph's argmax; the plain row does.
    let mut e = engine_cfg(EngineConfig {
        max_batch: 16,
        prefill: PrefillBounds {
            max_rows: 16,
            max_tokens: 512,
        },
        ..config(4, 512, true)
    });
    e.cuda_graphs = true;
    e.warmup().unwrap();
    let got = generate(&mut e, reqs);
    for (i, case) in c.cases.iter().enumerate() {
        let tokens = got.get(&(i as SeqId + 1)).cloned().unwrap_or_default();
        assert_eq!(
            tokens,
            case.tokens,
            "{} (prompt {})",
            case.name,
            case.prompt.len()
        );
    }
    assert_eq!(got[&100], greedy_case.greedy);
    assert_eq!(e.kv_blocks_used(), 0);
}

/// Runs `r` (admitted whole) in prefill chunks of `chunk` tokens, then
/// decodes it to its end; returns its prompt logprobs, tokens and finish.
fn scored_run(
    e: &mut Engine,
    r: &SequenceRequest,
    chunk: usize,
) -> (Vec<PromptLogprobs>, Vec<u32>, Option<FinishedSeq>) {
    e.admit(r).unwrap();
    let (mut lps, mut tokens, mut finished) = (Vec::new(), Vec::new(), None);
    let mut absorb = |out: StepOutput| {
        lps.extend(out.prompt_logprobs);
        tokens.extend(out.tokens.iter().map(|t| t.token));
        finished = finished.or(out.finished.first().copied());
    };
    while e.prompt_remaining(r.id).is_some_and(|left| left > 0) {
        let out = e.prefill_step(&[PrefillChunk {
            id: r.id,
            tokens: chunk,
        }]);
        absorb(out.unwrap());
    }
    while e.contains(r.id) {
        absorb(e.decode(&[r.id]).unwrap());
    }
    (lps, tokens, finished)
}

#[test]
fn prompt_logprobs_match_transformers_whole_and_in_chunks() {
    let c = controls();
    let plain = reference();
    for (case, greedy) in c.prompt_logprobs.iter().zip(&plain.cases[1..]) {
        for (chunk, new_tokens) in [(case.prompt.len(), 0), (3, 0), (4, 5)] {
            let mut e = engine(4, 128);
            let r = {
                let mut r = req(1, &case.prompt, new_tokens, SamplingParams::greedy());
                r.params.outputs.prompt_logprobs = Some(case.top);
                r
            };
            let (got, tokens, finished) = scored_run(&mut e, &r, chunk);
            let what = format!("prompt of {}, chunks of {chunk}", case.prompt.len());
            // Consecutive pieces from token 1, one per prompt token after the first.
            let mut next = 1;
            let mut all = Vec::new();
            for piece in got {
                assert_eq!((piece.id, piece.first), (1, next), "{what}");
                next += piece.logprobs.len();
                all.extend(piece.logprobs);
            }
            assert_eq!(all.len(), case.prompt.len() - 1, "{what}");
            for (i, (g, want)) in all.iter().zip(&case.logprobs).enumerate() {
                assert!(
                    (g.logprob - want.logprob).abs() < 2e-3,
                    "{what}, token {}: {g:?} vs {want:?}",
                    i + 1
                );
                assert_eq!(g.top.len(), case.top);
                for (rank, ((gid, glp), (wid, wlp))) in g.top.iter().zip(&want.top).enumerate() {
                    assert!(
                        (glp - wlp).abs() < 2e-3,
                        "{what}, token {}, rank {rank}",
                        i + 1
                    );
                    let tie = want
                        .top
                        .iter()
                        .any(|(t, lp)| t != wid && (lp - wlp).abs() < 2e-3);
                    assert!(
                        gid == wid || tie,
                        "{what}, token {}, rank {rank}: {gid} vs {wid}",
                        i + 1
                    );
                }
            }
            assert_eq!(tokens, greedy.greedy[..new_tokens], "{what}");
            let f = finished.expect("finished");
            assert_eq!(
                (f.reason, f.generated),
                (FinishReason::Length, new_tokens),
                "{what}"
            );
            assert_eq!(e.kv_blocks_used(), 0, "{what}");
        }
    }
}

#[test]
fn nothing_to_generate_is_only_allowed_when_scoring_the_prompt() {
    let mut e = engine(4, 64);
    let r = req(1, &[1, 2, 3], 0, SamplingParams::greedy());
    match e.admit(&r) {
        Err(EngineError::InvalidRequest(msg)) => assert!(msg.contains("max_new_tokens"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let bad = [
        (
            {
                let mut r = req(2, &[1], 4, SamplingParams::greedy());
                r.params.transforms.penalties = Penalties {
                    repetition: 0.0,
                    ..Penalties::OFF
                };
                r
            },
            "repetition_penalty",
        ),
        (
            {
                let mut r = req(3, &[1], 4, SamplingParams::greedy());
                r.params.transforms.logit_bias = vec![(5, 101.0)];
                r
            },
            "logit_bias[5]",
        ),
        (
            {
                let mut r = req(4, &[1], 4, SamplingParams::greedy());
                r.params.stop.min_tokens = 5;
                r
            },
            "min_tokens",
        ),
    ];
    for (r, field) in bad {
        match e.admit(&r) {
            Err(EngineError::InvalidRequest(msg)) => assert!(msg.contains(field), "{msg}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert_eq!(e.kv_blocks_used(), 0);
}

/// A constraint that allows `tokens` for `len` steps, then only EOS.
#[derive(Debug)]
pub(super) struct Only {
    pub(super) tokens: Vec<u32>,
    pub(super) len: usize,
    pub(super) eos: u32,
    pub(super) accepted: Vec<u32>,
}

impl TokenConstraint for Only {
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
        let top = self
            .tokens
            .iter()
            .chain([&self.eos])
            .max()
            .copied()
            .unwrap_or(0);
        let mut bits = vec![0u32; top as usize / 32 + 1];
        let allowed = if self.accepted.len() < self.len {
            self.tokens.clone()
        } else {
            vec![self.eos]
        };
        for t in allowed {
            bits[t as usize / 32] |= 1 << (t % 32);
        }
        Ok(Some(bits))
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.accepted.push(token);
        Ok(())
    }
}

#[test]
fn a_constraint_picks_among_its_allowed_tokens_and_ends_the_sequence() {
    let plain = reference();
    let case = &plain.cases[3];
    let only = std::sync::Arc::new(std::sync::Mutex::new(Only {
        tokens: vec![5, 77, 300],
        len: 6,
        eos: 999,
        accepted: Vec::new(),
    }));
    let shared: SharedConstraint = only.clone();
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: Some(3),
            min_p: 0.0,
        },
    ] {
        only.lock().unwrap().accepted.clear();
        let r = {
            let mut r = req(1, &case.prompt, 16, sampling);
            r.params.constraint = Some(shared.clone());
            r.params.stop.ignore_eos = false;
            r
        };
        let got = generate(&mut engine(4, 128), vec![r]);
        let tokens = &got[&1];
        assert_eq!(tokens.len(), 6, "{tokens:?}");
        assert!(
            tokens.iter().all(|t| [5, 77, 300].contains(t)),
            "{tokens:?}"
        );
        // The constraint saw every sampled token, the closing EOS too.
        let accepted = only.lock().unwrap().accepted.clone();
        assert_eq!(accepted[..6], tokens[..]);
        assert_eq!(accepted.last(), Some(&999));
    }
}

#[test]
fn a_constraint_that_cannot_be_honoured_ends_the_sequence_with_an_error() {
    let case = &reference().cases[1];
    // Token 1500 is past the fixture's 1,000 embedding rows: the model can
    // never sample it, so nothing the constraint allows can come.
    let beyond: SharedConstraint = std::sync::Arc::new(std::sync::Mutex::new(Only {
        tokens: vec![1500],
        len: 4,
        eos: 1501,
        accepted: Vec::new(),
    }));
    let mut e = engine(4, 128);
    let mut r = req(1, &case.prompt, 8, SamplingParams::greedy());
    r.params.constraint = Some(beyond);
    let out = e.prefill(vec![r]).unwrap();
    assert!(out.tokens.is_empty(), "{:?}", out.tokens);
    assert_eq!(out.finished.len(), 1);
    assert_eq!(out.finished[0].reason, FinishReason::ConstraintFailed);
    assert_eq!((e.kv_blocks_used(), e.num_active()), (0, 0));
}

/// A constraint that refuses every token it is told about.
#[derive(Debug)]
struct Refusing;

impl TokenConstraint for Refusing {
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
        Ok(None)
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        Err(format!("token {token} does not fit"))
    }
}

#[test]
fn a_refused_token_is_not_emitted_and_ends_the_sequence_with_an_error() {
    let case = &reference().cases[2];
    let mut e = engine(4, 128);
    let mut r = req(1, &case.prompt, 8, SamplingParams::greedy());
    r.params.constraint = Some(std::sync::Arc::new(std::sync::Mutex::new(Refusing)));
    let out = e.prefill(vec![r]).unwrap();
    assert!(out.tokens.is_empty());
    assert_eq!(out.finished[0].reason, FinishReason::ConstraintFailed);
    assert_eq!(out.finished[0].generated, 0);
    assert_eq!((e.kv_blocks_used(), e.num_active()), (0, 0));
}

#[test]
fn constrained_rows_in_one_step_each_follow_their_own_constraint() {
    // Three structured rows decode together (their masks are built in
    // parallel) beside a plain one; each keeps to its own allowed set and
    // gives the tokens it gives alone.
    let case = &reference().cases[2];
    let only = |tokens: Vec<u32>| -> SharedConstraint {
        std::sync::Arc::new(std::sync::Mutex::new(Only {
            tokens,
            len: 5,
            eos: 999,
            accepted: Vec::new(),
        }))
    };
    let sets = [vec![5, 77, 300], vec![12, 13], vec![400, 401, 402, 403]];
    let request = |id: SeqId, set: &[u32]| {
        let mut r = req(id, &case.prompt, 16, SamplingParams::greedy());
        r.params.constraint = Some(only(set.to_vec()));
        r.params.stop.ignore_eos = false;
        r
    };
    let alone: Vec<Vec<u32>> = sets
        .iter()
        .map(|set| generate(&mut engine(4, 128), vec![request(1, set)])[&1].clone())
        .collect();
    let mut together: Vec<SequenceRequest> = sets
        .iter()
        .enumerate()
        .map(|(i, set)| request(i as SeqId + 1, set))
        .collect();
    together.push(req(9, &case.prompt, 8, SamplingParams::greedy()));
    let got = generate(&mut engine(4, 128), together);
    for (i, set) in sets.iter().enumerate() {
        let tokens = &got[&(i as SeqId + 1)];
        assert_eq!(tokens.len(), 5, "{tokens:?}");
        assert!(tokens.iter().all(|t| set.contains(t)), "{tokens:?}");
        assert_eq!(tokens, &alone[i], "row {i} as alone");
    }
    assert_eq!(got[&9].len(), 8, "the plain row runs beside them");
}
