//! The machine-readable outputs: the `--json` summary and the
//! `--requests-out` JSON lines (one per request, warmups included). Other
//! tools and the end-to-end tests parse them, so their keys are a contract
//! (docs/loadgen.md lists them).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Error;
use crate::measure::stats::{RunStats, Summary};
use crate::measure::sweep::SweepResult;
use crate::record::RequestRecord;
use crate::report::model::Series;

/// One series in the `--json` document (a plain benchmark's document is one
/// of these, flattened, plus `config`).
#[derive(Debug, Serialize)]
pub struct SeriesJson<'a> {
    /// The series' name (compare only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    /// Model(s): gRPC `ServerInfo.model`, or the OpenAI `model` sent.
    pub model: &'a str,
    /// Device(s): gRPC `ServerInfo.device`.
    pub device: &'a str,
    /// The API and transport in words.
    pub backend: &'a str,
    /// What each request asks for, in words.
    pub request_shape: &'a str,
    /// The unique prompts' nonce of this invocation.
    pub nonce: &'a str,
    /// The target URLs used (the spawned server's address with --spawn-server).
    pub targets: &'a [String],
    /// Warmup runs (not in the summary).
    pub warmups: &'a [RunStats],
    /// Measured runs.
    pub runs: Vec<&'a RunStats>,
    /// Across measured runs (across rates in a sweep).
    pub summary: &'a Summary,
    /// The sweep's rows and SLO search (absent without a sweep).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<&'a SweepResult>,
}

impl<'a> SeriesJson<'a> {
    /// The JSON view of a series; `named` keeps its name (compare).
    pub fn of(s: &'a Series, named: bool) -> SeriesJson<'a> {
        SeriesJson {
            name: named.then_some(s.name.as_str()),
            model: &s.header.model,
            device: &s.header.device,
            backend: &s.header.backend,
            request_shape: &s.header.request_shape,
            nonce: &s.header.nonce,
            targets: &s.urls,
            warmups: &s.warmups,
            runs: s.measured.iter().map(|m| &m.stats).collect(),
            summary: &s.summary,
            sweep: s.sweep.as_ref(),
        }
    }
}

/// The `--json` document of a plain benchmark: the series' fields at the
/// top level, then every flag.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a, C: Serialize> {
    /// The one series.
    #[serde(flatten)]
    pub series: SeriesJson<'a>,
    /// Every flag as given or defaulted (the API key redacted).
    pub config: &'a C,
}

/// The `--json` document of `loadgen compare`.
#[derive(Debug, Serialize)]
pub struct CompareJson<'a, C: Serialize> {
    /// Each series, in the order run.
    pub series: Vec<SeriesJson<'a>>,
    /// Every flag as given or defaulted, the series specs included.
    pub config: &'a C,
}

/// Writes a `--json` document.
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<(), Error> {
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
