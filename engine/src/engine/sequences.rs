//! [`Sequences`]: the host half of the engine. Every admitted sequence (one
//! owner of sequence state) and the block pool its tables come from.
//!
//! A request enters in two moves:
//! 1. [`Sequences::admit`] looks the prompt's full blocks up in the prefix
//!    cache (chained content keys, [`crate::kv::prefix_cache`]), takes the
//!    longest run of cached blocks as the head of its block table (shared,
//!    read-only) and fresh blocks for the rest of its budget. The last prompt
//!    token is never taken from the cache: its logits give the first sampled
//!    token, so the hit stops at the last full block before it. No compute
//!    happens here.
//! 2. Prefill steps compute the rest of the prompt in one or more chunks
//!    (`super::prefill`); a prompt's full blocks are keyed in the prefix cache
//!    as soon as they are computed ([`Sequences::key_full_blocks`]), so
//!    requests arriving meanwhile already share them. The step that completes
//!    the prompt samples the first token: from then on the sequence decodes.
//!
//! When a sequence ends ([`Sequences::release`]) or is preempted
//! ([`Sequences::preempt`]: its request comes back with what it generated,
//! to be admitted again and recomputed) the full blocks of its generated
//! tokens are keyed too (a follow-up request that repeats the
//! conversation reuses them), then its holds are dropped: unshared cached
//! blocks are parked in the LRU order, the rest become empty.
//!
//! Sequences are kept by id in a `BTreeMap`: ids rise with submission (the
//! scheduler hands them out), so iteration order is admission order, which is
//! the order prefill chunks get the token budget and decode rotates.

use std::collections::BTreeMap;

use super::sequence::Sequence;
use crate::error::EngineError;
use crate::kv::{BlockHash, BlockPool};
use crate::types::{AdmissionCost, SeqId, SequenceRequest};

/// A prompt's match against the prefix cache.
struct PrefixMatch {
    /// Keys of the prompt's full blocks.
    hashes: Vec<BlockHash>,
    /// Cached blocks of its longest reusable prefix.
    hits: Vec<u32>,
}

/// Every admitted sequence and the block pool (see the module docs).
pub(crate) struct Sequences {
    /// Which blocks are free, held or cached (the prefix cache).
    blocks: BlockPool,
    block_size: usize,
    /// Admitted and not yet finished or released, prefilling or decoding.
    seqs: BTreeMap<SeqId, Sequence>,
    /// Device penalty slots of released sequences, for the engine to give
    /// back to the runner ([`Sequences::take_freed_penalty_slots`]).
    freed_penalty_slots: Vec<u32>,
    /// Admissions so far: the next sequence's serial.
    admitted: u64,
}

impl Sequences {
    pub fn new(num_blocks: usize, block_size: usize, prefix_caching: bool) -> Self {
        Self {
            blocks: BlockPool::new(num_blocks, prefix_caching),
            block_size,
            seqs: BTreeMap::new(),
            freed_penalty_slots: Vec::new(),
            admitted: 0,
        }
    }

