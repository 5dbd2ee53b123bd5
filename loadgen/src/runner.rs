//! One run: fire the requests on their schedule, run each as its own task, and
//! collect the records.
//!
//! The firing loop runs on a dedicated thread with its own current-thread
//! runtime, so the tasks reading hundreds of streams on the main runtime never
//! delay a firing, and the spin before each target takes no one's turn. The
//! requests themselves are spawned onto the main runtime: with the absolute
//! schedule a slow submission never delays the next target; with the relative
//! schedule the loop waits for the submission to return, then sleeps the
//! interval. A `--max-concurrency` permit is taken after the target is reached,
//! so waiting for one shows up as submit lag.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::runtime::Handle;
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

use crate::error::Error;
use crate::pool::Pool;
use crate::record::RequestRecord;
use crate::request::{execute, Slot};
use crate::schedule::{fire_at, Plan};
use crate::workload::PreparedRequest;

/// t0 is this far after the firing loop starts, so request 0 is fired on the
/// same precise path as every other request.
const START_LEAD: Duration = Duration::from_millis(5);

/// What one run does.
#[derive(Debug)]
pub struct RunSpec {
    /// Run number.
    pub run: usize,
    /// Warmup (unmeasured) or measured.
    pub warmup: bool,
    /// When each request fires.
    pub plan: Plan,
    /// The requests, in firing order.
    pub requests: Vec<PreparedRequest>,
    /// `--max-concurrency`.
    pub max_concurrency: Option<usize>,
    /// `--timeout` per request.
    pub timeout: Duration,
}

/// Peak concurrent streams on one connection during a run.
#[derive(Debug, Clone, Serialize)]
pub struct ConnPeak {
    /// Target URL.
    pub target: String,
    /// Connection number on that target.
    pub channel: usize,
    /// Most streams open at once.
    pub max_streams: usize,
}

/// The outcome of one run.
#[derive(Debug)]
pub struct RunResult {
    /// Run number.
    pub run: usize,
    /// Warmup or measured.
    pub warmup: bool,
    /// One record per request, in firing order.
    pub records: Vec<RequestRecord>,
    /// Peak in-flight streams of each connection.
    pub conn_peaks: Vec<ConnPeak>,
}

/// Runs one run to its end (every request finished or failed).
pub async fn run_once(pool: Arc<Pool>, spec: RunSpec) -> Result<RunResult, Error> {
    let (run, warmup) = (spec.run, spec.warmup);
    pool.reset_peaks();
    let handle = Handle::current();
    let (tx, rx) = oneshot::channel();
    let fire_pool = pool.clone();
    std::thread::Builder::new()
        .name("loadgen-fire".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map(|rt| rt.block_on(fire(handle, fire_pool, spec)));
            // The receiver only goes away if the benchmark was dropped.
            let _ = tx.send(result);
        })
        .map_err(|e| Error::Internal(format!("cannot start the firing thread: {e}")))?;
    let tasks = rx
        .await
        .map_err(|_| Error::Internal("the firing thread ended without a result".into()))?
        .map_err(|e| Error::Internal(format!("cannot build the firing runtime: {e}")))?;

    let mut records = Vec::with_capacity(tasks.len());
    for task in tasks {
        let record = task
            .await
            .map_err(|e| Error::Internal(format!("a request task failed: {e}")))?;
        records.push(record);
    }
    let conn_peaks = pool
        .conns()
        .iter()
        .map(|c| ConnPeak {
            target: c.target.clone(),
            channel: c.channel,
            max_streams: c.peak(),
        })
        .collect();
    Ok(RunResult {
        run,
        warmup,
        records,
        conn_peaks,
    })
}

/// The firing loop (on the dedicated thread): waits for each request's target,
/// takes a concurrency permit, spawns the request on the main runtime.
async fn fire(handle: Handle, pool: Arc<Pool>, spec: RunSpec) -> Vec<JoinHandle<RequestRecord>> {
    let semaphore = spec.max_concurrency.map(|n| Arc::new(Semaphore::new(n)));
    let t0 = Instant::now() + START_LEAD;
    let mut next_relative = t0;
    let mut tasks = Vec::with_capacity(spec.requests.len());
    for (index, prepared) in spec.requests.into_iter().enumerate() {
        let intended = match &spec.plan {
            Plan::Absolute(offsets) => t0 + offsets.get(index).copied().unwrap_or_default(),
            Plan::Relative { .. } => next_relative,
        };
        fire_at(intended).await;
        // acquire_owned fails only on a closed semaphore; this one never closes.
        let permit = match &semaphore {
            Some(s) => s.clone().acquire_owned().await.ok(),
            None => None,
        };
        let slot = Slot {
            run: spec.run,
            warmup: spec.warmup,
            index,
            t0,
            intended,
        };
        let conn = pool.pick(index);
        let (submitted_tx, submitted_rx) = match spec.plan {
            Plan::Relative { .. } => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            Plan::Absolute(_) => (None, None),
        };
        let timeout = spec.timeout;
        tasks.push(handle.spawn(async move {
            let record = execute(conn, prepared, slot, timeout, submitted_tx).await;
            drop(permit);
            record
        }));
        if let (Plan::Relative { interval }, Some(rx)) = (&spec.plan, submitted_rx) {
            // The sender is dropped without sending only if the task died.
            let submit_end = rx.await.unwrap_or_else(|_| Instant::now());
            next_relative = submit_end + *interval;
        }
    }
    tasks
}
