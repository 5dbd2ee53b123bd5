//! [`FlagError`]: a startup flag with a value it cannot take. Its own file so
//! every part of `cli` can name it without importing `cli/mod.rs` back.

/// A flag with a value it cannot take; the message names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// `v` if it is positive, else the error naming `--flag`.
pub fn positive(flag: &str, v: usize) -> Result<usize, FlagError> {
    if v == 0 {
        Err(FlagError(format!("--{flag} must be positive, got 0")))
    } else {
        Ok(v)
    }
}
