//! One key chunk of the prefill attention kernel (`super::prefill_attention`,
//! its module docs): the warp's scores `S = Q K^T` on tensor cores, the
//! online-softmax step over them, and `O = O * alpha + P V`.

use cubecl::prelude::*;

use super::mma::{fragment, zeroed_accumulator};
use super::prefill_stage::LD;

/// Row stride of the f32 score tiles (64 columns + 4 padding).
pub(super) const SLD: usize = 68;

/// One chunk's online-softmax step for this lane's 32 keys (`key0..`, its
/// scores at `s_s[at..]`, visible up to `query`): the row's new max and the
/// rescale of what came before into `ml` (`[max, sum]`), this chunk's
/// unnormalized `P` into `p_s` from element `p_at` (vectors of `vs`, one
/// shared store each). Returns the rescale factor of `O`. The max and the
/// sum run as four interleaved chains (a warp per scheduler waits on each
/// dependent add: ncu measured ~8 cycles per issued instruction).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_chunk<F: Float, N: Size>(
    s_s: &Shared<[f32]>,
    p_s: &mut Shared<[Vector<F, N>]>,
    ml: &mut Array<f32>,
    at: usize,
    p_at: usize,
    key0: usize,
    query: usize,
    scale: f32,
    #[comptime] vs: usize,
) -> f32 {
    let m = ml[0];
    let mx = visible_row_max(s_s, at, key0, query, scale);
    let mut m_new = m;
    if mx > m_new {
        m_new = mx;
    }
    let alpha = (m - m_new).exp();
    let mut sums = Array::<f32>::new(4usize);
    #[unroll]
    for k in 0..4 {
        sums[k] = f32::new(0.0);
    }
    #[unroll]
    for g in 0..comptime!(32 / vs) {
        let mut packed = Vector::<F, N>::empty();
        #[unroll]
        for k in 0..vs {
            let j = comptime!(g * vs + k);
            let mut w = f32::new(0.0);
            if key0 + j <= query {
                w = (s_s[at + j] * scale - m_new).exp();
            }
            sums[comptime!(j % 4)] += w;
            packed.insert(k, F::cast_from(w));
        }
        p_s[(p_at + comptime!(g * vs)) / vs] = packed;
    }
    let mut sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    sum += plane_shuffle_xor(sum, 1u32);
    ml[1] = ml[1] * alpha + sum;
    ml[0] = m_new;
    alpha
}

/// The max over this lane's 32 scores at `s_s[at..]` (keys `key0..`) that
/// `query` may see, scaled, combined with its partner lane's (the row's
/// other 32 keys); four interleaved chains.
#[cube]
pub(super) fn visible_row_max(
    s_s: &Shared<[f32]>,
    at: usize,
    key0: usize,
    query: usize,
    scale: f32,
) -> f32 {
    let mut maxes = Array::<f32>::new(4usize);
    #[unroll]
    for k in 0..4 {
        maxes[k] = f32::new(-1.0e30);
    }
    #[unroll]
    for j in 0..32 {
        let v = s_s[at + j] * scale;
        if key0 + j <= query && v > maxes[comptime!(j % 4)] {
            maxes[comptime!(j % 4)] = v;
        }
    }
    let (a, b) = (maxes[0], maxes[1]);
    let (c, d) = (maxes[2], maxes[3]);
    let ab = select(a > b, a, b);
    let cd = select(c > d, c, d);
    let mut mx = select(ab > cd, ab, cd);
    let other = plane_shuffle_xor(mx, 1u32);
    if other > mx {
        mx = other;
    }
    mx
}

/// `O = O * alpha + P V` for this chunk: the warp's `P` tile (at `p_tile`
/// of `p_s`) times the staged `V`, through the warp's score tile (at
/// `s_tile`), into this lane's 32 columns of `O` (its row and columns at
/// `at` of the score tile).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn rescale_add_pv<F: Float, N: Size>(
    v_s: &Shared<[Vector<F, N>]>,
    p_s: &Shared<[Vector<F, N>]>,
    s_s: &mut Shared<[f32]>,
    o: &mut Array<f32>,
    s_tile: usize,
    p_tile: usize,
    at: usize,
    alpha: f32,
) {
    let pv0 = zeroed_accumulator();
    let pv1 = zeroed_accumulator();
    let pv2 = zeroed_accumulator();
    let pv3 = zeroed_accumulator();
    #[unroll]
    for kc in 0..4 {
        let pa = load_a(p_s, p_tile + kc * 16);
        accumulate_pv(v_s, kc * 16 * LD, &pa, &pv0, &pv1, &pv2, &pv3);
    }
    store_s(s_s, s_tile, &pv0);
    store_s(s_s, s_tile + 16, &pv1);
    store_s(s_s, s_tile + 32, &pv2);
    store_s(s_s, s_tile + 48, &pv3);
    sync_plane();
    #[unroll]
    for j in 0..32 {
        o[j] = o[j] * alpha + s_s[at + j];
    }
    sync_plane();
}

