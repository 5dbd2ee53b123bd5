//! The contract between the host and the device sampler: one row's sampling
//! parameters ([`RowParams`]), their column layout in the two `[B, 8]`
//! parameter tensors, and the constants of the noise, written down once here
//! for the CPU sampler (`crate::sampling::row_sampler`, the executable spec),
//! the CUDA kernel (`ops::cuda::kernels::sample_rows`) and the host code that
//! fills the tensors.
//!
//! Layout (row `b`; a padding row is all zeros, which is greedy and reads no
//! bitmask):
//!
//! | tensor | col 0 | col 1 | col 2 | col 3 | col 4 | col 5 | 6, 7 |
//! |---|---|---|---|---|---|---|---|
//! | floats `[B, 8]` f32 | temperature | top_p | min_p | repetition | frequency | presence | spare |
//! | ints `[B, 8]` i32 | top_k | seed bits 0..32 | seed bits 32..64 | flags | penalty slot + 1 | spare | spare |
//!
//! Flags: [`FLAG_ALLOWED`] = the row's allowed-token bitmask (row `b` of a
//! `[B, ceil(V / 32)]` tensor, bit `t % 32` of word `t / 32`) applies. Seed
//! words and bitmask words are u32 bit patterns stored in i32.
//!
//! **Penalties on the device** ([`RowPenalty`]): a row whose penalty slot
//! column is `s + 1` (0: none) reads its tokens' counts from row `s` of the
//! `[S, V]` counts table (`crate::sampling::penalty_state`): bits 0..30 the
//! output's count of the token ([`COUNT_MASK`]), bit 30 whether the prompt
//! has it ([`IN_PROMPT`]). Before anything else, a token with a nonzero
//! entry gets vLLM's penalties: the repetition factor (a positive logit
//! divided by it, a negative one multiplied), then `- (frequency * count +
//! presence * (count > 0))`, the f32 operations of
//! `crate::sampling::transforms` on the same edit.
//!
//! The noise of token `i` at position `pos` is Philox4x32-10 (Random123) with
//! counter `[pos, i / 4, STREAM_SAMPLE, 0]` and key `[seed_lo, seed_hi]`,
//! output word `i % 4`; `crate::sampling::philox` turns that word into a
//! Gumbel variate, bounded by [`NOISE_MAX`] and by the leading-zero bound
//! (`(lz + 1) * ln 2 + NOISE_SLACK`) that lets both samplers skip the
//! logarithms of tokens that cannot win.

/// Philox4x32 round multipliers (Random123's `PHILOX_M4x32_0/1`).
pub const PHILOX_M0: u32 = 0xD251_1F53;
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Philox4x32 key increments (Weyl sequence: golden ratio, sqrt(3) - 1).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
pub const PHILOX_W1: u32 = 0xBB67_AE85;
/// Rounds of Philox4x32-10.
pub const PHILOX_ROUNDS: usize = 10;

/// Counter word 2 of the sampling noise (other values are free for other
/// uses of the same seed, e.g. speculative drafts).
pub const STREAM_SAMPLE: u32 = 0;

/// `2^-32`, the scale of a 32-bit word to a uniform in (0, 1).
pub const TWO_POW_M32: f32 = 2.328_306_4e-10;
/// A bound no computed noise reaches (the largest is `33 ln 2 ~ 22.87`).
pub const NOISE_MAX: f32 = 23.0;
/// Slack on the leading-zero bound of a word's noise, far above the few
/// ulps by which the computed logarithms can err.
pub const NOISE_SLACK: f32 = 0.01;
/// `ln 2` (f32).
pub const LN_2: f32 = std::f32::consts::LN_2;

/// Columns of the f32 parameter tensor.
pub const FLOAT_COLS: usize = 8;
pub const COL_TEMPERATURE: usize = 0;
pub const COL_TOP_P: usize = 1;
pub const COL_MIN_P: usize = 2;
pub const COL_REPETITION: usize = 3;
pub const COL_FREQUENCY: usize = 4;
pub const COL_PRESENCE: usize = 5;
/// Columns of the i32 parameter tensor.
pub const INT_COLS: usize = 8;
pub const COL_TOP_K: usize = 0;
pub const COL_SEED_LO: usize = 1;
pub const COL_SEED_HI: usize = 2;
pub const COL_FLAGS: usize = 3;
pub const COL_PENALTY_SLOT: usize = 4;
/// Flag bit: the row's allowed-token bitmask applies.
pub const FLAG_ALLOWED: i32 = 1;
/// Flag bit: the row's slot holds its logit bias (the slot table's second
/// half).
pub const FLAG_BIAS: i32 = 2;
/// Entries of a slot's row of the slot table over `vocab` tokens: its
/// counts, then its bias (module docs). The one place the width is written.
pub const fn slot_row_len(vocab: usize) -> usize {
    2 * vocab
}

/// The output-count bits of a counts-table entry.
pub const COUNT_MASK: u32 = (1 << 30) - 1;
/// The prompt-has-it bit of a counts-table entry.
pub const IN_PROMPT: u32 = 1 << 30;

/// One row's penalties applied by the sampling kernel from the counts
/// table's row `slot` (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowPenalty {
    pub slot: u32,
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
    /// The slot holds the row's logit bias ([`FLAG_BIAS`]).
    pub bias: bool,
}

