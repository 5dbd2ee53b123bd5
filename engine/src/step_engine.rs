//! [`StepEngine`]: what the scheduler needs from an engine, and nothing more.
//!
//! The continuous-batching loop (`ember-server`'s scheduler) plans with this
//! trait: admission costs and free blocks, admitting, one prefill step, one
//! decode step, releasing. The engine is the one owner of sequence state (the
//! scheduler asks it which sequences still prefill and which decode), so the
//! loop keeps only what a request's client needs (its event channel, its
//! span). [`crate::Engine`] implements it; the scheduler's tests implement it
//! with a small fake that loads no model (text-embeddings-inference's
//! `Backend` and text-generation-inference's `infer::Backend` play the same
//! part).

use crate::error::EngineError;
use crate::types::{AdmissionCost, PrefillChunk, SeqId, SequenceRequest, StepOutput};

/// The engine as the scheduler drives it (see the module docs). Sequence ids
/// are the caller's and rise with arrival: the lists below are in id order.
pub trait StepEngine {
    /// KV blocks in the cache.
    fn kv_blocks_total(&self) -> usize;

    /// Blocks admission can count on: empty ones and cached ones no sequence
    /// holds.
    fn kv_blocks_free(&self) -> usize;

    /// Blocks held by at least one sequence.
    fn kv_blocks_used(&self) -> usize;

    /// Whether full blocks are reused across requests that share a prefix.
    fn prefix_caching(&self) -> bool;

    /// What admitting a request (new, or resumed after a preemption) would
    /// take now: blocks, and input tokens found in the prefix cache.
    fn admission_cost(&self, req: &SequenceRequest) -> AdmissionCost;

    /// Admits a request (the blocks of its input and next token taken);
    /// returns the input tokens found cached. A resumed request (`req.resume`, from
    /// [`StepEngine::preempt`]) prefills its prompt and the tokens it had
    /// generated, then goes on where it stopped. [`EngineError::OutOfBlocks`]
    /// leaves it waiting; any error leaves the engine unchanged.
    fn admit(&mut self, req: &SequenceRequest) -> Result<usize, EngineError>;

    /// Admitted sequences whose prompt is not all computed yet, with the
    /// prompt tokens each has left.
    fn to_prefill(&self) -> Vec<(SeqId, usize)>;

    /// Sequences that decode (prompt computed, first token sampled).
    fn decoding(&self) -> Vec<SeqId>;

    /// Computes the next chunk of each named prompt; sequences whose prompt
    /// completes sample their first token. On an error no sequence advances.
    fn prefill_step(&mut self, chunks: &[PrefillChunk]) -> Result<StepOutput, EngineError>;

    /// Fresh blocks [`StepEngine::decode`] over `ids` takes (one per
    /// sequence that starts a new block): the scheduler makes sure that many
    /// are free, preempting if it must, before the step.
    fn blocks_to_grow(&self, ids: &[SeqId]) -> usize;

    /// One token for each named decoding sequence; takes the blocks of
    /// [`StepEngine::blocks_to_grow`] first ([`EngineError::OutOfBlocks`]
    /// leaves everything unchanged).
    fn decode(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError>;

    /// The overlapped decode step: queues a step over `ids` like
    /// [`StepEngine::decode`] and, without waiting for it, returns the
    /// output of the step the previous call queued (sequences that step
    /// ended may be in `ids`: their row is wasted, its token never
    /// emitted). Empty `ids` only return the queued step's output. An
    /// engine that cannot overlap runs [`StepEngine::decode`] (the default).
    fn decode_async(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        self.decode(ids)
    }

    /// The output of the step [`StepEngine::decode_async`] queued, if any
    /// (waiting for it).
    fn flush(&mut self) -> Result<StepOutput, EngineError> {
        Ok(StepOutput::default())
    }

    /// Whether a step queued by [`StepEngine::decode_async`] has not been
    /// returned yet.
    fn has_pending(&self) -> bool {
        false
    }

    /// The preemption seam: takes a sequence out wherever it is, frees its
    /// blocks (its computed full blocks stay in the prefix cache until
    /// evicted) and returns its request with what resuming it by recompute
    /// needs (`resume`: the tokens it emitted, its RNG state). Admitting that
    /// request again continues the sequence exactly; the scheduler decides
    /// whom to preempt and when. `None` if unknown.
    fn preempt(&mut self, id: SeqId) -> Option<SequenceRequest>;

    /// Ends a sequence wherever it is and frees its blocks; returns the
    /// tokens it emitted, or `None` if unknown.
    fn release(&mut self, id: SeqId) -> Option<usize>;
}
