//! [`Engine`] as the scheduler's [`StepEngine`]: each method is the engine's
//! own of the same name.

use super::Engine;
use crate::error::EngineError;
use crate::step_engine::StepEngine;
use crate::types::{AdmissionCost, PrefillChunk, SeqId, SequenceRequest, StepOutput};

impl StepEngine for Engine {
    fn kv_blocks_total(&self) -> usize {
        Engine::kv_blocks_total(self)
    }

    fn kv_blocks_free(&self) -> usize {
        Engine::kv_blocks_free(self)
    }

    fn kv_blocks_used(&self) -> usize {
        Engine::kv_blocks_used(self)
    }

    fn prefix_caching(&self) -> bool {
        Engine::prefix_caching(self)
    }

    fn admission_cost(&self, req: &SequenceRequest) -> AdmissionCost {
        Engine::admission_cost(self, req)
    }

    fn admit(&mut self, req: &SequenceRequest) -> Result<usize, EngineError> {
        Engine::admit(self, req)
    }

    fn to_prefill(&self) -> Vec<(SeqId, usize)> {
        Engine::to_prefill(self)
    }

    fn decoding(&self) -> Vec<SeqId> {
        Engine::decoding(self)
    }

    fn prefill_step(&mut self, chunks: &[PrefillChunk]) -> Result<StepOutput, EngineError> {
        Engine::prefill_step(self, chunks)
    }

    fn blocks_to_grow(&self, ids: &[SeqId]) -> usize {
        Engine::blocks_to_grow(self, ids)
    }

    fn decode(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        Engine::decode(self, ids)
    }

    fn decode_async(&mut self, ids: &[SeqId]) -> Result<StepOutput, EngineError> {
        Engine::decode_async(self, ids)
    }

    fn flush(&mut self) -> Result<StepOutput, EngineError> {
        Engine::flush(self)
    }

    fn has_pending(&self) -> bool {
        Engine::has_pending(self)
    }

    fn preempt(&mut self, id: SeqId) -> Option<SequenceRequest> {
        Engine::preempt(self, id)
    }

    fn release(&mut self, id: SeqId) -> Option<usize> {
        Engine::release(self, id)
    }
}
