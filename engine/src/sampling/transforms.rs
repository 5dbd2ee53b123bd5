//! The logit transforms of the rows that ask for them, applied on the device
//! before the choice, in vLLM's order: `logit_bias`, then the repetition
//! penalty, then the frequency and presence penalties over the edited
//! `(row, token)` entries (on CUDA one kernel while the logits are copied to
//! f32, `crate::ops::vocab::edit_rows`; elsewhere one gather, one
//! element-wise pass and one scatter), then banned tokens (`min_tokens`) and a structured-output row's allowed
//! set (a large negative value on every other token, so nothing is NaN).
//!
//! Only steps where some row asks run any of it ([`super::SamplingTable::
//! any_changes_logits`]), and only the entries the rows name are touched: a
//! row without options keeps its logits. Two halves, so the host never waits
//! on the device in the middle of a step: [`Prepared::new`] builds the
//! step's lists on the host (the tokens a penalized sequence has, the bans)
//! and uploads them with the step's other inputs, before the forward is
//! launched; [`apply`] then only queues device work on the forward's logits.
//! An allowed set goes up as its bitmask (`V / 32` words a row, every bit
//! set for a row without one) and is expanded on the device.

use burn::prelude::*;
use burn::tensor::{DType, IndexingUpdateOp};

use super::mask_rows::row_words;
use super::table::SamplingTable;
use crate::ops::vocab::edit_rows;

/// What a token that may not be chosen gets: far below any logit, finite.
pub const EXCLUDED: f32 = -1.0e30;

/// One step's transform inputs, on the device (see the module docs).
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Flat indices `row * V + token` of the edited entries, and their
    /// `add`, repetition factor and `subtract`.
    edits: Option<(Tensor<1, Int>, Tensor<1>, Tensor<1>, Tensor<1>)>,
    /// Flat indices of banned entries (rows without an allowed set).
    banned: Option<Tensor<1, Int>>,
    /// `[rows, ceil(V / 32)]` allowed-token bitmasks (bit `t % 32` of word
    /// `t / 32`), when some row has one, with the vocabulary's [`TokenBits`].
    allowed: Option<(Tensor<2, Int>, TokenBits)>,
}

/// Each token's word (`t / 32`) and bit (`t % 32`) in a bitmask row, as
/// `[1, V]` device tensors: made once per vocabulary and device and kept by
/// the caller (no per-step upload).
#[derive(Debug, Clone)]
pub struct TokenBits {
    word: Tensor<2, Int>,
    shift: Tensor<2, Int>,
}

impl TokenBits {
    pub fn new(v: usize, device: &Device) -> Self {
        let word: Vec<i32> = (0..v as i32).map(|t| t / 32).collect();
        let shift: Vec<i32> = (0..v as i32).map(|t| t % 32).collect();
        let row = |x: Vec<i32>| Tensor::<2, Int>::from_data(TensorData::new(x, [1, v]), device);
        TokenBits {
            word: row(word),
            shift: row(shift),
        }
    }
}

/// Pads `n` entries to a bucket (a power of two, at least 64), so a
/// step's edit-list shapes repeat from step to step and the device's
/// compiled kernels are reused.
fn bucket(n: usize) -> usize {
    n.max(64).next_power_of_two()
}

impl Prepared {
    /// The inputs of `table`'s rows for logits of `rows` rows (`>=` the
    /// table's; the rest are padding) over `v` tokens, uploaded to `device`;
    /// with `edits_only`, no bans or allowed sets (the sampling kernel masks
    /// those itself, `super::mask_rows`).
    pub fn new(
        table: &SamplingTable,
        rows: usize,
        v: usize,
        bits: &TokenBits,
        device: &Device,
        edits_only: bool,
    ) -> Self {
        let mut lists = Lists::of(table, rows, v, edits_only);
        lists.pad(rows, v);
        let floats = |x: Vec<f32>| {
            let n = x.len();
            Tensor::<1>::from_data(TensorData::new(x, [n]), (device, DType::F32))
        };
        let edits = (!lists.idx.is_empty()).then(|| {
            (
                ints(lists.idx, device),
                floats(lists.add),
                floats(lists.rep),
                floats(lists.sub),
            )
        });
        let banned = (!lists.banned.is_empty()).then(|| ints(lists.banned, device));
        let allowed = lists.words.map(|words| {
            let w = words.len() / rows.max(1);
            let words = Tensor::<2, Int>::from_data(TensorData::new(words, [rows, w]), device);
            (words, bits.clone())
        });
        Prepared {
            edits,
            banned,
            allowed,
        }
    }
}

