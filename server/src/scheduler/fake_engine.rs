//! A [`StepEngine`] without a model, for the scheduler's tests: block
//! accounting (the input's blocks at admission, one more each time a decode
//! step crosses into a new block), preemption, chunked prompts, decode (the
//! overlapped kind too: a step queued, judged at the next call) and the stop
//! rules of a real engine (`max_new_tokens`, stop token ids), with tokens
//! made up on the spot (the token at position `p` is `p`), in microseconds. It can be told to fail a step or refuse an admission, so
//! the worker's failure paths are tested too, and to hold a step until the
//! test says go, so a test can act while a request is surely mid-decode.

use std::collections::BTreeMap;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use ember_engine::{
    AdmissionCost, EngineError, FinishReason, FinishedSeq, PrefillChunk, ResumeState, SampledToken,
    SeqId, SequenceRequest, StepEngine, StepOutput, TokenLogprobs,
};

/// One admitted sequence of the fake.
#[derive(Debug)]
struct FakeSeq {
    /// The request as admitted (given back, with its progress, on preemption).
    request: SequenceRequest,
    /// Input tokens (prompt, then what it generated before a preemption).
    input_len: usize,
    /// Input tokens computed so far.
    computed: usize,
    /// Tokens in its cache: `computed`, then one more per decode step.
    cached: usize,
    generated: usize,
    max_new_tokens: usize,
    blocks: usize,
    logprobs: Option<usize>,
    /// Queued decode steps not judged yet (the overlapped loop).
    in_flight: usize,
}

/// See the module docs.
#[derive(Debug)]
pub(super) struct FakeEngine {
    total_blocks: usize,
    block_size: usize,
    seqs: BTreeMap<SeqId, FakeSeq>,
    /// Fail the step after this many more successful steps (prefill or decode).
    pub fail_after_steps: Option<usize>,
    /// Refuse to admit this sequence (as an invalid request).
    pub refuse: Option<SeqId>,
    /// Before step number `.0` (counting prefill and decode steps from 1)
    /// returns, wait for a message on `.1` (or 30 s).
    pub hold_at_step: Option<(usize, Receiver<()>)>,
    steps: usize,
    /// The decode step queued by `decode_async`, not judged yet.
    queued: Option<Vec<SeqId>>,
}

impl FakeEngine {
    pub fn new(total_blocks: usize, block_size: usize) -> Self {
        Self {
            total_blocks,
            block_size,
            seqs: BTreeMap::new(),
            fail_after_steps: None,
            refuse: None,
            hold_at_step: None,
            steps: 0,
            queued: None,
        }
    }

    /// Blocks admitting `req` takes: its input and the next token, within
    /// its whole budget (the real engine's rule).
    fn blocks_to_admit(&self, req: &SequenceRequest) -> usize {
        let whole = (req.prompt.len() + req.params.stop.max_new_tokens).div_ceil(self.block_size);
        (req.input_len() + 1).div_ceil(self.block_size).min(whole)
    }

    /// Whether sequence `id`'s next position starts a block it lacks.
    fn is_full_at(&self, id: SeqId) -> bool {
        self.seqs
            .get(&id)
            .is_some_and(|s| s.blocks * self.block_size <= s.cached)
    }

