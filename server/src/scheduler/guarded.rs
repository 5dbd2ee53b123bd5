//! [`guarded`]: every engine call that computes (admission, prefill and
//! decode steps) goes through it, so a panic inside Burn (e.g. a device
//! error) fails one batch instead of the scheduler thread.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ember_engine::EngineError;

/// Runs an engine call, turning a panic into an [`EngineError::Device`].
pub fn guarded<T>(f: impl FnOnce() -> Result<T, EngineError>) -> Result<T, EngineError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(panic) => Err(EngineError::Device(format!(
            "engine panicked: {}",
            ember_engine::panics::panic_message(panic.as_ref())
        ))),
    }
}
