//! Each decode bucket's captured step ([`crate::step::graphs`]) and, where
//! the sampling kernel runs, its choice half
//! ([`crate::step::choice_graph`]), captured at warmup over the bucket's
//! buffers; and the bench's timing of a bucket's replays.

use std::time::Instant;

use super::{keep_capture, StepRunner};
use crate::sampling::SamplingTable;
use crate::step::choice_graph::{ChoiceGraph, ChoiceTargets};
use crate::step::graphs::StepGraph;

impl StepRunner {
    /// Captures the decode step of each of `buckets` (see
    /// [`crate::step::graphs`]). On CUDA a capture that yields no hardware graph is
    /// logged and dropped (those steps run eager); on the CPU the fallback
    /// graph, which re-runs the step, is kept. Returns the hardware graphs.
    pub fn capture_decode_graphs(&mut self, buckets: &[usize]) -> usize {
        let mut hardware = 0;
        for &bucket in buckets {
            let started = Instant::now();
            let inputs = self.prepare_decode(bucket, &[], Some(&SamplingTable::default()));
            let columns = self.decode_buffers[&bucket].sampling.columns();
            let graph = StepGraph::capture(
                &self.model,
                &self.ops,
                &mut self.cache,
                (inputs, columns),
                &self.device,
                true,
            );
            let what = format!("decode step of {bucket} rows");
            hardware += usize::from(graph.is_hardware());
            if keep_capture(&graph, self.shape.bucketed, &what, started) {
                self.capture_choice(bucket, &graph);
                self.graphs.insert(bucket, graph);
            }
        }
        hardware
    }

    /// Captures `bucket`'s choice half over the logits its `forward` graph
    /// writes ([`super::choice_graph`]), where the sampling kernel runs and
    /// that graph is a hardware one.
    fn capture_choice(&mut self, bucket: usize, graph: &StepGraph) {
        let Some(logits) = graph.forward_logits().filter(|_| self.sampling.kernel) else {
            return;
        };
        let buffers = &self.decode_buffers[&bucket];
        let targets = ChoiceTargets {
            logits,
            kept: self.last_chosen.tensor(),
            leading: buffers.last_rows.clone(),
        };
        let columns = buffers.sampling.columns();
        match ChoiceGraph::capture(targets, columns, &self.device) {
            Some(choice) => {
                self.choice_graphs.insert(bucket, choice);
            }
            None => tracing::warn!(bucket, "no CUDA graph for the choice half; it runs eager"),
        }
    }

    /// Milliseconds per replay of `batch`'s captured decode graph, `n`
    /// replays back to back after 3 untimed ones (bench: the GPU time of a
    /// step, without its host work); `None` without a hardware graph.
    pub fn time_graph_replays(&mut self, batch: usize, n: usize) -> Option<f64> {
        let bucket = self.decode_bucket(batch);
        self.graphs.get_mut(&bucket)?.time_replays(n)
    }

    /// Decode buckets with a captured graph.
    pub fn captured_buckets(&self) -> usize {
        self.graphs.len()
    }
}
