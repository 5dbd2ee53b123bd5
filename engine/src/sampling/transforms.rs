//! The logit transforms of the rows that ask for them, applied on the device
//! before the choice, in vLLM's order: `logit_bias`, then the repetition
//! penalty, then the frequency and presence penalties (one gather, one
//! element-wise pass and one scatter over the edited `(row, token)` entries),
//! then banned tokens (`min_tokens`) and a structured-output row's allowed
//! set (a large negative value on every other token, so nothing is NaN).
//!
//! Only steps where some row asks run any of it ([`super::SamplingTable::
//! any_changes_logits`]), and only the entries the rows name are touched: a
//! row without options keeps its logits. The host builds each step's lists
//! (a few hundred entries a row: the tokens a penalized sequence has), and
//! they go up in one upload per list.

use burn::prelude::*;
use burn::tensor::{DType, IndexingUpdateOp};

use super::table::SamplingTable;

/// What a token that may not be chosen gets: far below any logit, finite.
pub const EXCLUDED: f32 = -1.0e30;

/// `logits` (`[B, V]`, f32, `B >=` the table's rows) with every row's
/// edits, bans and allowed set applied.
pub fn apply(logits: Tensor<2>, table: &SamplingTable) -> Tensor<2> {
    let [b, v] = logits.dims();
    let device = logits.device();
    let mut flat = logits.reshape([b * v]);
    let lists = Lists::of(table, v);
    if !lists.idx.is_empty() {
        let n = lists.idx.len();
        let idx = ints(lists.idx, &device);
        let f =
            |x: Vec<f32>| Tensor::<1>::from_data(TensorData::new(x, [n]), (&device, DType::F32));
        let (add, rep, sub) = (f(lists.add), f(lists.rep), f(lists.sub));
        let vals = flat.clone().select(0, idx.clone()) + add;
        let positive = vals.clone().greater_elem(0.0);
        let vals = (vals.clone() * rep.clone()).mask_where(positive, vals / rep) - sub;
        flat = flat.select_assign(0, idx, vals, IndexingUpdateOp::Assign);
    }
    if !lists.excluded.is_empty() {
        let n = lists.excluded.len();
        let idx = ints(lists.excluded, &device);
        let vals = Tensor::<1>::full([n], EXCLUDED, (&device, DType::F32));
        flat = flat.select_assign(0, idx, vals, IndexingUpdateOp::Assign);
    }
    flat.reshape([b, v])
}

/// One step's host-side lists, flat indices `row * V + token`.
#[derive(Debug, Default, PartialEq)]
struct Lists {
    /// Edited entries and their `add`, repetition factor and `subtract`.
    idx: Vec<i32>,
    add: Vec<f32>,
    rep: Vec<f32>,
    sub: Vec<f32>,
    /// Entries that may not be chosen (banned, or outside an allowed set).
    excluded: Vec<i32>,
}

impl Lists {
    fn of(table: &SamplingTable, v: usize) -> Self {
        let mut l = Lists::default();
        for i in 0..table.len() {
            let base = (i * v) as i32;
            for e in table.edits[i].iter().filter(|e| (e.token as usize) < v) {
                l.idx.push(base + e.token as i32);
                l.add.push(e.add);
                l.rep.push(e.repetition.max(f32::MIN_POSITIVE));
                l.sub.push(e.subtract);
            }
            let banned = &table.banned[i];
            match &table.allowed[i] {
                Some(bits) => {
                    let allowed =
                        |t: usize| bits.get(t / 32).is_some_and(|w| w >> (t % 32) & 1 == 1);
                    // A ban that would leave nothing allowed yields to the
                    // constraint (it knows what may come next).
                    let keep_ban = (0..v).any(|t| allowed(t) && !banned.contains(&(t as u32)));
                    l.excluded.extend(
                        (0..v)
                            .filter(|&t| !allowed(t) || (keep_ban && banned.contains(&(t as u32))))
                            .map(|t| base + t as i32),
                    );
                }
                None => l.excluded.extend(
                    banned
                        .iter()
                        .filter(|&&t| (t as usize) < v)
                        .map(|&t| base + t as i32),
                ),
            }
        }
        l
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
        let got = values(apply(l, &t));
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
        let got = values(apply(l, &t));
        assert_eq!(got[0], [1.0, EXCLUDED, 3.0, EXCLUDED]);
        assert_eq!(got[1], [1.0, EXCLUDED, EXCLUDED, EXCLUDED]);
        assert_eq!(got[2], [EXCLUDED, EXCLUDED, EXCLUDED, 4.0]);
    }
}