    pub fn blocks(&self) -> &BlockPool {
        &self.blocks
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn contains(&self, id: SeqId) -> bool {
        self.seqs.contains_key(&id)
    }

    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    pub fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&id)
    }

    /// The sequences of `ids`, in their order, each borrowed once (so they
    /// can be worked on in parallel); `None` if an id is unknown or listed
    /// twice.
    pub fn many_mut(&mut self, ids: &[SeqId]) -> Option<Vec<&mut Sequence>> {
        let wanted: std::collections::HashSet<SeqId> = ids.iter().copied().collect();
        let mut by_id: std::collections::HashMap<SeqId, &mut Sequence> = self
            .seqs
            .iter_mut()
            .filter(|(id, _)| wanted.contains(id))
            .map(|(&id, s)| (id, s))
            .collect();
        let seqs: Vec<&mut Sequence> = ids.iter().filter_map(|id| by_id.remove(id)).collect();
        (seqs.len() == ids.len()).then_some(seqs)
    }

    /// The decoding sequence `id`, or [`EngineError::UnknownSequence`] (also
    /// for one still prefilling: decode refuses it).
    pub fn decoding(&self, id: SeqId) -> Result<&Sequence, EngineError> {
        self.seqs
            .get(&id)
            .filter(|s| s.is_decoding())
            .ok_or(EngineError::UnknownSequence(id))
    }

    /// The prefilling sequence `id`, or [`EngineError::UnknownSequence`].
    pub fn prefilling(&self, id: SeqId) -> Result<&Sequence, EngineError> {
        self.seqs
            .get(&id)
            .filter(|s| !s.is_decoding())
            .ok_or(EngineError::UnknownSequence(id))
    }

    /// Sequences whose prompt is not all in the cache, in admission order,
    /// with the prompt tokens each has left.
    pub fn to_prefill(&self) -> impl Iterator<Item = (SeqId, usize)> + '_ {
        self.seqs
            .iter()
            .filter(|(_, s)| !s.is_decoding())
            .map(|(&id, s)| (id, s.prompt_remaining()))
    }

    /// Decoding sequences, in admission order; not those whose queued steps
    /// already reach their `max_new_tokens` (the overlapped loop plans
    /// lengths exactly).
    pub fn decoding_ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs
            .iter()
            .filter(|(_, s)| s.is_decoding() && !s.budget_queued())
            .map(|(&id, _)| id)
    }

    /// What admitting `req` holding `total_blocks` would take now.
    pub fn admission_cost(&self, req: &SequenceRequest, total_blocks: usize) -> AdmissionCost {
        let m = self.match_prefix(req);
        AdmissionCost {
            blocks: self
                .blocks
                .cost(&m.hits, total_blocks.saturating_sub(m.hits.len())),
            cached_tokens: m.hits.len() * self.block_size,
        }
    }

    /// Admits `req` (already validated) holding `total_blocks`, the cached
    /// prefix first; returns the input tokens found cached. On any
    /// error nothing changed ([`EngineError::OutOfBlocks`]: keep it waiting).
    pub fn admit(
        &mut self,
        req: &SequenceRequest,
        total_blocks: usize,
    ) -> Result<usize, EngineError> {
        if self.contains(req.id) {
            return Err(EngineError::DuplicateSequence(req.id));
        }
        let PrefixMatch { hashes, hits } = self.match_prefix(req);
        let table = self
            .blocks
            .acquire(&hits, total_blocks.saturating_sub(hits.len()))?;
        let cached = hits.len() * self.block_size;
        self.admitted += 1;
        self.seqs.insert(
            req.id,
            Sequence::new(req, table, cached, hits.len(), hashes, self.admitted),
        );
        Ok(cached)
    }

    /// Ends a sequence, prefilling or decoding (cancel, finish): offers its
    /// computed full blocks to the prefix cache and drops its hold on its
    /// blocks. Returns it, or `None` if unknown.
    pub fn release(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = self.seqs.remove(&id)?;
        // Positions of queued steps whose tokens it never judged are not its
        // (their K/V land in blocks freed or not keyed here, before any
        // later step that reuses them, on the same stream).
        seq.cached -= seq.in_flight;
        seq.in_flight = 0;
        self.freed_penalty_slots.extend(seq.penalty_slot.take());
        key_blocks(&mut self.blocks, self.block_size, &mut seq);
        self.blocks.release(&seq.table);
        Some(seq)
    }

    /// The device penalty slots released sequences held, since the last call.
    pub fn take_freed_penalty_slots(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.freed_penalty_slots)
    }

    /// Fresh blocks a decode step over `ids` takes: one for each sequence
    /// whose next position (`cached`) is past its table.
    pub fn blocks_to_grow(&self, ids: &[SeqId]) -> usize {
        ids.iter()
            .filter_map(|id| self.seqs.get(id))
            .filter(|s| s.table.len() * self.block_size <= s.cached)
            .count()
    }

    /// Takes the blocks of [`Sequences::blocks_to_grow`] for `ids`, all or
    /// nothing ([`EngineError::OutOfBlocks`]: nothing changed).
    pub fn grow(&mut self, ids: &[SeqId]) -> Result<(), EngineError> {
        let needed = self.blocks_to_grow(ids);
        if needed == 0 {
            return Ok(());
        }
        let mut fresh = self.blocks.acquire(&[], needed)?;
        for id in ids {
            let bs = self.block_size;
            if let Some(seq) = self.seqs.get_mut(id) {
                if seq.table.len() * bs <= seq.cached {
                    if let Some(block) = fresh.pop() {
                        seq.table.push(block);
                    }
                }
            }
        }
        Ok(())
    }

    /// Takes a sequence out to free its blocks (see
    /// [`crate::StepEngine::preempt`]): like [`Sequences::release`] (its
    /// computed full blocks stay in the prefix cache, where a resume finds
    /// them unless they are evicted first), and returns its request with what
    /// resuming it needs. `None` if unknown.
    pub fn preempt(&mut self, id: SeqId) -> Option<SequenceRequest> {
        self.release(id).map(Sequence::into_resumable)
    }

    /// Offers the full blocks sequence `id` computed since the last call to
    /// the prefix cache, in chain order (content already cached elsewhere
    /// stays private).
    pub fn key_full_blocks(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            key_blocks(&mut self.blocks, self.block_size, seq);
        }
    }

    /// Reserves a fresh table of `counts[i]` blocks for each of a batch of
    /// rows that are not sequences (the prompt-logits check); all or nothing.
    pub fn reserve_tables(&mut self, counts: &[usize]) -> Result<Vec<Vec<u32>>, EngineError> {
        self.blocks.reserve_tables(counts)
    }

    /// Gives back tables from [`Sequences::reserve_tables`].
    pub fn release_tables(&mut self, tables: &[Vec<u32>]) {
        for t in tables {
            self.blocks.release(t);
        }
    }

    /// The input's full-block keys and its longest cached prefix, stopping
    /// before the block of the last token (which must be computed). A
    /// request that scores its prompt (`prompt_logprobs`) takes no hit: the
    /// logits of every position are computed.
    fn match_prefix(&self, req: &SequenceRequest) -> PrefixMatch {
        let input = input_tokens(req);
        let hashes = self.blocks.block_hashes(&input, self.block_size);
        let reusable = input.len().saturating_sub(1) / self.block_size;
        let hits = if req.params.outputs.prompt_logprobs.is_some() {
            Vec::new()
        } else {
            self.blocks.lookup(&hashes[..reusable.min(hashes.len())])
        };
        PrefixMatch { hashes, hits }
    }
}