impl RowPenalty {
    /// Writes the penalty into row `b` of `columns` (from [`columns`]).
    pub fn write_into(&self, columns: &mut (Vec<f32>, Vec<i32>), b: usize) {
        let (floats, ints) = columns;
        floats[b * FLOAT_COLS + COL_REPETITION] = self.repetition;
        floats[b * FLOAT_COLS + COL_FREQUENCY] = self.frequency;
        floats[b * FLOAT_COLS + COL_PRESENCE] = self.presence;
        ints[b * INT_COLS + COL_PENALTY_SLOT] = self.slot as i32 + 1;
        if self.bias {
            ints[b * INT_COLS + COL_FLAGS] |= FLAG_BIAS;
        }
    }
}

/// Columns of the optional `[B, 4]` i32 trace the kernel writes for
/// checking it pass by pass against the CPU sampler's `RowTrace`: the
/// argmax (pass 1), then the top-k, top-p and final threshold keys (u32
/// bit patterns).
pub const TRACE_COLS: usize = 4;

/// One row's sampling parameters, as both samplers read them.
///
/// Greedy (the argmax of the raw logits) when `temperature` is not `> 0` or
/// `top_k == 1`. Otherwise, in transformers' warper order: `top_k` (0 or
/// `>=` the tokens present = off), `top_p` (`>= 1` = off; `<= 0` keeps the
/// top tokens only), `min_p` (`<= 0` = off), then one draw keyed by `seed`
/// and the token's position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowParams {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub seed: u64,
}

impl RowParams {
    /// Argmax decoding (also what a padding row of zeros reads as).
    pub const GREEDY: RowParams = RowParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 0,
    };

    /// Whether the row takes the argmax of its raw logits.
    pub fn is_greedy(&self) -> bool {
        let sampled = self.temperature > 0.0;
        !sampled || self.top_k == 1
    }

    /// The row's f32 columns.
    pub fn float_columns(&self) -> [f32; FLOAT_COLS] {
        let mut c = [0.0; FLOAT_COLS];
        c[COL_TEMPERATURE] = self.temperature;
        c[COL_TOP_P] = self.top_p;
        c[COL_MIN_P] = self.min_p;
        c
    }

    /// The row's i32 columns; `has_allowed`: its bitmask applies.
    pub fn int_columns(&self, has_allowed: bool) -> [i32; INT_COLS] {
        let mut c = [0; INT_COLS];
        c[COL_TOP_K] = self.top_k.min(i32::MAX as u32) as i32;
        c[COL_SEED_LO] = self.seed as u32 as i32;
        c[COL_SEED_HI] = (self.seed >> 32) as u32 as i32;
        c[COL_FLAGS] = if has_allowed { FLAG_ALLOWED } else { 0 };
        c
    }

    /// A row back from its columns, and whether its bitmask applies (the
    /// kernel reads the same columns the same way).
    pub fn from_columns(floats: &[f32], ints: &[i32]) -> (RowParams, bool) {
        let params = RowParams {
            temperature: floats[COL_TEMPERATURE],
            top_k: ints[COL_TOP_K].max(0) as u32,
            top_p: floats[COL_TOP_P],
            min_p: floats[COL_MIN_P],
            seed: (ints[COL_SEED_LO] as u32 as u64) | ((ints[COL_SEED_HI] as u32 as u64) << 32),
        };
        (params, ints[COL_FLAGS] & FLAG_ALLOWED != 0)
    }
}

/// The host data of the two parameter tensors for `rows` rows: `params[i]`
/// and `has_allowed[i]` (missing = false) for the first `params.len()`,
/// zeros (greedy padding) after. Row-major `[rows, FLOAT_COLS]` and
/// `[rows, INT_COLS]`.
pub fn columns(params: &[RowParams], has_allowed: &[bool], rows: usize) -> (Vec<f32>, Vec<i32>) {
    debug_assert!(params.len() <= rows);
    let mut floats = vec![0.0f32; rows * FLOAT_COLS];
    let mut ints = vec![0i32; rows * INT_COLS];
    for (b, p) in params.iter().enumerate() {
        let allowed = has_allowed.get(b).copied().unwrap_or(false);
        floats[b * FLOAT_COLS..(b + 1) * FLOAT_COLS].copy_from_slice(&p.float_columns());
        ints[b * INT_COLS..(b + 1) * INT_COLS].copy_from_slice(&p.int_columns(allowed));
    }
    (floats, ints)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_round_trip_and_padding_is_greedy() {
        let p = RowParams {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.9,
            min_p: 0.05,
            seed: 0xDEAD_BEEF_0123_4567,
        };
        let (f, i) = columns(&[p], &[true], 3);
        assert_eq!((f.len(), i.len()), (24, 24));
        assert_eq!(RowParams::from_columns(&f[..8], &i[..8]), (p, true));
        let (pad, allowed) = RowParams::from_columns(&f[16..], &i[16..]);
        assert_eq!(i[16 + COL_PENALTY_SLOT], 0, "padding reads no counts");
        assert!(pad.is_greedy() && !allowed);
        assert_eq!(pad, RowParams::GREEDY.with_top_p(0.0));
        assert_eq!(TWO_POW_M32, (-32f32).exp2());
    }

    impl RowParams {
        fn with_top_p(self, top_p: f32) -> Self {
            RowParams { top_p, ..self }
        }
    }
}
