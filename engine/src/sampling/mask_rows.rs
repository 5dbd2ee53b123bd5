//! [`MaskRows`]: each decode row's allowed-token bitmask as a persistent
//! device buffer the sampling kernel reads inside the decode graph, so a
//! structured-output row (its constraint's allowed set) or a row before its
//! `min_tokens` (its stop tokens banned) adds no work after the graph.
//!
//! The host writes only the rows whose mask changed since the last step
//! (`ceil(V / 32)` words a row, all of a step's in one write), and flags the masked rows in the
//! parameter columns (`row_params::FLAG_ALLOWED`); unflagged rows read
//! nothing. A row's words are [`row_words`]: the allowed set (all tokens
//! without one) less the banned tokens, unless the bans would leave nothing
//! allowed (then the constraint, which knows what may come next, wins), the
//! same rule as the host transforms (`super::transforms`).

use burn::prelude::*;

use super::table::SamplingTable;
use crate::ops::InputBuffer;

/// The bitmask words of a row with `allowed` (a constraint's bitset: bit
/// `t % 32` of word `t / 32`; `None`: every token) and `banned` tokens,
/// over `v` tokens (bits past `v` cleared). `None` when the row has
/// neither (nothing masked).
pub fn row_words(allowed: Option<&[u32]>, banned: &[u32], v: usize) -> Option<Vec<i32>> {
    if allowed.is_none() && banned.is_empty() {
        return None;
    }
    let w = v.div_ceil(32);
    let mut words: Vec<i32> = match allowed {
        Some(bits) => (0..w)
            .map(|k| bits.get(k).copied().unwrap_or(0) as i32)
            .collect(),
        None => vec![-1; w],
    };
    if let Some(last) = words.last_mut().filter(|_| !v.is_multiple_of(32)) {
        *last &= ((1u32 << (v % 32)) - 1) as i32;
    }
    let mut kept = words.clone();
    for &t in banned.iter().filter(|&&t| (t as usize) < v) {
        kept[t as usize / 32] &= !(1i32 << (t % 32));
    }
    if kept.iter().any(|&x| x != 0) {
        words = kept;
    }
    Some(words)
}

/// See the module docs.
#[derive(Debug)]
pub struct MaskRows {
    words: InputBuffer<2, Int>,
    /// Each row's words as last written (`None`: never written).
    written: Vec<Option<Vec<i32>>>,
    vocab: usize,
}

impl MaskRows {
    /// Masks for `rows` rows over `vocab` tokens, in device memory now
    /// ([`InputBuffer::resident_zeros`]: a decode graph captured after this
    /// reads what the writes leave there).
    pub fn new(rows: usize, vocab: usize, device: &Device) -> Self {
        Self {
            words: InputBuffer::resident_zeros([rows, vocab.div_ceil(32)], device),
            written: vec![None; rows],
            vocab,
        }
    }

    /// The `[rows, ceil(V / 32)]` words (a handle to the same memory).
    pub fn tensor(&self) -> Tensor<2, Int> {
        self.words.tensor()
    }

    /// Writes the masks of `table`'s rows that have one and changed;
    /// returns which rows are masked (their flag for the kernel).
    pub fn write(&mut self, table: &SamplingTable) -> Vec<bool> {
        let mut masked = vec![false; table.len()];
        let (mut rows, mut values) = (Vec::new(), Vec::new());
        for (i, flag) in masked.iter_mut().enumerate().take(self.written.len()) {
            let allowed = table.allowed[i].as_deref();
            let Some(words) = row_words(allowed, &table.banned[i], self.vocab) else {
                continue;
            };
            *flag = true;
            if self.written[i].as_ref() != Some(&words) {
                rows.push(i);
                values.extend_from_slice(&words);
                self.written[i] = Some(words);
            }
        }
        // The step's changed rows in one write.
        self.words.write_rows(&rows, values);
        masked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::table::RowSampling;

    #[test]
    fn words_clear_bans_and_bits_past_the_vocabulary_and_a_ban_yields() {
        assert_eq!(row_words(None, &[], 40), None);
        // 40 tokens: two words, the second 8 bits wide; token 33 banned.
        let w = row_words(None, &[33], 40).unwrap();
        assert_eq!(w, [-1, 0xFF & !(1 << 1)]);
        // Allowed {3} only, 3 banned: the ban yields.
        assert_eq!(row_words(Some(&[0b1000]), &[3], 40).unwrap(), [0b1000, 0]);
        // Allowed {0, 2}, 2 banned: 0 alone.
        assert_eq!(row_words(Some(&[0b101]), &[2], 40).unwrap(), [0b1, 0]);
    }

    #[test]
    fn only_changed_rows_are_written_and_unmasked_rows_are_not_flagged() {
        let mut masks = MaskRows::new(3, 40, &Device::flex());
        let mut t = SamplingTable::with_capacity(2);
        t.push(RowSampling::greedy());
        t.push(RowSampling {
            allowed: Some(vec![0b110]),
            ..RowSampling::greedy()
        });
        assert_eq!(masks.write(&t), [false, true]);
        let on_device: Vec<i64> = masks.tensor().into_data().iter::<i64>().collect();
        assert_eq!(on_device, [0, 0, 0b110, 0, 0, 0]);
        assert_eq!(masks.written[1].as_deref(), Some(&[0b110, 0][..]));
        assert_eq!(
            masks.written[0], None,
            "a row without a mask writes nothing"
        );
    }
}