/// A request's input: its prompt, then the tokens it generated before a
/// preemption (borrowed when there are none).
fn input_tokens(req: &SequenceRequest) -> std::borrow::Cow<'_, [u32]> {
    match &req.resume {
        Some(r) if !r.generated.is_empty() => {
            std::borrow::Cow::Owned([req.prompt.as_slice(), &r.generated].concat())
        }
        _ => std::borrow::Cow::Borrowed(&req.prompt),
    }
}

/// Keys `seq`'s full blocks computed since the last call in `blocks`' prefix
/// cache (see [`Sequences::key_full_blocks`]).
fn key_blocks(blocks: &mut BlockPool, bs: usize, seq: &mut Sequence) {
    let full = seq.cached / bs;
    if full <= seq.keyed || !blocks.prefix_caching() {
        return;
    }
    if seq.hashes.len() < full {
        let from = seq.hashes.len() * bs;
        let more =
            blocks.extend_hashes(seq.hashes.last().copied(), &seq.tokens[from..full * bs], bs);
        seq.hashes.extend(more);
    }
    for i in seq.keyed..full {
        blocks.register(seq.table[i], seq.hashes[i]);
    }
    seq.keyed = full;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(ids: &[SeqId]) -> Sequences {
        let mut seqs = Sequences::new(64, 4, false);
        for &id in ids {
            seqs.admit(&SequenceRequest::greedy(id, vec![1, 2, 3], 4), 2)
                .unwrap();
        }
        seqs
    }

    #[test]
    fn many_mut_borrows_each_listed_sequence_once_in_the_listed_order() {
        let mut seqs = admitted(&[1, 2, 3]);
        {
            let listed = seqs.many_mut(&[3, 1]).unwrap();
            assert_eq!(listed.len(), 2);
            let Ok([third, first]) = <[&mut Sequence; 2]>::try_from(listed) else {
                panic!("two sequences listed");
            };
            third.generated = 30;
            first.generated = 10;
        }
        assert_eq!(seqs.get(3).unwrap().generated, 30);
        assert_eq!(seqs.get(1).unwrap().generated, 10);
        assert_eq!(seqs.get(2).unwrap().generated, 0, "not listed, not touched");
        assert!(seqs.many_mut(&[1, 1]).is_none(), "a sequence listed twice");
        assert!(seqs.many_mut(&[1, 9]).is_none(), "an unknown sequence");
    }

    #[test]
    fn a_released_or_preempted_sequence_gives_its_penalty_slot_back_once() {
        let mut seqs = admitted(&[1, 2, 3]);
        seqs.get_mut(1).unwrap().penalty_slot = Some(4);
        seqs.get_mut(2).unwrap().penalty_slot = Some(7);
        assert!(seqs.release(1).is_some());
        assert!(seqs.preempt(2).is_some());
        assert!(seqs.release(3).is_some(), "no slot, nothing to give back");
        assert_eq!(seqs.take_freed_penalty_slots(), [4, 7]);
        assert!(seqs.take_freed_penalty_slots().is_empty(), "taken once");
    }
}
