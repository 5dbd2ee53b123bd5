//! [`PenaltyState`]: the penalties' and logit biases' per-sequence state on
//! the device, so a decode step with such rows costs the host nothing per
//! token.
//!
//! A sequence with a repetition, frequency or presence penalty or a
//! `logit_bias` gets a slot when it first decodes: row `slot` of the `[S,
//! 2V]` slot table, written once ([`slot_row`]): its counts from its
//! host-side stats (each token's output count and whether the prompt has
//! it) and its bias (`crate::ops::row_params`' layout). From then on the
//! sampling kernel reads that row beside the logits and applies the bias and
//! the penalties itself (inside a replayed decode graph like any other row),
//! and the step's final choice of every row with a slot is added
//! to its row ([`record_choices`]: a kernel at the end of the graph; a step
//! that chooses again after the graph, for host edits, takes the graph's
//! choice back first and adds its own). The slot is given
//! back when the sequence ends or is preempted; a resumed sequence gets a
//! fresh one written from its stats, which saw every token the device did.
//!
//! With every slot taken, or where the sampling kernel does not run (the
//! CPU), a sequence keeps its penalties as host edits
//! (`super::transforms`): the same logits, more host work.

use super::device_sampler::DeviceSampling;
use burn::prelude::*;

use crate::ops::row_params::{slot_row_len, COUNT_MASK, IN_PROMPT};
use crate::ops::InputBuffer;

/// The most slots a table holds (`S`): 256 rows of twice GPT-2's vocabulary
/// are 103 MB.
pub const MAX_SLOTS: usize = 256;

/// What a sequence's slot holds ([`slot_row`]): its tokens (`(token,
/// output count, whether the prompt has it)`) and its logit bias (`(token,
/// add)`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SlotContents {
    pub tokens: Vec<(u32, u32, bool)>,
    pub bias: Vec<(u32, f32)>,
}

/// A slot's row of the `[S, 2V]` table over `vocab` tokens: the counts of
/// `tokens` (`(token, output count, whether the prompt has it)`, each token
/// once) at `0..V`, then the f32 bit patterns of `bias` (`(token, add)`,
/// added up per token in order, as the host edits do) at `V..2V`; tokens
/// outside the vocabulary are skipped.
pub fn slot_row(
    vocab: usize,
    tokens: impl IntoIterator<Item = (u32, u32, bool)>,
    bias: &[(u32, f32)],
) -> Vec<i32> {
    let mut row = vec![0i32; slot_row_len(vocab)];
    for (token, count, in_prompt) in tokens {
        if let Some(entry) = row[..vocab].get_mut(token as usize) {
            let prompt = if in_prompt { IN_PROMPT } else { 0 };
            *entry = (count.min(COUNT_MASK) | prompt) as i32;
        }
    }
    let mut adds = vec![0.0f32; vocab];
    for &(token, add) in bias {
        if let Some(a) = adds.get_mut(token as usize) {
            *a += add;
        }
    }
    for (entry, add) in row[vocab..].iter_mut().zip(adds) {
        *entry = add.to_bits() as i32;
    }
    row
}

/// See the module docs.
#[derive(Debug)]
pub struct PenaltyState {
    counts: InputBuffer<2, Int>,
    /// Slots no sequence holds, the next one taken last.
    free: Vec<u32>,
    vocab: usize,
}

impl PenaltyState {
    /// A table of `slots` rows over `vocab` tokens, every slot free.
    pub fn new(slots: usize, vocab: usize, device: &Device) -> Self {
        Self {
            // In device memory before any graph is captured over it.
            counts: InputBuffer::resident_zeros([slots, slot_row_len(vocab)], device),
            free: (0..slots as u32).rev().collect(),
            vocab,
        }
    }

    /// The state for a decode batch of up to `max_batch` rows on `device`,
    /// where `sampling` keeps penalties on the device.
    pub fn for_device(
        max_batch: usize,
        vocab: usize,
        device: &Device,
        sampling: DeviceSampling,
    ) -> Option<Self> {
        sampling
            .penalties
            .then(|| Self::new(max_batch.clamp(1, MAX_SLOTS), vocab, device))
    }