    /// Counts a step against `fail_after_steps` (the error when it is due)
    /// and holds it if `hold_at_step` says so.
    fn step_allowed(&mut self) -> Result<(), EngineError> {
        self.steps += 1;
        if let Some((at, go)) = &self.hold_at_step {
            if *at == self.steps {
                let _ = go.recv_timeout(Duration::from_secs(30));
            }
        }
        match &mut self.fail_after_steps {
            Some(0) => {
                self.fail_after_steps = None;
                Err(EngineError::Device("injected step failure".into()))
            }
            Some(n) => {
                *n -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Checks a decode step over `ids` (each decoding, planned or queued,
    /// blocks free) and takes its blocks and a step.
    fn grow_for(&mut self, ids: &[SeqId]) -> Result<(), EngineError> {
        if let Some(&id) = ids
            .iter()
            .find(|id| self.seqs.get(id).is_none_or(|s| s.computed != s.input_len))
        {
            return Err(EngineError::UnknownSequence(id));
        }
        let needed = self.blocks_to_grow(ids);
        let free = self.kv_blocks_free();
        if needed > free {
            return Err(EngineError::OutOfBlocks { needed, free });
        }
        self.step_allowed()?;
        for &id in ids {
            let full = self.is_full_at(id);
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.blocks += usize::from(full);
                seq.cached += 1;
            }
        }
        Ok(())
    }

    /// Judges a queued step: the next token of each of `ids` still there.
    fn judge(&mut self, ids: &[SeqId]) -> StepOutput {
        let mut out = StepOutput::default();
        for id in ids {
            let Some(seq) = self.seqs.get_mut(id).filter(|s| s.in_flight > 0) else {
                continue;
            };
            seq.in_flight -= 1;
            self.emit(*id, &mut out);
        }
        out
    }

    /// Emits the next token of `id` (its position), finishing it at its
    /// length; a stop token id finishes it without being emitted.
    fn emit(&mut self, id: SeqId, out: &mut StepOutput) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        let token = (seq.request.prompt.len() + seq.generated) as u32;
        if seq.request.params.stop.stop_token_ids.contains(&token) {
            let generated = seq.generated;
            self.seqs.remove(&id);
            return out.finished.push(FinishedSeq {
                id,
                reason: FinishReason::StopToken(token),
                generated,
            });
        }
        seq.generated += 1;
        out.tokens.push(SampledToken {
            id,
            index: seq.generated - 1,
            token,
            logprobs: seq.logprobs.map(|n| TokenLogprobs {
                logprob: -1.0,
                top: (0..n as u32).map(|i| (i, -1.0 - i as f32)).collect(),
            }),
        });
        if seq.generated >= seq.max_new_tokens {
            let generated = seq.generated;
            self.seqs.remove(&id);
            out.finished.push(FinishedSeq {
                id,
                reason: FinishReason::Length,
                generated,
            });
        }
    }
}

impl StepEngine for FakeEngine {
    fn kv_blocks_total(&self) -> usize {
        self.total_blocks
    }

    fn kv_blocks_free(&self) -> usize {
        self.total_blocks - self.kv_blocks_used()
    }

    fn kv_blocks_used(&self) -> usize {
        self.seqs.values().map(|s| s.blocks).sum()
    }

    fn prefix_caching(&self) -> bool {
        false
    }

    fn admission_cost(&self, req: &SequenceRequest) -> AdmissionCost {
        AdmissionCost {
            blocks: self.blocks_to_admit(req),
            cached_tokens: 0,
        }
    }

    fn admit(&mut self, req: &SequenceRequest) -> Result<usize, EngineError> {
        if self.refuse == Some(req.id) {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {} refused",
                req.id
            )));
        }
        let blocks = self.blocks_to_admit(req);
        let free = self.kv_blocks_free();
        if blocks > free {
            return Err(EngineError::OutOfBlocks {
                needed: blocks,
                free,
            });
        }
        self.seqs.insert(
            req.id,
            FakeSeq {
                request: req.clone(),
                input_len: req.input_len(),
                computed: 0,
                cached: 0,
                generated: req.resumed_tokens(),
                max_new_tokens: req.params.stop.max_new_tokens,
                blocks,
                logprobs: req.params.outputs.logprobs,
                in_flight: 0,
            },
        );
        Ok(0)
    }

    fn to_prefill(&self) -> Vec<(SeqId, usize)> {
        self.seqs
            .iter()
            .filter(|(_, s)| s.computed < s.input_len)
            .map(|(&id, s)| (id, s.input_len - s.computed))
            .collect()
    }

    fn decoding(&self) -> Vec<SeqId> {
        self.seqs
            .iter()
            .filter(|(_, s)| {
                s.computed == s.input_len && s.generated + s.in_flight < s.max_new_tokens
            })
            .map(|(&id, _)| id)
            .collect()
    }

    fn prefill_step(&mut self, chunks: &[PrefillChunk]) -> Result<StepOutput, EngineError> {
        if let Some(c) = chunks
            .iter()
            .find(|c| !self.to_prefill().iter().any(|p| p.0 == c.id))
        {
            return Err(EngineError::UnknownSequence(c.id));
        }
        self.step_allowed()?;
        let mut out = StepOutput::default();
        for c in chunks {
            let Some(seq) = self.seqs.get_mut(&c.id) else {
                continue;
            };
            seq.computed = (seq.computed + c.tokens).min(seq.input_len);
            seq.cached = seq.computed;
            if seq.computed == seq.input_len {
                self.emit(c.id, &mut out);
            }
        }
        Ok(out)
    }

    fn blocks_to_grow(&self, ids: &[SeqId]) -> usize {
        ids.iter().filter(|&&id| self.is_full_at(id)).count()
    }

    fn decode(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        let mut out = self.flush()?;
        let ids: Vec<SeqId> = ids
            .iter()
            .copied()
            .filter(|&id| self.seqs.contains_key(&id))
            .collect();
        self.grow_for(&ids)?;
        for &id in &ids {
            self.emit(id, &mut out);
        }
        Ok(out)
    }

    fn decode_async(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        if ids.is_empty() {
            return self.flush();
        }
        self.grow_for(ids)?;
        for id in ids {
            if let Some(seq) = self.seqs.get_mut(id) {
                seq.in_flight += 1;
            }
        }
        match self.queued.replace(ids.to_vec()) {
            Some(previous) => Ok(self.judge(&previous)),
            None => Ok(StepOutput::default()),
        }
    }

    fn flush(&mut self) -> Result<StepOutput, EngineError> {
        Ok(match self.queued.take() {
            Some(queued) => self.judge(&queued),
            None => StepOutput::default(),
        })
    }

    fn has_pending(&self) -> bool {
        self.queued.is_some()
    }

    fn preempt(&mut self, id: SeqId) -> Option<SequenceRequest> {
        let seq = self.seqs.remove(&id)?;
        let prompt_len = seq.request.prompt.len() as u32;
        let mut req = seq.request;
        req.resume = Some(ResumeState {
            // The fake's token at position p is p.
            generated: (prompt_len..prompt_len + seq.generated as u32).collect(),
            prompt_scored: 0,
        });
        Some(req)
    }

    fn release(&mut self, id: SeqId) -> Option<usize> {
        self.seqs.remove(&id).map(|s| s.generated)
    }
}
