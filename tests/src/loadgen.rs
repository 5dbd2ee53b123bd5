//! Running `loadgen` and reading what it wrote.
//!
//! `--json PATH` is the summary (`{"runs":[{"requests","ok","failed",
//! "errors":{code:count},"metrics":{..}}]}`); `--requests-out PATH` has one JSON
//! object per request (keys `run, warmup, index, request_id, ok, status,
//! prompt_tokens, completion_tokens, finish_reason, submit_start_ns,
//! first_token_ns, finish_ns, token_recv_ns[], client_ttft_ns, client_tpot_ns,
//! latency_ns, overhead_ns, server{tokenize_ns, enqueue_ns, queue_wait_ns,
//! prefill_to_first_token_ns, server_ttft_ns, decode_ns, total_ns,
//! prefill_batch_size, admitted_iteration, token_server_time_ns[]}`).

use std::time::Duration;

use anyhow::bail;
use serde_json::Value;

/// One finished loadgen invocation: the shared type of `ember_testkit::harness`
/// (the same one loadgen's own tests use).
pub use ember_testkit::harness::LoadgenRun;

/// Runs `loadgen --target TARGET --json .. --requests-out .. ARGS` (inside
/// `netns` if given) with a wall-clock limit of `limit`. Fails if loadgen
/// wrote no `--json` summary.
pub fn run(
    target: &str,
    args: &[&str],
    netns: Option<&str>,
    tag: &str,
    limit: Duration,
) -> anyhow::Result<LoadgenRun> {
    let dir = crate::scratch_dir(tag);
    let wrapper: Vec<String> = match netns {
        Some(ns) => ["ip", "netns", "exec", ns].map(str::to_owned).to_vec(),
        None => Vec::new(),
    };
    let mut argv = vec!["--target".to_string(), target.to_string()];
    argv.extend(args.iter().map(|a| a.to_string()));
    let run = ember_testkit::harness::run(&wrapper, &crate::bins::loadgen(), &argv, dir, limit)?;
    if run.summary.is_null() {
        bail!(
            "loadgen wrote no --json; exit {}\n{}",
            run.status,
            run.output()
        );
    }
    Ok(run)
}

/// The measured (non-warmup) request records of a run, typed.
pub fn measured(run: &LoadgenRun) -> Vec<Req<'_>> {
    run.measured().into_iter().map(Req).collect()
}

/// The first measured run of the summary; panics with the summary if none.
pub fn run0(run: &LoadgenRun) -> &Value {
    run.run0()
        .unwrap_or_else(|| panic!("no measured run in summary {}", run.summary))
}

/// One `--requests-out` record with typed accessors that fail with the record.
#[derive(Clone, Copy)]
pub struct Req<'a>(pub &'a Value);

impl<'a> Req<'a> {
    fn at(&self, path: &str) -> &'a Value {
        let mut v = self.0;
        for k in path.split('.') {
            v = v
                .get(k)
                .unwrap_or_else(|| panic!("request record has no {path}: {}", self.0));
        }
        v
    }

    /// An unsigned integer field; `path` may be dotted (`server.tokenize_ns`).
    pub fn u64(&self, path: &str) -> u64 {
        self.at(path)
            .as_u64()
            .unwrap_or_else(|| panic!("{path} is not an unsigned integer in {}", self.0))
    }

    /// A numeric field as f64.
    pub fn f64(&self, path: &str) -> f64 {
        self.at(path)
            .as_f64()
            .unwrap_or_else(|| panic!("{path} is not a number in {}", self.0))
    }

    /// An array of numbers as f64s.
    pub fn f64s(&self, path: &str) -> Vec<f64> {
        self.at(path)
            .as_array()
            .unwrap_or_else(|| panic!("{path} is not an array in {}", self.0))
            .iter()
            .map(|x| {
                x.as_f64()
                    .unwrap_or_else(|| panic!("{path} has a non-number in {}", self.0))
            })
            .collect()
    }

    /// `ok`.
    pub fn ok(&self) -> bool {
        self.at("ok").as_bool().unwrap_or(false)
    }

    /// `finish_reason`, lower-cased, with any `finish_reason_` prefix removed
    /// ("length", "eos", "cancelled").
    pub fn finish_reason(&self) -> String {
        let v = self.at("finish_reason");
        let s = v
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| v.to_string());
        s.to_lowercase()
            .trim_start_matches("finish_reason_")
            .to_owned()
    }

    /// The raw record, for messages.
    pub fn json(&self) -> &'a Value {
        self.0
    }
}
