//! The lowest layer: the settings several layers share, as plain data. The
//! command line (`cli`) builds them once, after validation; the layers below
//! it read them and never see a flag. Each layer's own settings live beside
//! the code that reads them (`workload::WorkloadConfig`,
//! `workload::schedule::ArrivalConfig`, `measure::sweep::SweepConfig`,
//! `modes::setup::BenchConfig`); what is here is what more than one layer
//! needs: the API and transport ([`ConnConfig`] and its enums), the arrival
//! kinds and the live view's mode.
//!
//! The enums derive clap's `ValueEnum` (their names are the flags' values)
//! and serde's `Serialize` (the JSON `config`), nothing else.

use std::path::PathBuf;

use clap::ValueEnum;
use serde::Serialize;

/// Which API the servers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Ember's gRPC API (`ember.v1.Inference/Generate`), with the server's
    /// per-request timeline.
    Ember,
    /// The OpenAI-compatible HTTP API (SSE streaming); Ember's extension
    /// fields are read when the server sends them.
    Openai,
}

/// The OpenAI endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/completions` (`prompt`: text or token ids).
    Completions,
    /// `POST /v1/chat/completions` (one user message).
    Chat,
}

/// How requests are spread over several targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// Request i goes to target i % T.
    Rr,
    /// Each request goes to the target with the fewest requests in flight
    /// (ties: round-robin).
    Least,
}

/// The HTTP version of the OpenAI backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
pub enum HttpVersion {
    /// HTTP/1.1: one stream per connection; the pool opens as many
    /// keep-alive connections as there are streams in flight.
    #[value(name = "1")]
    #[serde(rename = "1")]
    Http1,
    /// HTTP/2 (h2c on http://, ALPN on https://): `--channels` connections
    /// per target, streams multiplexed over them.
    #[value(name = "2")]
    #[serde(rename = "2")]
    Http2,
}

/// When request i is submitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubmitSchedule {
    /// Request i fires at t0 + offset(i), however slow earlier submissions are
    /// (open loop; latency from the intended start is coordinated-omission aware).
    Absolute,
    /// Wait until submission i returned the response stream, then sleep the
    /// interval, then submit i+1 (closed loop on the submit call).
    Relative,
}

/// How the offsets between requests are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Every gap is --submit-interval-ms (0 = burst).
    Fixed,
    /// Exponential gaps with mean 1/--request-rate, seeded by --seed
    /// (absolute schedule).
    Poisson,
    /// Gamma gaps with mean 1/--request-rate and shape --burstiness (vLLM's
    /// semantics: 1 = Poisson, < 1 burstier, > 1 steadier), seeded.
    Gamma,
    /// Replay the `timestamp` (ms) of each --dataset entry, scaled by
    /// --trace-time-scale.
    Trace,
}

/// `--progress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, else a periodic line.
    Auto,
    /// Always the bar.
    Bar,
    /// Always the periodic line.
    Line,
    /// Nothing.
    Off,
}

/// `--sweep`'s mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SweepMode {
    /// A concurrency-1 baseline, a saturation run, then --sweep-steps rates
    /// evenly between their throughputs.
    Auto,
}

/// How to reach the servers (the targets themselves are given apart: a
/// spawned server's address is known only once it listens).
#[derive(Debug, Clone)]
pub struct ConnConfig {
    /// The API.
    pub backend: Backend,
    /// The OpenAI endpoint (`Completions` for gRPC).
    pub endpoint: Endpoint,
    /// The OpenAI `model`; `None`: the first of GET /v1/models.
    pub model: Option<String>,
    /// Sent as `authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Trust this CA for https:// targets (else the system's roots).
    pub tls_ca: Option<PathBuf>,
    /// The OpenAI backend's HTTP version.
    pub http: HttpVersion,
    /// HTTP/2 connections per target (gRPC, or HTTP/2).
    pub channels: usize,
    /// How requests spread over the targets.
    pub balance: Balance,
    /// `--extra-inputs`: body fields added to every OpenAI request (last
    /// wins over loadgen's own).
    pub extra_inputs: Vec<(String, serde_json::Value)>,
}

impl ConnConfig {
    /// The transport in words, for the report's `Backend:` line.
    pub fn describe(&self) -> String {
        match self.backend {
            Backend::Ember => "ember (gRPC, HTTP/2)".to_string(),
            Backend::Openai => format!(
                "openai {} ({})",
                match self.endpoint {
                    Endpoint::Completions => "/v1/completions",
                    Endpoint::Chat => "/v1/chat/completions",
                },
                match self.http {
                    HttpVersion::Http1 => "HTTP/1.1",
                    HttpVersion::Http2 => "HTTP/2",
                }
            ),
        }
    }

    /// Whether every request of the OpenAI backend goes over HTTP/1.1 (a
    /// pool with a connection per stream).
    pub fn is_http1(&self) -> bool {
        self.backend == Backend::Openai && self.http == HttpVersion::Http1
    }

    /// The chat endpoint: prompts must be text.
    pub fn text_only(&self) -> bool {
        self.backend == Backend::Openai && self.endpoint == Endpoint::Chat
    }
}
