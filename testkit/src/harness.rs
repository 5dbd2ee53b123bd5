//! Running the `loadgen` binary from a test and reading what it wrote: the
//! one [`LoadgenRun`], used by loadgen's own integration tests and by
//! `ember-tests`.
//!
//! [`run`] adds `--json` and `--requests-out` (files in the run's directory;
//! not for the `calibrate` and `mock` modes), sends stdout and stderr to files
//! there, kills the child if it runs past its limit, and parses the outputs.
//! A missing file reads as `null` / no lines, so a test of a failing
//! invocation can still look at the exit code and stderr; a file that is not
//! valid JSON is an error.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Why the binary could not be run to its end.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// Creating the run's files or starting the process failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// An output file is not what loadgen writes (a loadgen bug).
    #[error("{path}: {reason}")]
    BadOutput {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The process ran past its limit and was killed.
    #[error("loadgen ran past {limit:?}; stderr:\n{stderr}")]
    Timeout {
        /// The limit.
        limit: Duration,
        /// Its stderr so far.
        stderr: String,
    },
}

/// One finished loadgen invocation.
#[derive(Debug)]
pub struct LoadgenRun {
    /// Its exit status.
    pub status: ExitStatus,
    /// The `--json` summary (`null` if it wrote none).
    pub summary: Value,
    /// The `--requests-out` lines, warmups included.
    pub requests: Vec<Value>,
    /// Its stdout (the report).
    pub stdout: String,
    /// Its stderr (logs, live view, errors).
    pub stderr: String,
    /// The directory holding its files; removed on drop unless the thread is
    /// panicking or `EMBER_KEEP_SCRATCH=1`.
    pub dir: PathBuf,
}

impl LoadgenRun {
    /// The exit code (`None` if killed by a signal).
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// Request records that are not warmups.
    pub fn measured(&self) -> Vec<&Value> {
        self.requests
            .iter()
            .filter(|r| !r.get("warmup").and_then(Value::as_bool).unwrap_or(false))
            .collect()
    }

    /// The first measured run of the summary, if any.
    pub fn run0(&self) -> Option<&Value> {
        self.summary["runs"].as_array()?.first()
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
        if std::thread::panicking() || std::env::var("EMBER_KEEP_SCRATCH").as_deref() == Ok("1") {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `wrapper... bin args...` (the wrapper, e.g. `ip netns exec NS`, may
/// be empty) with its files in `dir` (created), for at most `limit`.
pub fn run(
    wrapper: &[String],
    bin: &Path,
    args: &[String],
    dir: PathBuf,
    limit: Duration,
) -> Result<LoadgenRun, HarnessError> {
    let io = |what: String| move |source| HarnessError::Io { what, source };
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    let (json, reqs) = (dir.join("summary.json"), dir.join("requests.jsonl"));
    let mut cmd = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.args(args);
    if !matches!(args.first().map(String::as_str), Some("calibrate" | "mock")) {
        cmd.arg("--json")
            .arg(&json)
            .arg("--requests-out")
            .arg(&reqs);
    }
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let out_file =
        std::fs::File::create(&out_path).map_err(io(format!("create {}", out_path.display())))?;
    let err_file =
        std::fs::File::create(&err_path).map_err(io(format!("create {}", err_path.display())))?;
    cmd.stdin(Stdio::null()).stdout(out_file).stderr(err_file);
    if std::env::var_os("LOADGEN_LOG").is_none() {
        cmd.env("LOADGEN_LOG", "warn");
    }
    let mut child = cmd
        .spawn()
        .map_err(io(format!("spawn {}", bin.display())))?;
    let deadline = Instant::now() + limit;
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(io("wait for loadgen".into()))? {
            break s;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HarnessError::Timeout {
                limit,
                stderr: read(&err_path),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let bad = |path: &Path| {
        let path = path.to_path_buf();
        move |e: serde_json::Error| HarnessError::BadOutput {
            path,
            reason: e.to_string(),
        }
    };
    let requests = read(&reqs)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<Vec<Value>, _>>()
        .map_err(bad(&reqs))?;
    let summary = match std::fs::read_to_string(&json) {
        Ok(text) => serde_json::from_str(&text).map_err(bad(&json))?,
        Err(_) => Value::Null,
    };
    Ok(LoadgenRun {
        status,
        summary,
        requests,
        stdout: read(&out_path),
        stderr: read(&err_path),
        dir,
    })
}
