//! Where a captured prefill step parts from the eager one (issue 45: on
//! CUDA a replay's logits differ from the eager step's): the bench's probe
//! reads back what the shape's buffers hold after a replay, the K/V each
//! layer wrote at the step's slots (layer 0's come before any attention, so
//! the first layer that differs bounds where the replay goes wrong), and
//! captures the shape again over the step itself.

use burn::prelude::*;
use burn::tensor::DType;

use super::StepRunner;
use crate::step::inputs::{PrefillHost, PrefillSeq};

/// One layer's K and V rows, as host floats.
pub type LayerRows = (Vec<f32>, Vec<f32>);

impl StepRunner {
    /// Names of the buffers of `rows`' prefill shape that do not hold the
    /// step over `rows` (empty when all do); `None` where the shape has no
    /// buffers.
    pub fn prefill_buffers_differ(&self, rows: &[PrefillSeq<'_>]) -> Option<Vec<&'static str>> {
        let shape = self.step_shape(rows);
        let buffers = self.prefill_buffers.get(&(shape.tokens, shape.rows))?;
        Some(buffers.differing(&PrefillHost::new(rows, shape, self.tables())))
    }

    /// Each layer's K and V at the slots the step over `rows` writes
    /// (`[H, n, D]` each, flattened).
    pub fn kv_at(&self, rows: &[PrefillSeq<'_>]) -> Vec<LayerRows> {
        let shape = self.step_shape(rows);
        let host = PrefillHost::new(rows, shape, self.tables());
        let n: usize = rows.iter().map(|r| r.tokens.len()).sum();
        let slots = host.write_slots[..n].to_vec();
        let index = Tensor::<1, Int>::from_data(TensorData::new(slots, [n]), &self.device);
        let read = |t: &Tensor<3>| -> Vec<f32> {
            let rows = t.clone().select(1, index.clone()).cast(DType::F32);
            rows.into_data().iter::<f32>().collect()
        };
        let layers = &self.cache.layers;
        layers.iter().map(|l| (read(&l.k), read(&l.v))).collect()
    }

    /// Captures the prefill shape of `rows` again, over the step `rows`
    /// itself (written into the shape's buffers first; the old graph is
    /// dropped before). Whether a hardware graph came of it.
    pub fn recapture_prefill_over(&mut self, rows: &[PrefillSeq<'_>]) -> bool {
        let shape = self.step_shape(rows);
        let key = (shape.tokens, shape.rows);
        let geometry = self.tables();
        // The old graph goes first: it replays against these buffers.
        self.prefill_graphs.remove(&key);
        let Some(buffers) = self.prefill_buffers.get_mut(&key) else {
            return false;
        };
        buffers.write(PrefillHost::new(rows, shape, geometry));
        self.capture_prefill_shape(key, "prefill step recaptured over a real step")
    }
}
