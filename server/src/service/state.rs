//! What every handler of both front doors shares: the loaded model (once it
//! is), the draining flag, the knobs, the tokenizer, the server seed and the
//! in-flight count.

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use ember_common::tokenizer::Gpt2Tokenizer;

use super::in_flight::InFlightTracker;
use crate::scheduler::{ModelInfo, SchedulerKnobs};

/// State shared by every handler of both doors.
#[derive(Debug)]
pub struct ServiceState {
    /// Set once when the scheduler reports the model loaded and warmed up.
    pub model: OnceLock<ModelInfo>,
    /// Set on SIGTERM/SIGINT: new requests get UNAVAILABLE (HTTP 503).
    pub draining: AtomicBool,
    pub knobs: SchedulerKnobs,
    /// Tokens per KV block (`--block-size`), reported by `GetServerInfo`.
    pub block_size: usize,
    /// Whether the prefix cache is on, reported by `GetServerInfo`.
    pub prefix_caching: bool,
    pub tokenizer: Gpt2Tokenizer,
    /// Seed mixed into the seed of requests that set none.
    pub seed: u64,
    /// Accepted requests whose stream has not ended (the drain waits on it).
    pub in_flight: InFlightTracker,
}

impl ServiceState {
    /// The model's context (`max_model_len`), once it is loaded.
    pub fn max_model_len(&self) -> Option<usize> {
        self.model.get().map(|m| m.config.n_positions)
    }
}
