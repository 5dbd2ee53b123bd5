//! A row's sampling parameters as [`super::sample_rows_kernel`] reads them
//! from its `row_params` columns (uniform over the row's cube): once, at
//! the start, so the passes take plain values.

use cubecl::prelude::*;

use super::scan::Penalty;
use crate::ops::row_params::{
    COL_FLAGS, COL_FREQUENCY, COL_MIN_P, COL_PENALTY_SLOT, COL_PRESENCE, COL_REPETITION,
    COL_SEED_HI, COL_SEED_LO, COL_TEMPERATURE, COL_TOP_K, COL_TOP_P, FLAG_ALLOWED, FLAG_BIAS,
};

/// The row's truncation and noise parameters.
#[derive(CubeType)]
pub struct RowParams {
    pub temperature: f32,
    pub top_p: f32,
    pub min_p: f32,
    pub top_k: u32,
    pub seed_lo: u32,
    pub seed_hi: u32,
    /// The row reads its allowed-token bitmask (only with `has_mask`).
    pub masked: bool,
}

/// Row `row`'s parameters from `floats` `[B, FLOAT_COLS]` and `ints` `[B,
/// INT_COLS]`.
#[cube]
pub fn read_params<I: Int>(
    floats: &Tensor<f32>,
    ints: &Tensor<I>,
    row: usize,
    #[comptime] has_mask: bool,
) -> RowParams {
    let f_at = row * floats.stride(0);
    let i_at = row * ints.stride(0);
    let mut masked = false;
    if comptime![has_mask] {
        masked = (u32::cast_from(ints[i_at + COL_FLAGS]) & comptime!(FLAG_ALLOWED as u32)) != 0;
    }
    RowParams {
        temperature: floats[f_at + COL_TEMPERATURE],
        top_p: floats[f_at + COL_TOP_P],
        min_p: floats[f_at + COL_MIN_P],
        top_k: u32::cast_from(ints[i_at + COL_TOP_K]),
        seed_lo: u32::cast_from(ints[i_at + COL_SEED_LO]),
        seed_hi: u32::cast_from(ints[i_at + COL_SEED_HI]),
        masked,
    }
}

/// Row `row`'s penalties: on where it has a penalty slot (`ints`' slot
/// column, 1-based; only with `has_counts`), its counts starting at that
/// slot's row of the slot table `counts` `[S, 2V]`, its bias `V` further
/// where its flags say it has one.
#[cube]
pub fn read_penalty<I: Int>(
    floats: &Tensor<f32>,
    ints: &Tensor<I>,
    counts: &Tensor<I>,
    row: usize,
    #[comptime] has_counts: bool,
) -> Penalty {
    let f_at = row * floats.stride(0);
    let i_at = row * ints.stride(0);
    let mut on = false;
    let mut bias = false;
    let mut base = 0usize;
    let mut repetition = f32::new(1.0);
    let mut frequency = f32::new(0.0);
    let mut presence = f32::new(0.0);
    if comptime![has_counts] {
        let slot = u32::cast_from(ints[i_at + COL_PENALTY_SLOT]);
        if slot > 0u32 {
            on = true;
            let flags = u32::cast_from(ints[i_at + COL_FLAGS]);
            bias = (flags & comptime!(FLAG_BIAS as u32)) != 0;
            base = (slot - 1) as usize * counts.stride(0);
            repetition = floats[f_at + COL_REPETITION];
            frequency = floats[f_at + COL_FREQUENCY];
            presence = floats[f_at + COL_PRESENCE];
        }
    }
    Penalty {
        on,
        bias,
        base,
        repetition,
        frequency,
        presence,
    }
}