/// `logits` (`[B, V]`, `B` = the rows [`Prepared::new`] was given) as f32,
/// with every row's edits, bans and allowed set applied. On CUDA the edits
/// are one kernel ([`crate::ops::vocab::edit_rows`]); these tensor ops
/// elsewhere, and as its reference.
pub fn apply(logits: Tensor<2>, prepared: &Prepared) -> Tensor<2> {
    let [b, v] = logits.dims();
    let logits = match &prepared.edits {
        Some((idx, add, rep, sub)) => match edit_rows(&logits, idx, add, rep, sub) {
            Some(edited) => edited,
            None => edit_tensor_ops(logits.cast(DType::F32), idx, add, rep, sub),
        },
        None => logits.cast(DType::F32),
    };
    let mut flat = logits.reshape([b * v]);
    if let Some(idx) = prepared.banned.clone() {
        let n = idx.dims()[0];
        let vals = Tensor::<1>::full([n], EXCLUDED, (&flat.device(), DType::F32));
        flat = scatter(flat, idx, vals);
    }
    let logits = flat.reshape([b, v]);
    match prepared.allowed.clone() {
        Some((words, bits)) => {
            let word = bits.word.expand([b, v]);
            let shift = bits.shift.expand([b, v]);
            let bits = words.gather(1, word).bitwise_right_shift(shift);
            let disallowed = bits.bitwise_and_scalar(1).equal_elem(0);
            logits.mask_fill(disallowed, EXCLUDED)
        }
        None => logits,
    }
}

/// The edits as tensor ops on f32 `logits` `[B, V]`: a gather of the
/// edited entries, the element-wise update, a scatter back.
fn edit_tensor_ops(
    logits: Tensor<2>,
    idx: &Tensor<1, Int>,
    add: &Tensor<1>,
    rep: &Tensor<1>,
    sub: &Tensor<1>,
) -> Tensor<2> {
    let [b, v] = logits.dims();
    let flat = logits.reshape([b * v]);
    let vals = flat.clone().select(0, idx.clone()) + add.clone();
    let positive = vals.clone().greater_elem(0.0);
    let vals = (vals.clone() * rep.clone()).mask_where(positive, vals / rep.clone()) - sub.clone();
    scatter(flat, idx.clone(), vals).reshape([b, v])
}

/// `flat` with `vals` assigned at the (distinct) indices `idx`: one thread
/// an entry (`select_assign` on a 1-D tensor runs one thread over them all).
fn scatter(flat: Tensor<1>, idx: Tensor<1, Int>, vals: Tensor<1>) -> Tensor<1> {
    let n = idx.dims()[0];
    flat.scatter_nd(idx.reshape([n, 1]), vals, IndexingUpdateOp::Assign)
}

/// One step's host-side lists, flat indices `row * V + token`.
#[derive(Debug, Default, PartialEq)]
struct Lists {
    /// Edited entries and their `add`, repetition factor and `subtract`.
    idx: Vec<i32>,
    add: Vec<f32>,
    rep: Vec<f32>,
    sub: Vec<f32>,
    /// Banned entries of rows without an allowed set.
    banned: Vec<i32>,
    /// Every row's allowed bitmask (all bits set: no constraint), when some
    /// row has one; a row's bans are cleared from its own words.
    words: Option<Vec<i32>>,
}