    /// The slot table `[S, 2V]` (a handle to the same device memory).
    pub fn counts(&self) -> Tensor<2, Int> {
        self.counts.tensor()
    }

    /// Takes a free slot and writes a sequence's `tokens` and `bias` into
    /// its row ([`slot_row`]). `None` when every slot is taken.
    pub fn acquire(
        &mut self,
        tokens: impl IntoIterator<Item = (u32, u32, bool)>,
        bias: &[(u32, f32)],
    ) -> Option<u32> {
        let slot = self.free.pop()?;
        let row = slot_row(self.vocab, tokens, bias);
        self.counts.write_rows(&[slot as usize], row);
        Some(slot)
    }

    /// Gives `slot` back (a slot not taken, or given twice, is ignored).
    pub fn release(&mut self, slot: u32) {
        if !self.free.contains(&slot) && (slot as usize) < self.slots() {
            self.free.push(slot);
        }
    }

    /// Rows in the table.
    pub fn slots(&self) -> usize {
        self.counts.tensor().dims()[0]
    }

    /// Slots no sequence holds.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }
}

/// Adds each penalized row's chosen token (`ids` `[B, 1]`, rows whose
/// `row_params` int columns `ints` `[B, INT_COLS]` name a slot) to its row
/// of `counts`, in place (takes it back with `undo`). Only where the
/// sampling kernel runs (CUDA): elsewhere no row has a slot.
pub fn record_choices(
    counts: &Tensor<2, Int>,
    ids: &Tensor<2, Int>,
    ints: Tensor<2, Int>,
    undo: bool,
) {
    #[cfg(feature = "cuda")]
    {
        let _ = crate::ops::cuda::count_chosen(counts.clone(), ids.clone(), ints, undo);
    }
    #[cfg(not(feature = "cuda"))]
    let _ = (counts, ids, ints, undo);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counts half of `slot`'s row.
    fn row(state: &PenaltyState, slot: u32) -> Vec<i64> {
        let all: Vec<i64> = state.counts().into_data().iter::<i64>().collect();
        let v = state.vocab;
        let at = slot as usize * slot_row_len(v);
        all[at..at + v].to_vec()
    }

    #[test]
    fn a_slot_row_holds_counts_then_bias_bits() {
        let row = slot_row(
            4,
            [(1, 2, true), (7, 1, false)],
            &[(3, 1.5), (3, -0.25), (9, 2.0)],
        );
        assert_eq!(
            &row[..4],
            [0, (2 | IN_PROMPT) as i32, 0, 0],
            "token 7 is outside"
        );
        let bias: Vec<f32> = row[4..].iter().map(|&b| f32::from_bits(b as u32)).collect();
        assert_eq!(
            bias,
            [0.0, 0.0, 0.0, 1.25],
            "a token's adds summed; token 9 outside"
        );
    }

    #[test]
    fn a_slot_holds_its_sequences_counts_and_comes_back() {
        let mut state = PenaltyState::new(2, 6, &Device::flex());
        let a = state
            .acquire([(1, 2, false), (4, 0, true), (9, 1, false)], &[])
            .unwrap();
        let b = state.acquire([(0, 1, true)], &[(2, 0.5)]).unwrap();
        assert_ne!(a, b);
        assert_eq!(
            row(&state, a),
            [0, 2, 0, 0, IN_PROMPT as i64, 0],
            "token 9 is outside"
        );
        assert_eq!(row(&state, b), [1 | IN_PROMPT as i64, 0, 0, 0, 0, 0]);
        assert_eq!(state.acquire([], &[]), None, "every slot taken");
        state.release(a);
        state.release(a);
        assert_eq!(state.free_slots(), 1, "a slot given twice counts once");
        // The next holder's row is written whole: nothing of `a`'s is left.
        let c = state.acquire([(5, 3, false)], &[]).unwrap();
        assert_eq!(c, a);
        assert_eq!(row(&state, c), [0, 0, 0, 0, 0, 3]);
        assert_eq!(
            row(&state, b),
            [1 | IN_PROMPT as i64, 0, 0, 0, 0, 0],
            "other rows kept"
        );
    }
}
