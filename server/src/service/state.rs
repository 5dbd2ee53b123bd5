//! What every handler of both front doors shares: the loaded model (once it
//! is), the draining flag, the knobs, the tokenizer and the server seed.

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use ember_common::tokenizer::Gpt2Tokenizer;

use crate::cli::SchedulerKnobs;
use crate::scheduler::ModelInfo;

/// State shared by every handler of both doors.
#[derive(Debug)]
pub struct ServiceState {
    /// Set once when the scheduler reports the model loaded and warmed up.
    pub model: OnceLock<ModelInfo>,
    /// Set on SIGTERM/SIGINT: new requests get UNAVAILABLE (HTTP 503).
    pub draining: AtomicBool,
    pub knobs: SchedulerKnobs,
    pub tokenizer: Gpt2Tokenizer,
    /// Seed mixed into the seed of requests that set none.
    pub seed: u64,
}