impl Lists {
    fn of(table: &SamplingTable, rows: usize, v: usize, edits_only: bool) -> Self {
        let mut l = Lists::default();
        let w = v.div_ceil(32);
        if !edits_only && (0..table.len()).any(|i| table.allowed[i].is_some()) {
            l.words = Some(vec![-1; rows * w]);
        }
        for i in 0..table.len() {
            let base = (i * v) as i32;
            for e in table.edits[i].iter().filter(|e| (e.token as usize) < v) {
                l.idx.push(base + e.token as i32);
                l.add.push(e.add);
                l.rep.push(e.repetition.max(f32::MIN_POSITIVE));
                l.sub.push(e.subtract);
            }
            if edits_only {
                continue;
            }
            match (&table.allowed[i], l.words.as_mut()) {
                (Some(bits), Some(words)) => {
                    // A ban that would leave nothing allowed yields to the
                    // constraint (it knows what may come next).
                    if let Some(row) = row_words(Some(bits), &table.banned[i], v) {
                        words[i * w..(i + 1) * w].copy_from_slice(&row);
                    }
                }
                _ => {
                    let banned = table.banned[i].iter().filter(|&&t| (t as usize) < v);
                    l.banned.extend(banned.map(|&t| base + t as i32));
                }
            }
        }
        l
    }

    /// Pads the edit list to its [`bucket`] with no-op edits (add 0,
    /// factor 1, subtract 0) of entries it does not name, taken from the last
    /// of `rows` rows of `v` entries backwards (a row names a few hundred of
    /// its `v`, so the last row nearly always suffices), every index
    /// distinct; drops duplicate bans.
    fn pad(&mut self, rows: usize, v: usize) {
        let n = bucket(self.idx.len());
        for row in (0..rows).rev() {
            if self.idx.is_empty() || self.idx.len() >= n {
                break;
            }
            let span = (row * v) as i32..((row + 1) * v) as i32;
            let mut named: Vec<i32> = self
                .idx
                .iter()
                .copied()
                .filter(|i| span.contains(i))
                .collect();
            named.sort_unstable();
            let free = span.rev().filter(|i| named.binary_search(i).is_err());
            for i in free.take(n - self.idx.len()) {
                self.idx.push(i);
                self.add.push(0.0);
                self.rep.push(1.0);
                self.sub.push(0.0);
            }
        }
        self.banned.sort_unstable();
        self.banned.dedup();
    }
}

