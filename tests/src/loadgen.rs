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

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

/// One finished loadgen invocation.
pub struct LoadgenRun {
    pub status: ExitStatus,
    /// The `--json` summary.
    pub summary: Value,
    /// The `--requests-out` lines, warmup ones included (see [`Self::measured`]).
    pub requests: Vec<Value>,
    pub stdout: String,
    pub stderr: String,
    /// Where its files are.
    pub dir: PathBuf,
}

impl LoadgenRun {
    /// Request records that are not warmup.
    pub fn measured(&self) -> Vec<Req<'_>> {
        self.requests
            .iter()
            .filter(|r| !r.get("warmup").and_then(Value::as_bool).unwrap_or(false))
            .map(Req)
            .collect()
    }

    /// The first non-warmup run of the summary.
    pub fn run0(&self) -> &Value {
        let runs = self.summary["runs"].as_array().expect("summary has runs[]");
        runs.iter()
            .find(|r| !r.get("warmup").and_then(Value::as_bool).unwrap_or(false))
            .unwrap_or_else(|| panic!("no measured run in summary {}", self.summary))
    }

    /// stdout and stderr, for failure messages.
    pub fn output(&self) -> String {
        format!(
            "--- loadgen stdout ---\n{}\n--- loadgen stderr ---\n{}\n---",
            self.stdout, self.stderr
        )
    }
}

impl Drop for LoadgenRun {
    fn drop(&mut self) {
        crate::cleanup_scratch(&self.dir);
    }
}

/// Runs `loadgen --target TARGET --json .. --requests-out .. ARGS` (inside
/// `netns` if given) with a wall-clock limit of `limit`.
pub fn run(
    target: &str,
    args: &[&str],
    netns: Option<&str>,
    tag: &str,
    limit: Duration,
) -> anyhow::Result<LoadgenRun> {
    let dir = crate::scratch_dir(tag);
    let json = dir.join("summary.json");
    let reqs = dir.join("requests.jsonl");
    let bin = crate::bins::loadgen();
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    cmd.arg("--target")
        .arg(target)
        .arg("--json")
        .arg(&json)
        .arg("--requests-out")
        .arg(&reqs)
        .args(args);
    let out_path = dir.join("stdout");
    let err_path = dir.join("stderr");
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {}", bin.display()))?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "loadgen ran past {limit:?}; stderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let summary = match std::fs::read_to_string(&json) {
        Ok(s) => serde_json::from_str(&s).with_context(|| format!("parse {}", json.display()))?,
        Err(e) => bail!("loadgen wrote no --json ({e}); exit {status}\n{stdout}\n{stderr}"),
    };
    let requests = std::fs::read_to_string(&reqs)
        .with_context(|| format!("loadgen wrote no --requests-out; exit {status}\n{stderr}"))?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("parse request line {l}")))
        .collect::<anyhow::Result<Vec<Value>>>()?;
    Ok(LoadgenRun {
        status,
        summary,
        requests,
        stdout,
        stderr,
        dir,
    })
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
