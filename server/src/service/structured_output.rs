//! A request's `response_format` made into the engine's constraint for one
//! of its sequences (every choice gets its own; the grammar is compiled once
//! per schema where the compiler allows).

use ember_engine::SharedConstraint;

use super::error::ServiceError;
use super::options::GenerationOptions;
use super::state::ServiceState;

/// The constraint of one sequence of a request with `options`, or `None`
/// for free text.
pub fn constraint(
    options: &GenerationOptions,
    state: &ServiceState,
) -> Result<Option<SharedConstraint>, ServiceError> {
    let _ = state;
    match &options.response_format {
        None => Ok(None),
        Some(_) => Err(ServiceError::invalid(
            "response_format",
            "structured output is not available in this build",
        )),
    }
}