/// A row-major 16x16 A fragment of a shared tile (staged in vectors) at
/// element `at` (row stride `LD`).
#[cube]
pub(super) fn load_a<F: Float, N: Size>(
    tile: &Shared<[Vector<F, N>]>,
    at: usize,
) -> cmma::Matrix<F> {
    let tile = tile.with_vector_size::<Const<1>>();
    let mut a = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
    cmma::load(
        &mut a,
        tile.slice(at, at + comptime!(15 * LD + 16)),
        comptime!(LD as u32),
    );
    a
}

/// `S = Q K^T` for the warp's 16 queries and the 64 staged keys, into the
/// warp's score tile at `s_tile` (row stride `SLD`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn scores<F: Float, N: Size>(
    k_s: &Shared<[Vector<F, N>]>,
    s_s: &mut Shared<[f32]>,
    s_tile: usize,
    qa0: &cmma::Matrix<F>,
    qa1: &cmma::Matrix<F>,
    qa2: &cmma::Matrix<F>,
    qa3: &cmma::Matrix<F>,
) {
    let span = comptime!(15 * LD + 16);
    let ld = comptime!(LD as u32);
    // The tile is staged in vectors; the fragments load it element-wise.
    let k_s = k_s.with_vector_size::<Const<1>>();
    let mut kb = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
    #[unroll]
    for t in 0..4 {
        let s = zeroed_accumulator();
        let at = t * 16 * LD;
        cmma::load(&mut kb, k_s.slice(at, at + span), ld);
        cmma::execute(qa0, &kb, &s, &s);
        cmma::load(&mut kb, k_s.slice(at + 16, at + 16 + span), ld);
        cmma::execute(qa1, &kb, &s, &s);
        cmma::load(&mut kb, k_s.slice(at + 32, at + 32 + span), ld);
        cmma::execute(qa2, &kb, &s, &s);
        cmma::load(&mut kb, k_s.slice(at + 48, at + 48 + span), ld);
        cmma::execute(qa3, &kb, &s, &s);
        store_s(s_s, s_tile + t * 16, &s);
    }
}

/// `O[:, 16c..16c+16] += P V[:, 16c..16c+16]` for the four blocks of dims,
/// with `p` one 16-key block of P and V's matching 16 rows at `v_at`.
#[cube]
pub(super) fn accumulate_pv<F: Float, N: Size>(
    v_s: &Shared<[Vector<F, N>]>,
    v_at: usize,
    p: &cmma::Matrix<F>,
    o0: &cmma::Matrix<f32>,
    o1: &cmma::Matrix<f32>,
    o2: &cmma::Matrix<f32>,
    o3: &cmma::Matrix<f32>,
) {
    let span = comptime!(15 * LD + 16);
    let ld = comptime!(LD as u32);
    let v_s = v_s.with_vector_size::<Const<1>>();
    let mut vb = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::RowMajor);
    cmma::load(&mut vb, v_s.slice(v_at, v_at + span), ld);
    cmma::execute(p, &vb, o0, o0);
    cmma::load(&mut vb, v_s.slice(v_at + 16, v_at + 16 + span), ld);
    cmma::execute(p, &vb, o1, o1);
    cmma::load(&mut vb, v_s.slice(v_at + 32, v_at + 32 + span), ld);
    cmma::execute(p, &vb, o2, o2);
    cmma::load(&mut vb, v_s.slice(v_at + 48, v_at + 48 + span), ld);
    cmma::execute(p, &vb, o3, o3);
}

/// Stores a 16x16 f32 fragment into a score tile at `at` (row stride `SLD`).
#[cube]
pub(super) fn store_s(s_s: &mut Shared<[f32]>, at: usize, frag: &cmma::Matrix<f32>) {
    cmma::store(
        s_s.slice_mut(at, at + comptime!(15 * SLD + 16)),
        frag,
        comptime!(SLD as u32),
        cmma::MatrixLayout::RowMajor,
    );
}
