//! `--check-kernels`, the graph cases: the KV write and the prefill
//! attention captured in a CUDA graph over persistent segment buffers that
//! hold a padding-only step (as the engine captures its prefill shapes),
//! then replayed after real rows were written into those buffers, against
//! the same kernels launched eager over the real rows. A kernel that read
//! something frozen at capture (a value, a copy of a buffer) shows here.

use burn::prelude::*;
use ember_engine::model::LayerKv;
use ember_engine::ops::cuda::{kv_write, prefill_attention};
use ember_engine::ops::TableGeometry;
use ember_engine::ops::{InputBuffer, SegmentContext, SegmentHost, SegmentPadding, SegmentRow};

use crate::check_data::{floats, max_diff, normal, BLOCK};

/// Blocks in the check's cache (the last is the padding block).
const BLOCKS: usize = 64;

/// The segment buffers a captured prefill step reads.
struct SegmentBuffers {
    cu_seqlens: InputBuffer<1, Int>,
    starts: InputBuffer<1, Int>,
    tables: InputBuffer<2, Int>,
    tiles: InputBuffer<2, Int>,
    slots: InputBuffer<1, Int>,
}

impl SegmentBuffers {
    fn new(host: &SegmentHost, tokens: usize, dev: &Device) -> Self {
        let (r, w, n) = (host.rows, host.width, host.n_tiles());
        Self {
            cu_seqlens: InputBuffer::zeros([r + 1], dev),
            starts: InputBuffer::zeros([r], dev),
            tables: InputBuffer::zeros([r, w], dev),
            tiles: InputBuffer::zeros([n, 2], dev),
            slots: InputBuffer::zeros([tokens], dev),
        }
    }

    fn write(&mut self, host: &SegmentHost, slots: Vec<i32>) {
        self.cu_seqlens.write(host.cu_seqlens.clone());
        self.starts.write(host.starts.clone());
        self.tables.write(host.tables.clone());
        self.tiles.write(host.tiles.clone());
        self.slots.write(slots);
    }

    fn context(&self, block_size: usize) -> SegmentContext {
        SegmentContext {
            cu_seqlens: self.cu_seqlens.tensor(),
            starts: self.starts.tensor(),
            tables: self.tables.tensor(),
            tiles: self.tiles.tensor(),
            block_size,
            max_queries: 1,
            max_context: 1,
        }
    }
}

/// Each token's cache slot: row `r`'s positions through its table.
fn slots_of(rows: &[(usize, &[u32])], tokens: usize, pad_slot: i32) -> Vec<i32> {
    let mut slots = vec![pad_slot; tokens];
    let mut n = 0;
    for &(len, table) in rows {
        for p in 0..len {
            slots[n + p] = (table[p / BLOCK] as usize * BLOCK + p % BLOCK) as i32;
        }
        n += len;
    }
    slots
}

/// What one graph case saw.
pub struct GraphCase {
    /// Whether the tensors the graph captured read back what was written
    /// into the buffers after the capture (a buffer replaced rather than
    /// written in place would not).
    pub buffers_written_in_place: bool,
    /// Max |replayed - eager| of the attention output.
    pub output_diff: f32,
}

/// The case over `h` heads of 64 dimensions, a 256-token bucket of three
/// rows (one of a single token), with the KV write before the attention
/// when `with_write`: captured over padding only, replayed after the rows
/// were written into the buffers, twice.
pub fn graph_segment_check(with_write: bool, h: usize, dev: &Device) -> GraphCase {
    let (d, t) = (64usize, 256usize);
    let e = h * d;
    let cache = LayerKv {
        k: normal([h, BLOCKS * BLOCK, d], dev),
        v: normal([h, BLOCKS * BLOCK, d], dev),
    };
    let qkv = normal([t, 3 * e], dev);
    let geometry = TableGeometry {
        block_size: BLOCK,
        width: 16,
        padding_block: (BLOCKS - 1) as u32,
    };
    let pad_slot = ((BLOCKS - 1) * BLOCK) as i32;
    let padding = SegmentPadding {
        rows: 4,
        tiles: Some(8),
    };
    let tables: Vec<Vec<u32>> = (0..3u32)
        .map(|r| {
            (0..16)
                .map(|j| (r * 16 + j) % (BLOCKS as u32 - 1))
                .collect()
        })
        .collect();
    let lens = [100usize, 1, 120];
    let rows: Vec<SegmentRow<'_>> = lens
        .iter()
        .zip(&tables)
        .map(|(&queries, table)| SegmentRow {
            queries,
            start: 0,
            table,
        })
        .collect();
    let real = SegmentHost::new(&rows, padding, geometry);
    let empty = SegmentHost::new(&[], padding, geometry);
    let mut buffers = SegmentBuffers::new(&empty, t, dev);
    buffers.write(&empty, vec![pad_slot; t]);
    let step = |ctx: &SegmentContext, slots: Tensor<1, Int>| {
        if with_write {
            let (k, v) = kv_write(cache.k.clone(), cache.v.clone(), qkv.clone(), slots);
            prefill_attention(qkv.clone(), &k, &v, ctx)
        } else {
            prefill_attention(qkv.clone(), &cache.k, &cache.v, ctx)
        }
    };
    let ctx = buffers.context(BLOCK);
    let slots = buffers.slots.tensor();
    let mut graph = burn::tensor::capture(dev, || step(&ctx, slots.clone()));
    let named: Vec<(usize, &[u32])> = lens
        .iter()
        .copied()
        .zip(tables.iter().map(|t| &t[..]))
        .collect();
    let real_slots = slots_of(&named, t, pad_slot);
    buffers.write(&real, real_slots.clone());
    let ints = |t: Tensor<1, Int>| -> Vec<i64> { t.into_data().iter::<i64>().collect() };
    let flat = |t: &Tensor<2, Int>| ints(t.clone().flatten(0, 1));
    let want = |v: &[i32]| -> Vec<i64> { v.iter().map(|&x| i64::from(x)).collect() };
    let buffers_written_in_place = flat(&ctx.tiles) == want(&real.tiles)
        && flat(&ctx.tables) == want(&real.tables)
        && ints(ctx.cu_seqlens.clone()) == want(&real.cu_seqlens)
        && ints(ctx.starts.clone()) == want(&real.starts)
        && ints(slots.clone()) == want(&real_slots);
    // Safety: every buffer the graph touches (cache, qkv, segment buffers)
    // is alive until the sync after each replay.
    let _ = floats(unsafe { graph.replay() }.clone());
    // Again, after the same rows are written again.
    buffers.write(&real, real_slots.clone());
    let replayed = unsafe { graph.replay() }.clone();
    let _ = dev.sync();
    let got = floats(replayed);
    let eager_ctx = real.clone().upload(dev);
    let eager_slots = Tensor::<1, Int>::from_data(TensorData::new(real_slots, [t]), dev);
    let want = floats(step(&eager_ctx, eager_slots));
    GraphCase {
        buffers_written_in_place,
        output_diff: max_diff(got, want),
    }
}
