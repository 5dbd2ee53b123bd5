//! Rows of a persistent int table written from a fresh upload, in place:
//! `table[rows[i], :] = values[i, :]`. How the host replaces a few rows of a
//! buffer a captured decode graph reads (a sequence's penalty counts, a
//! row's allowed-token mask) without copying the whole table: the rows go
//! up as a small new tensor and this kernel moves them into the table's own
//! memory. One thread an element.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::TensorMetadata;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use crate::ops::cuda::extension::cuda_kernel;

/// `table[rows[i] * W + j] = values[i * W + j]` for `i < n`, `j < W`
/// (`table` `[R, W]`, `rows` `[n]`, `values` `[n, W]`; a row index outside
/// the table is skipped).
#[cube(launch, create_dummy_kernel)]
pub fn write_rows_kernel<I: Int>(
    table: &mut Tensor<I>,
    rows: &Tensor<I>,
    values: &Tensor<I>,
    #[define(I)] _dtype: ElemType,
) {
    let width = table.shape(1);
    let at = ABSOLUTE_POS;
    if at >= values.shape(0) * width {
        terminate!();
    }
    let i = at / width;
    let j = at % width;
    let row = u32::cast_from(rows[i * rows.stride(0)]) as usize;
    if row < table.shape(0) {
        let dst = row * table.stride(0) + j;
        table[dst] = values[i * values.stride(0) + j];
    }
}

cuda_kernel! {
    /// Writes `values` `[n, W]` into rows `rows` `[n]` of `table` `[R, W]`,
    /// in place; returns the same table.
    #[fusion(dtype = table, shape = table)]
    pub fn WriteRows::write_rows(
        #[in_place] table: Tensor<2, Int>,
        rows: Tensor<1, Int>,
        values: Tensor<2, Int>,
    ) -> Tensor<2, Int>
}

/// Launches [`write_rows_kernel`] (see the declaration).
pub fn launch(table: CubeTensor, rows: CubeTensor, values: CubeTensor) -> CubeTensor {
    let [_, w] = table.shape().dims::<2>();
    let [n, vw] = values.shape().dims::<2>();
    assert!(
        vw == w
            && rows.shape().dims::<1>()[0] == n
            && table.meta.strides()[1] == 1
            && table.dtype == values.dtype
            && rows.dtype == values.dtype,
        "write_rows: values [n, W] and rows [n] for a row-major table [R, W], one int dtype"
    );
    let threads = 256u32;
    write_rows_kernel::launch(
        &table.client,
        CubeCount::Static(((n * w) as u32).div_ceil(threads), 1, 1),
        CubeDim::new_1d(threads),
        table.clone().into_tensor_arg(),
        rows.into_tensor_arg(),
        values.into_tensor_arg(),
        dtype_to_storage_type(table.dtype),
    );
    table
}
