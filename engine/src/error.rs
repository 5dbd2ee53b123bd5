//! [`EngineError`]: why the engine refused a step or could not be built.

use crate::model::ModelError;
use crate::types::SeqId;

/// Why the engine refused a step. A refused step leaves the engine unchanged.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Not enough free KV blocks to admit the batch (keep it waiting).
    #[error("out of KV blocks: needed {needed}, free {free}")]
    OutOfBlocks { needed: usize, free: usize },
    /// A decode/release named a sequence the engine does not hold.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),
    /// A prefill reused the id of an active sequence (or repeated one).
    #[error("duplicate sequence {0}")]
    DuplicateSequence(SeqId),
    /// The request can never run (empty prompt, too long, bad token id, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The engine configuration is unusable.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// The model could not be loaded.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Reading the sampled ids back from the device failed.
    #[error("device read failed: {0}")]
    Device(String),
}
