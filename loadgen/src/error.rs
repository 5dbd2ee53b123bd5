//! The library's error type. The binary wraps it in `anyhow` at its edge.
//!
//! Failed *requests* are not errors of this type: they are data (a
//! [`RequestRecord`](crate::record::RequestRecord) with `ok: false`) and end up
//! in the report. These errors stop the benchmark itself.

use std::path::PathBuf;

/// Why a benchmark could not be run to the end.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag has a value the benchmark cannot run with. `flag` is spelled as on
    /// the command line, so the user knows what to fix.
    #[error("invalid {flag}: {reason}")]
    InvalidArgument { flag: &'static str, reason: String },

    /// A `--target` / `--base-url` is not a valid address.
    #[error("invalid {flag} {target:?}: {reason}")]
    BadTarget {
        flag: &'static str,
        target: String,
        reason: String,
    },

    /// The connection to a target could not be opened (or, for the OpenAI
    /// backend, the served model could not be found out).
    #[error("cannot connect to {target}: {reason}")]
    Connect { target: String, reason: String },

    /// `--tls-ca` could not be read or holds no certificate.
    #[error("--tls-ca {}: {reason}", path.display())]
    Tls { path: PathBuf, reason: String },

    /// `--pretok` (or the chat endpoint's token-id prompts) could not load or
    /// run the GPT-2 tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] ember_common::tokenizer::TokenizerError),

    /// A `--dataset` file is malformed: which file, where (`line N` or
    /// `entry N`), which field.
    #[error("{}: {at}: {}{reason}", path.display(), field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
    Dataset {
        path: PathBuf,
        at: String,
        field: Option<String>,
        reason: String,
    },

    /// Starting, reaching or stopping the `--spawn-server` child failed.
    #[error("--spawn-server: {0}")]
    Spawn(String),

    /// Reading or writing a file (`--json`, `--requests-out`, `--server-log`).
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },

    /// Writing the report to stdout failed.
    #[error("writing the report: {0}")]
    Report(#[from] std::io::Error),

    /// Encoding the JSON outputs failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),

    /// A runtime-level failure: a thread could not be started or a request task
    /// panicked. Never expected; reported rather than unwrapped.
    #[error("internal: {0}")]
    Internal(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(flag: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            flag,
            reason: reason.into(),
        }
    }
}
