//! The last step of a decode attention context split across cubes
//! (flash-decoding, [`super::attention`]): each cube publishes its chunk's
//! unnormalized output, max and sum, counts itself in on the pair's arrival
//! counter, and the cube that arrives last combines the chunks and resets
//! the counter (no second kernel).

use cubecl::prelude::*;

use super::reduce::sum_warps;

/// Split mode: publish this cube's chunk (`sum(p V)` from `partial`, its max
/// `m` and sum `total`) to `partials`; the last of the pair's `splits` cubes
/// to arrive combines them into `out[row_at..row_at + D]` and resets the
/// pair's counter. Every unit of the cube calls it.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn publish_and_combine<F: Float>(
    partial: &Shared<[f32]>,
    partials: &mut Tensor<f32>,
    arrivals: &mut Tensor<Atomic<u32>>,
    out: &mut Tensor<F>,
    pair: usize,
    row_at: usize,
    m: f32,
    total: f32,
    #[comptime] warps: usize,
    #[comptime] head_dim: usize,
    #[comptime] splits: usize,
) {
    let tid = (UNIT_POS_Y * 32 + UNIT_POS_X) as usize;
    let stride = comptime!(head_dim + 2);
    let pair_at = pair * comptime!(splits * (head_dim + 2));
    let at = pair_at + CUBE_POS_Z as usize * stride;
    let mut d = tid;
    while d < head_dim {
        partials[at + d] = sum_warps(partial, d, warps, head_dim);
        d += comptime!(warps * 32);
    }
    if tid == 0 {
        partials[at + head_dim] = m;
        partials[at + head_dim + 1] = total;
    }
    let mut arrived = Shared::<[u32]>::new_slice(1usize);
    // Release this cube's partial at device scope, then count it in.
    sync_storage();
    if tid == 0 {
        arrived[0] = arrivals[pair].fetch_add(1u32);
    }
    sync_cube();
    if arrived[0] == comptime!(splits as u32 - 1) {
        // Acquire every other split's partial.
        sync_storage();
        let mut max = f32::new(-1.0e30);
        #[unroll]
        for s in 0..splits {
            let ms = partials[pair_at + s * stride + head_dim];
            if ms > max {
                max = ms;
            }
        }
        let mut sum = f32::new(0.0);
        #[unroll]
        for s in 0..splits {
            let base = pair_at + s * stride + head_dim;
            sum += partials[base + 1] * (partials[base] - max).exp();
        }
        let mut d = tid;
        while d < head_dim {
            let mut v = f32::new(0.0);
            #[unroll]
            for s in 0..splits {
                let base = pair_at + s * stride;
                v += partials[base + d] * (partials[base + head_dim] - max).exp();
            }
            out[row_at + d] = F::cast_from(v / sum);
            d += comptime!(warps * 32);
        }
        if tid == 0 {
            arrivals[pair].store(0u32);
        }
    }
}
