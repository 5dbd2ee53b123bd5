//! The machine-readable outputs: the `--json` summary and the
//! `--requests-out` JSON lines (one per request, warmups included). Other
//! tools and the end-to-end tests parse them, so their keys are a contract
//! (docs/loadgen.md lists them).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::cli::Args;
use crate::error::Error;
use crate::record::RequestRecord;
use crate::stats::{RunStats, Summary};
use crate::sweep::SweepResult;

/// The `--json` document.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// `ServerInfo.model`.
    pub model: &'a str,
    /// `ServerInfo.device`.
    pub device: &'a str,
    /// The target URLs used (the spawned server's address with --spawn-server).
    pub targets: &'a [String],
    /// Every flag as given or defaulted.
    pub config: &'a Args,
    /// Warmup runs (not in the summary).
    pub warmups: &'a [RunStats],
    /// Measured runs.
    pub runs: &'a [RunStats],
    /// Across measured runs (across rates in a sweep).
    pub summary: &'a Summary,
    /// The sweep's rows and SLO search (absent without a sweep).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<&'a SweepResult>,
}

/// Writes the `--json` document.
pub fn write_json(path: &Path, report: &JsonReport<'_>) -> Result<(), Error> {
    let file = File::create(path).map_err(|source| file_error(path, source))?;
    let mut w = BufWriter::new(file);
    serde_json::to_writer_pretty(&mut w, report)?;
    writeln!(w).map_err(|source| file_error(path, source))?;
    w.flush().map_err(|source| file_error(path, source))
}

/// The `--requests-out` file, written after each run.
#[derive(Debug)]
pub struct RequestsOut {
    /// For error messages.
    path: PathBuf,
    /// The open file.
    out: BufWriter<File>,
}

impl RequestsOut {
    /// Creates (truncates) the file up front, so a bad path fails before any
    /// request is sent.
    pub fn create(path: &Path) -> Result<RequestsOut, Error> {
        let file = File::create(path).map_err(|source| file_error(path, source))?;
        Ok(RequestsOut {
            path: path.to_path_buf(),
            out: BufWriter::new(file),
        })
    }

    /// Appends one JSON line per record and flushes.
    pub fn write(&mut self, records: &[RequestRecord]) -> Result<(), Error> {
        for r in records {
            serde_json::to_writer(&mut self.out, r)?;
            writeln!(self.out).map_err(|source| file_error(&self.path, source))?;
        }
        self.out
            .flush()
            .map_err(|source| file_error(&self.path, source))
    }
}

fn file_error(path: &Path, source: std::io::Error) -> Error {
    Error::File {
        path: path.to_path_buf(),
        source,
    }
}
