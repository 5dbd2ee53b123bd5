//! The last part of a bucketed warmup: a few requests that use every
//! option, through the engine's own request path (one prefill, synchronous
//! decode steps, then overlapped ones), released at the end.
//!
//! Why: the step shapes of [`super::warmup`] compile the forward's kernels,
//! but a request's options take other kernels, or other variants of one
//! (the sampling kernel with an allowed-token mask, with penalty counts;
//! the counts' update and take-back; the mask rows' write; `logit_bias`'s
//! edits; the logprobs and prompt-logprobs kernels; a constrained row's
//! split step in the overlapped loop), and each compiles on its first use.
//! A first deploy's traffic met them as stalls of 1-1.5 s on the scheduler
//! thread, one after another (issue 46, on an H200, with nothing left to
//! tune). Running them here moves those compiles before SERVING.
//!
//! The requests are ordinary ones (random prompts, at most
//! [`WARM_NEW_TOKENS`] tokens each, ids from [`WARM_IDS`] on) and end like
//! any request: their blocks go back to the pool, their full ones to the
//! prefix cache, which evicts them like any other. Sequences already in the
//! engine are not touched.

use std::sync::{Arc, Mutex};

use super::Engine;
use crate::error::EngineError;
use crate::params::{Penalties, SamplingParams, TokenConstraint};
use crate::types::{SeqId, SequenceRequest};

/// The first id of the warm requests (far from any id a server hands out).
pub const WARM_IDS: SeqId = u64::MAX - 64;
/// Tokens each warm request may generate.
pub const WARM_NEW_TOKENS: usize = 6;

/// A constraint that allows every token but token 0 (a structured row's
/// mask, without a grammar).
#[derive(Debug)]
struct AllButZero {
    words: usize,
}

impl TokenConstraint for AllButZero {
    fn allowed(&mut self) -> Result<Option<Vec<u32>>, String> {
        let mut bits = vec![u32::MAX; self.words];
        bits[0] &= !1;
        Ok(Some(bits))
    }

    fn accept(&mut self, _token: u32) -> Result<(), String> {
        Ok(())
    }
}

impl Engine {
    /// Runs the warm requests (module docs), all together, then each alone,
    /// then a plain sampled and a plain greedy one alone: each batch a
    /// prefill, two synchronous decode steps, then overlapped steps until
    /// it ends. Returns how many requests ran.
    pub(super) fn warm_requests(&mut self) -> Result<usize, EngineError> {
        let reqs = self.warm_request_set();
        let mut ran = 0;
        // All together, then each alone (a step of one kind of row takes
        // its own path: the graph's argmax, the sampling kernel, a split).
        ran += self.warm_batch(reqs.clone())?;
        for (i, mut req) in reqs.into_iter().enumerate() {
            req.id = WARM_IDS + 16 + i as SeqId;
            ran += self.warm_batch(vec![req])?;
        }
        let mut sampled = SequenceRequest::greedy(WARM_IDS + 32, vec![1, 2, 3], WARM_NEW_TOKENS);
        sampled.params.sampling.temperature = 1.0;
        let plain = SequenceRequest::greedy(WARM_IDS + 33, vec![4, 5, 6], WARM_NEW_TOKENS);
        ran += self.warm_batch(vec![sampled])? + self.warm_batch(vec![plain])?;
        Ok(ran)
    }

    /// Runs `reqs` to their end (or [`WARM_NEW_TOKENS`] steps) and releases
    /// them; returns how many there were.
    fn warm_batch(&mut self, reqs: Vec<SequenceRequest>) -> Result<usize, EngineError> {
        let ids: Vec<SeqId> = reqs.iter().map(|r| r.id).collect();
        let ran = self.run_warm_requests(reqs, &ids);
        for &id in &ids {
            self.release(id);
        }
        ran.map(|()| ids.len())
    }

    /// Prefill, then decode steps over the warm sequences still decoding.
    fn run_warm_requests(
        &mut self,
        reqs: Vec<SequenceRequest>,
        ids: &[SeqId],
    ) -> Result<(), EngineError> {
        self.prefill(reqs)?;
        let decoding = |e: &Self| -> Vec<SeqId> {
            e.decoding()
                .into_iter()
                .filter(|id| ids.contains(id))
                .collect()
        };
        for _ in 0..2 {
            let step = decoding(self);
            if !step.is_empty() {
                self.decode(&step)?;
            }
        }
        for _ in 0..WARM_NEW_TOKENS {
            let step = decoding(self);
            if step.is_empty() {
                break;
            }
            self.decode_async(&step)?;
        }
        self.flush().map(drop)
    }

    /// The warm requests: a sampled one with every option (penalties,
    /// `logit_bias`, `min_tokens`, logprobs 2, prompt logprobs 1), its twin
    /// on the same prompt (a prefix-cache hit, as `n` > 1 makes), a greedy
    /// constrained one, a plain greedy one with logprobs 20.
    fn warm_request_set(&self) -> Vec<SequenceRequest> {
        let vocab = self.model_config().vocab_size as u32;
        let prompt = |seed: u32| -> Vec<u32> {
            (0..24u32)
                .map(|i| (i * 7919 + seed * 104_729 + 13) % vocab)
                .collect()
        };
        let mut full = SequenceRequest::greedy(WARM_IDS, prompt(1), WARM_NEW_TOKENS);
        full.params.sampling = SamplingParams {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: Some(7),
        };
        full.params.transforms.penalties = Penalties {
            repetition: 1.1,
            frequency: 0.5,
            presence: 0.3,
        };
        full.params.transforms.logit_bias = vec![(1, 2.0), (vocab - 1, -5.0)];
        full.params.stop.min_tokens = 2;
        full.params.outputs.logprobs = Some(2);
        full.params.outputs.prompt_logprobs = Some(1);
        let mut twin = full.clone();
        twin.id = WARM_IDS + 1;
        twin.params.sampling.seed = Some(8);
        let mut constrained = SequenceRequest::greedy(WARM_IDS + 2, prompt(2), WARM_NEW_TOKENS);
        constrained.params.constraint = Some(Arc::new(Mutex::new(AllButZero {
            words: (vocab as usize).div_ceil(32),
        })));
        let mut plain = SequenceRequest::greedy(WARM_IDS + 3, prompt(3), WARM_NEW_TOKENS);
        plain.params.outputs.logprobs = Some(20);
        vec![full, twin, constrained, plain]
    }
}
