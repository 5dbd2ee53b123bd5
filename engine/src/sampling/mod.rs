//! Choosing each row's next token on the device, and the logprobs of the
//! choices.
//!
//! - [`sampler`]: per-row sampling (greedy fast path; temperature, top-k,
//!   top-p, min-p, each draw keyed by the request's seed and the position),
//!   ending in one device->host read of the chosen ids;
//!   [`SamplingParamsRows`] holds the per-row parameters as device buffers a
//!   decode bucket rewrites when they change.
//! - [`table`]: a step's sampling as columns ([`SamplingTable`]), and the one
//!   place that decides which rows may take the argmax a decode graph
//!   computed; [`plan`]: how the whole step then chooses its tokens
//!   ([`StepPlan`]), decided once when its table is written.
//! - [`transforms`]: logit bias, penalties, banned tokens and allowed sets,
//!   on the device, for the rows that ask; [`penalty_state`]: the penalties
//!   of decoding sequences as per-slot device state the sampling kernel
//!   reads (no host work per token); [`mask_rows`]: allowed-token masks
//!   (structured output, `min_tokens`) the kernel applies in the graph.
//! - [`philox`]: the sampling noise, a pure function of (seed, position,
//!   token); [`row_sampler`]: one row's token on the CPU (temperature,
//!   top-k, top-p, min-p as an intersection), the spec of the device
//!   kernel `ops::cuda::kernels::sample_rows`.
//! - [`logprobs`]: log-probabilities of the sampled tokens and their top-n
//!   alternatives, from the same logits, only for steps where some row asked.

pub mod device_sampler;
pub mod logprobs;
pub mod mask_rows;
pub mod penalty_state;
pub mod philox;
pub mod plan;
pub mod row_sampler;
pub mod sampler;
pub mod table;
pub mod transforms;

#[cfg(test)]
mod filter_tests;
#[cfg(test)]
mod rejection_tests;
#[cfg(test)]
mod row_sampler_tests;
#[cfg(test)]
mod test_logits;

pub use device_sampler::DeviceSampling;
pub use logprobs::{logprobs, logprobs_from};
pub use penalty_state::{PenaltyState, SlotContents};
pub use plan::{Route, StepOptions, StepPlan};
pub use sampler::{
    choose_in_graph, choose_on_device, choose_step, read_chosen, sample, Chosen, SampleColumns,
    SamplingParamsRows,
};
pub use table::{RowSampling, SamplingTable, TokenEdit};