fn ints(values: Vec<i32>, device: &Device) -> Tensor<1, Int> {
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::table::{RowSampling, TokenEdit};
    use crate::sampling::test_logits::logits;

    fn row(edits: Vec<TokenEdit>, banned: Vec<u32>, allowed: Option<Vec<u32>>) -> RowSampling {
        RowSampling {
            edits,
            banned,
            allowed,
            ..RowSampling::greedy()
        }
    }

    fn edit(token: u32, add: f32, repetition: f32, subtract: f32) -> TokenEdit {
        TokenEdit {
            token,
            add,
            repetition,
            subtract,
        }
    }

    fn applied(l: Tensor<2>, t: &SamplingTable) -> Tensor<2> {
        let [b, v] = l.dims();
        let device = l.device();
        let prepared = Prepared::new(t, b, v, &TokenBits::new(v, &device), &device, false);
        apply(l, &prepared)
    }

    fn values(t: Tensor<2>) -> Vec<Vec<f32>> {
        let [_, v] = t.dims();
        let flat: Vec<f32> = t.into_data().iter::<f32>().collect();
        flat.chunks(v).map(<[f32]>::to_vec).collect()
    }

    #[test]
    fn bias_then_repetition_then_frequency_and_presence_as_vllm_orders_them() {
        let l = logits(&[&[2.0, -2.0, 1.0, 0.5], &[1.0, 1.0, 1.0, 1.0]]);
        let mut t = SamplingTable::with_capacity(2);
        // Token 0: +1 bias (3), / 1.5 (2), - 0.25 => 1.75.
        // Token 1: no bias (-2), * 1.5 (-3), - 1 => -4. Token 2: -4 bias => -3, * 2 => -6.
        t.push(row(
            vec![
                edit(0, 1.0, 1.5, 0.25),
                edit(1, 0.0, 1.5, 1.0),
                edit(2, -4.0, 2.0, 0.0),
            ],
            vec![],
            None,
        ));
        t.push(RowSampling::greedy());
        let got = values(applied(l, &t));
        assert_eq!(got[0], [1.75, -4.0, -6.0, 0.5]);
        assert_eq!(
            got[1],
            [1.0, 1.0, 1.0, 1.0],
            "a row without options is untouched"
        );
    }

    #[test]
    fn banned_and_disallowed_tokens_are_excluded_and_a_ban_yields_to_the_constraint() {
        let r: &[f32] = &[1.0, 2.0, 3.0, 4.0];
        let l = logits(&[r, r, r]);
        let mut t = SamplingTable::with_capacity(3);
        t.push(row(vec![], vec![3, 1], None));
        // Allowed {0, 2}; token 2 also banned: 0 alone remains.
        t.push(row(vec![], vec![2], Some(vec![0b0101])));
        // Allowed {3} only, and 3 banned: the ban yields.
        t.push(row(vec![], vec![3], Some(vec![0b1000])));
        let got = values(applied(l, &t));
        assert_eq!(got[0], [1.0, EXCLUDED, 3.0, EXCLUDED]);
        assert_eq!(got[1], [1.0, EXCLUDED, EXCLUDED, EXCLUDED]);
        assert_eq!(got[2], [EXCLUDED, EXCLUDED, EXCLUDED, 4.0]);
    }

    #[test]
    fn an_allowed_set_across_words_and_padding_rows() {
        // 70 tokens: three words, the last partly past the vocabulary.
        let v = 70;
        let r: Vec<f32> = (0..v).map(|t| t as f32).collect();
        let l = logits(&[&r, &r, &r]);
        let mut t = SamplingTable::with_capacity(2);
        let mut bits = vec![0u32; 3];
        for tok in [0usize, 33, 69] {
            bits[tok / 32] |= 1 << (tok % 32);
        }
        bits[2] |= 1 << 31; // a bit past the vocabulary is ignored
        t.push(row(vec![], vec![], Some(bits)));
        t.push(RowSampling::greedy());
        // Three rows of logits, two in the table: the third is padding.
        let got = values(applied(l, &t));
        for (tok, x) in got[0].iter().enumerate() {
            let want = if [0, 33, 69].contains(&tok) {
                tok as f32
            } else {
                EXCLUDED
            };
            assert_eq!(*x, want, "token {tok}");
        }
        assert_eq!(got[1], r, "a row without a constraint keeps every token");
        assert_eq!(got[2], r, "padding rows are untouched");
    }

    #[test]
    fn padding_edits_are_distinct_no_ops() {
        let named = || Lists {
            idx: vec![0, 39, 41, 79],
            add: vec![1.0; 4],
            rep: vec![2.0; 4],
            sub: vec![0.5; 4],
            ..Lists::default()
        };
        // 2 rows of 40: 80 entries, the bucket is 64.
        let mut l = named();
        l.pad(2, 40);
        assert_eq!(l.idx.len(), 64);
        let distinct: std::collections::HashSet<i32> = l.idx.iter().copied().collect();
        assert_eq!(distinct.len(), 64, "{:?}", l.idx);
        assert!(l.idx[4..].iter().all(|&i| (0..80).contains(&i)));
        assert!(l.add[4..].iter().all(|&a| a == 0.0));
        assert!(l.rep[4..].iter().all(|&r| r == 1.0));
        assert!(l.sub[4..].iter().all(|&x| x == 0.0));
        // Fewer entries than the bucket: every one named once.
        let mut l = named();
        l.idx.truncate(2); // 0 and 39: both in row 0
        l.add.truncate(2);
        l.rep.truncate(2);
        l.sub.truncate(2);
        l.pad(1, 40);
        assert_eq!(l.idx.len(), 40);
        let distinct: std::collections::HashSet<i32> = l.idx.iter().copied().collect();
        assert_eq!(distinct.len(), l.idx.len());
    }
}
