//! The penalty counts' update after a step's choice: each row with a
//! penalty slot adds one to its chosen token's count in the `[S, 2V]` slot
//! table, in place (`crate::ops::row_params` has the table's layout and the
//! columns), or takes it back (`undo`: a choice made again after the
//! graph's). One thread a row; a slot belongs to one row, so no two threads
//! write one entry.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::extension::cuda_kernel;
use crate::ops::row_params::{COL_PENALTY_SLOT, INT_COLS};

/// `counts[slot - 1, ids[b]] += 1` (`-= 1` with `undo`) for every row `b`
/// whose penalty-slot column `slot` is nonzero. `ids` `[B, 1]`, `ints` `[B,
/// INT_COLS]`, `counts` `[S, 2V]` (counts in its first `V` columns).
#[cube(launch, create_dummy_kernel)]
// The expansion's indexed `a = a - 1` (kept as written: the clippy run of
// the CUDA feature, not CI's, flagged it).
#[allow(clippy::assign_op_pattern)]
pub fn count_chosen_kernel<I: Int>(
    ids: &Tensor<I>,
    ints: &Tensor<I>,
    counts: &mut Tensor<I>,
    #[comptime] undo: bool,
    #[define(I)] _dtype: ElemType,
) {
    let row = ABSOLUTE_POS;
    if row >= ids.shape(0) {
        terminate!();
    }
    let slot = u32::cast_from(ints[row * ints.stride(0) + COL_PENALTY_SLOT]) as usize;
    let token = u32::cast_from(ids[row * ids.stride(0)]) as usize;
    if slot > 0 && slot <= counts.shape(0) && token < counts.shape(1) {
        let at = (slot - 1) * counts.stride(0) + token;
        if comptime![undo] {
            counts[at] = counts[at] - I::cast_from(1u32);
        } else {
            counts[at] = counts[at] + I::cast_from(1u32);
        }
    }
}

cuda_kernel! {
    /// Adds each penalized row's chosen token (`ids` `[B, 1]`, the rows'
    /// `row_params` int columns `ints` `[B, INT_COLS]`) to its row of the
    /// slot table `counts` `[S, 2V]` (takes it back with `undo`), in place;
    /// returns the same table.
    #[fusion(dtype = counts, shape = counts)]
    pub fn CountChosen::count_chosen(
        #[in_place] counts: Tensor<2, Int>,
        ids: Tensor<2, Int>,
        ints: Tensor<2, Int>,
        undo: bool,
    ) -> Tensor<2, Int>
}

/// Launches [`count_chosen_kernel`] over `ids`' rows (see the declaration).
pub fn launch(counts: CubeTensor, ids: CubeTensor, ints: CubeTensor, undo: bool) -> CubeTensor {
    let [b, _] = ids.shape().dims::<2>();
    assert!(
        ints.shape().dims::<2>() == [b, INT_COLS]
            && ids.dtype == ints.dtype
            && counts.dtype == ints.dtype
            && counts.meta.strides()[1] == 1,
        "count_chosen: ids [B, 1], ints [B, {INT_COLS}] and counts [S, 2V] in one int dtype"
    );
    let threads = 128u32;
    count_chosen_kernel::launch(
        &counts.client,
        CubeCount::Static((b as u32).div_ceil(threads), 1, 1),
        CubeDim::new_1d(threads),
        ids.into_tensor_arg(),
        ints.into_tensor_arg(),
        counts.clone().into_tensor_arg(),
        undo,
        dtype_to_storage_type(counts.dtype),
    );
    counts
}
