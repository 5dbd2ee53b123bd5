//! A decode bucket's choice half as a captured CUDA graph: the second half
//! of a step queued in two (`super::runner::launch`).
//!
//! A step with a grammar row still in flight queues its forward pass (the
//! bucket's `forward` graph, [`super::graphs`]) before the host knows the
//! rows' allowed sets; once it does, the masks and columns are written and
//! the choice is queued. Eager, that choice is several launches through the
//! fusion queue (the sampling kernel, the penalty counts, the copy of the
//! ids into `last_chosen` where the next step reads them), each drained
//! and launched on the host while the GPU waits for it. Captured, it is
//! one graph launch.
//!
//! What the graph reads and writes, all at fixed addresses: the forward
//! graph's logits output (each replay of it overwrites the same buffer),
//! the bucket's sampling columns and masks (input buffers written in place),
//! the penalty counts, and the runner's `last_chosen`. Its output is the
//! ids, read back like a replayed step's.
//!
//! Only CUDA captures one ([`ChoiceGraph::capture`] is `None` elsewhere, or
//! when the capture gave no hardware graph): a closure re-run would write a
//! clone of `last_chosen`, not the runner's.

use burn::prelude::*;
#[cfg(feature = "cuda")]
use burn::tensor::{capture, Graph};

use crate::sampling::SampleColumns;

#[cfg(feature = "cuda")]
type ChoiceClosure = Box<dyn FnMut() -> Tensor<2, Int> + Send>;

/// The choice half of one decode bucket's step (module docs).
pub struct ChoiceGraph {
    #[cfg(feature = "cuda")]
    graph: Graph<Tensor<2, Int>, ChoiceClosure>,
    /// Off CUDA none can exist.
    #[cfg(not(feature = "cuda"))]
    never: std::convert::Infallible,
}

/// What the choice graph reads and writes besides the columns.
pub struct ChoiceTargets {
    /// `[bucket, vocab]` the bucket's forward graph's logits output.
    pub logits: Tensor<2>,
    /// `[max_batch, 1]` where the next step's rows find this step's tokens.
    pub kept: Tensor<2, Int>,
    /// `[bucket]` `0..bucket`: the rows of `kept` written.
    pub leading: Tensor<1, Int>,
}

impl ChoiceGraph {
    /// Captures the sampling kernel over `targets.logits` with `columns`
    /// (the bucket's, holding greedy padding rows: the capture's runs change
    /// no penalty counts), the ids kept in `targets.kept`. `None` off CUDA
    /// or without a hardware graph.
    pub fn capture(
        targets: ChoiceTargets,
        columns: SampleColumns,
        device: &Device,
    ) -> Option<Self> {
        #[cfg(feature = "cuda")]
        {
            if !crate::ops::cuda::is_cube_device(device) {
                return None;
            }
            let ChoiceTargets {
                logits,
                kept,
                leading,
            } = targets;
            let closure: ChoiceClosure = Box::new(move || {
                let ids = crate::sampling::choose_in_graph(logits.clone(), &columns);
                crate::ops::cuda::inplace::write_int_rows_from(&kept, leading.clone(), ids.clone());
                ids
            });
            let graph = capture(device, closure);
            graph.is_hardware().then_some(Self { graph })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (targets, columns, device);
            None
        }
    }

    /// Queues the choice (the columns and masks already written, the
    /// forward graph's replay already queued) and returns the ids `[bucket,
    /// 1]`, to be read behind it on the same stream.
    pub fn replay(&mut self) -> Tensor<2, Int> {
        #[cfg(feature = "cuda")]
        {
            // Safety: everything the graph touches outlives it: the logits
            // belong to the forward graph, the columns, masks and counts to the
            // bucket's buffers and the runner, `kept` to the runner, which
            // drops its graphs first; all work runs on the engine thread's one
            // stream, so the writes before the replay and the read after it
            // are ordered with it.
            unsafe { self.graph.replay() }.clone()
        }
        #[cfg(not(feature = "cuda"))]
        match self.never {}
    }
}
